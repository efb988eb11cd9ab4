/**
 * Issue 8: a popular client nobody here wrote, `@ai-sdk/mcp`, lists and calls taskrelay's tools without logging an
 * error: no `Failed to parse message` for the SSE priming events (they are named `event: priming`), no failed GET.
 */
import { describe, expect, it } from 'vitest';
import { createMCPClient } from '@ai-sdk/mcp';
import { useStack } from './helpers/stack.js';
import { RawSession } from './helpers/raw-mcp.js';

const stack = useStack({ name: 'ai-sdk' });

describe('§14 @ai-sdk/mcp against taskrelay', () => {
  it('lists the tools and calls one, with no error reported', async () => {
    const errors: string[] = [];
    const client = await createMCPClient({
      transport: { type: 'http', url: stack.gateway.url },
      onUncaughtError: (error: unknown) => errors.push(error instanceof Error ? error.message : String(error)),
    });
    try {
      const tools = await client.tools();
      expect(Object.keys(tools)).toEqual(expect.arrayContaining(['build_report', 'fail_after']));
      const result = await tools['build_report']!.execute(
        { report: 'ai', items: 2, delayMs: 1 },
        { toolCallId: 'call-1', messages: [] },
      );
      expect(result).toMatchObject({ structuredContent: { report: 'ai', items: 2 } });
    } finally {
      await client.close();
    }
    expect(errors).toEqual([]);
  });

  it('names the priming event of each response stream, so it is no message', async () => {
    const session = await RawSession.open(stack.gateway.url);
    // A call still running after the transport's 100 ms, so its answer streams (one answered sooner comes as JSON,
    // with no priming event).
    const res = await session.post({
      jsonrpc: '2.0',
      id: 5,
      method: 'tools/call',
      params: { name: 'build_report', arguments: { report: 'r', items: 1, delayMs: 300 } },
    });
    expect(res.headers.get('content-type')).toBe('text/event-stream');
    const text = await res.text();
    expect(text).toMatch(/^id: [^\n]+\nevent: priming\ndata: \n\n/);
    await session.close();
  });
});
