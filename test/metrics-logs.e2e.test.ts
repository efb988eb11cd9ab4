/**
 * Issue 13: one task can be followed across the gateway's and the worker's JSON logs by its id: both sides carry the
 * same correlation fields (taskId, jobId, tool, principal, sessionId, requestId; the worker adds attempt and
 * workerId), and no line carries a bearer token.
 */
import { Writable } from 'node:stream';
import { describe, expect, it } from 'vitest';
import { CallToolResultSchema } from '@modelcontextprotocol/sdk/types.js';
import { createLogger } from '@taskrelay/shared';
import { useStack } from './helpers/stack.js';
import { waitFor } from './helpers/wait-for.js';
import { connectClient } from './helpers/processes.js';

const TOKEN = 'tok-3f9a1c';
const stack = useStack({
  name: 'logs',
  gateways: [{ TASKRELAY_AUTH_TOKENS: `carol:${TOKEN}`, LOG_LEVEL: 'debug' }],
  workers: [{ LOG_LEVEL: 'debug' }],
});

describe('correlated logs', () => {
  it('carry the same task, job, tool, principal, session and request on the gateway and the worker', async () => {
    const client = await connectClient(stack.gateway.url, { Authorization: `Bearer ${TOKEN}` });
    const result = await client.callTool(
      { name: 'build_report', arguments: { report: 'logs', items: 2, delayMs: 1 } },
      CallToolResultSchema,
    );
    expect(result.isError).toBeFalsy();
    await client.close();

    const created = stack.gateway.logs().find((l) => l['msg'] === 'task created');
    expect(created).toBeDefined();
    const taskId = created!['taskId'] as string;
    expect(created).toMatchObject({ jobId: taskId, tool: 'build_report', principal: 'carol' });
    expect(typeof created!['sessionId']).toBe('string');
    expect(created!['requestId']).toBeDefined();

    const lines = await waitFor(
      () => {
        const mine = stack.workers[0]!.logs().filter((l) => l['taskId'] === taskId);
        return mine.some((l) => l['msg'] === 'task completed') ? mine : undefined;
      },
      { timeoutMs: 10_000, message: 'the worker never logged the task as completed' },
    );
    for (const line of lines) {
      expect(line).toMatchObject({
        taskId,
        jobId: taskId,
        tool: 'build_report',
        principal: 'carol',
        sessionId: created!['sessionId'],
        requestId: String(created!['requestId']),
        attempt: 1,
      });
      expect(typeof line['workerId']).toBe('string');
    }
    for (const proc of [stack.gateway, stack.workers[0]!]) expect(proc.output()).not.toContain(TOKEN);
  });

  it('redact bearer tokens and credentials wherever they are logged', () => {
    let out = '';
    const sink = new Writable({
      write(chunk: Buffer, _enc, done) {
        out += chunk.toString();
        done();
      },
    });
    const log = createLogger('test', { destination: sink });
    log.info({ headers: { authorization: `Bearer ${TOKEN}` }, config: { authTokens: TOKEN }, token: TOKEN }, 'x');
    expect(out).not.toContain(TOKEN);
    expect(JSON.parse(out)).toMatchObject({
      headers: { authorization: '[redacted]' },
      config: { authTokens: '[redacted]' },
      token: '[redacted]',
    });
  });
});
