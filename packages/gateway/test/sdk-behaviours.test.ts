/**
 * The MCP SDK 1.32.2 behaviours the gateway works around, one test each, named for the behaviour. Each pins what the
 * SDK does today and shows the gateway's way round it still holds, so an SDK upgrade that changes a behaviour turns
 * its test red, pointing at the workaround to revisit:
 * - SDK clients ignore `notifications/cancelled` for request id 0, and the SDK server numbers requests from 0
 *   (`transports/session/client-channel.ts` starts a session's at 1);
 * - the SDK `Server`'s `tools/call` wrapper re-validates every result as a `CallToolResult`, writing `content: []`
 *   into the tasks extension's flat `CreateTaskResult` (`transports/session/mcp-session.ts` registers on `Protocol`);
 * - the SDK has no schema for the extension's `tasks/update` (`mcp-session.ts` declares its own);
 * - the SDK's `requireBearerAuth` refuses auth without an expiry (`http/auth/token-verifier.ts` gives static tokens
 *   one);
 * - the SDK aborts every running handler's signal when its transport closes (`protocol/inflight-calls.ts` tells that
 *   from a client's cancel).
 */
import { describe, expect, it } from 'vitest';
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { InMemoryTransport } from '@modelcontextprotocol/sdk/inMemory.js';
import { Server } from '@modelcontextprotocol/sdk/server/index.js';
import { requireBearerAuth } from '@modelcontextprotocol/sdk/server/auth/middleware/bearerAuth.js';
import { Protocol } from '@modelcontextprotocol/sdk/shared/protocol.js';
import * as types from '@modelcontextprotocol/sdk/types.js';
import { CallToolRequestSchema, ElicitRequestSchema, ElicitResultSchema } from '@modelcontextprotocol/sdk/types.js';
import { z } from 'zod';

async function linked(clientCapabilities: types.ClientCapabilities = {}) {
  const server = new Server({ name: 'pin', version: '0' }, { capabilities: { tools: {} } });
  const client = new Client({ name: 'pin', version: '0' }, { capabilities: clientCapabilities });
  const [clientSide, serverSide] = InMemoryTransport.createLinkedPair();
  return { server, client, connect: () => Promise.all([server.connect(serverSide), client.connect(clientSide)]) };
}

const tick = () => new Promise((resolve) => setTimeout(resolve, 20));

describe('MCP SDK 1.32.2 behaviours the gateway relies on or works around', () => {
  it('SDK clients ignore notifications/cancelled for request id 0, and the SDK server numbers requests from 0', async () => {
    const { server, client, connect } = await linked({ elicitation: { form: {} } });
    // The private counter client-channel.ts moves to 1: it exists, and starts at 0.
    expect((server as unknown as { _requestMessageId?: unknown })._requestMessageId).toBe(0);
    const signals: AbortSignal[] = [];
    client.setRequestHandler(ElicitRequestSchema, (_request, extra) => {
      signals.push(extra.signal);
      return new Promise((resolve) =>
        extra.signal.addEventListener('abort', () => resolve({ action: 'cancel' }), { once: true }),
      );
    });
    await connect();
    const ask = () =>
      server
        .request(
          {
            method: 'elicitation/create',
            params: { message: 'q', requestedSchema: { type: 'object', properties: {} } },
          },
          ElicitResultSchema,
          { timeout: 2_000 },
        )
        .catch(() => undefined);
    void ask(); // request id 0
    void ask(); // request id 1
    await tick();
    expect(signals).toHaveLength(2);
    await server.notification({ method: 'notifications/cancelled', params: { requestId: 0, reason: 'withdrawn' } });
    await server.notification({ method: 'notifications/cancelled', params: { requestId: 1, reason: 'withdrawn' } });
    await tick();
    expect(signals[0]!.aborted).toBe(false); // id 0: ignored, the reason the gateway never uses it
    expect(signals[1]!.aborted).toBe(true);
    await client.close();
    await server.close();
  });

  it("the SDK Server's tools/call wrapper writes content: [] into a flat CreateTaskResult; Protocol's does not", async () => {
    const flat = {
      resultType: 'task',
      taskId: 't1',
      status: 'working',
      createdAt: '2026-01-01T00:00:00Z',
      lastUpdatedAt: '2026-01-01T00:00:00Z',
      ttl: null,
    };
    const results: Record<string, unknown> = {};
    for (const how of ['wrapped', 'protocol'] as const) {
      const { server, client, connect } = await linked();
      const register =
        how === 'wrapped'
          ? server.setRequestHandler.bind(server)
          : (Protocol.prototype.setRequestHandler.bind(server) as Server['setRequestHandler']);
      register(CallToolRequestSchema, () => flat as unknown as types.CallToolResult);
      await connect();
      results[how] = await client.request(
        { method: 'tools/call', params: { name: 'x', arguments: {} } },
        z.object({}).passthrough(),
      );
      await client.close();
      await server.close();
    }
    expect(results['wrapped']).toEqual({ ...flat, content: [] });
    expect(results['protocol']).toEqual(flat);
  });

  it('the SDK has no schema for the tasks extension’s tasks/update', () => {
    const names = Object.keys(types).filter((name) => /update.*task|task.*update/i.test(name));
    expect(names.filter((name) => !/status|notification/i.test(name))).toEqual([]);
  });

  it("the SDK's requireBearerAuth refuses auth info without an expiry", async () => {
    const answer = async (expiresAt: number | undefined) => {
      const middleware = requireBearerAuth({
        verifier: {
          verifyAccessToken: () =>
            Promise.resolve({
              token: 't',
              clientId: 'c',
              scopes: [],
              ...(expiresAt === undefined ? {} : { expiresAt }),
            }),
        },
      });
      let status = 0;
      let nextCalled = false;
      const res = {
        set: () => res,
        status: (code: number) => ((status = code), res),
        json: () => res,
      };
      await middleware(
        { headers: { authorization: 'Bearer t' } } as never,
        res as never,
        () => void (nextCalled = true),
      );
      return nextCalled ? 'next' : status;
    };
    expect(await answer(undefined)).toBe(401);
    expect(await answer(Math.floor(Date.now() / 1000) + 3600)).toBe('next');
  });

  it("the SDK server aborts every running handler's signal when its transport closes", async () => {
    const { server, client, connect } = await linked();
    let signal: AbortSignal | undefined;
    server.setRequestHandler(CallToolRequestSchema, (_request, extra) => {
      signal = extra.signal;
      return new Promise(() => undefined);
    });
    await connect();
    void client
      .request({ method: 'tools/call', params: { name: 'x', arguments: {} } }, z.object({}))
      .catch(() => undefined);
    await tick();
    expect(signal?.aborted).toBe(false);
    await server.close();
    expect(signal?.aborted).toBe(true);
    await client.close();
  });
});
