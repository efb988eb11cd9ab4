/**
 * PROTOCOL.md §24, scale to zero and back, across processes: every worker of a pool stops, its tools stay listed and a
 * call for them is accepted and queued; a worker starts and the queued calls (a task and a plain call) get their
 * results. Past the catalog retention, or once an operator retires the pool, the tool is gone: `tools/list` drops it
 * and a call gets `Unknown tool` (-32602).
 */
import { spawnSync } from 'node:child_process';
import { resolve } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import type { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { CallToolResultSchema, CreateTaskResultSchema } from '@modelcontextprotocol/sdk/types.js';
import { ROOT, type GatewayProcess } from './helpers/processes.js';
import { startStack, type TestStack } from './helpers/stack.js';
import { waitFor } from './helpers/wait-for.js';

const stacks: TestStack[] = [];

afterAll(async () => {
  await Promise.all(stacks.map((s) => s.stop()));
});

/** A gateway and no worker yet, on a prefix of its own: each test starts and stops the workers it needs. */
async function stack(env: Record<string, string> = {}) {
  const started = await startStack({
    name: 'zero',
    env: { WORKER_HEARTBEAT_MS: '200' },
    gateways: [env],
    workers: [],
    mcp: true,
  });
  stacks.push(started);
  const startWorker = (extra: Record<string, string> = {}) => started.addWorker(extra);
  return { common: started.env, gateway: started.gateway, client: started.mcp, startWorker };
}

const listed = async (client: Client) => (await client.listTools()).tools.map((t) => t.name);

/** Stops a worker with SIGTERM (a clean exit deletes its heartbeat: the pool then has no live worker at all). */
async function stopWorker(worker: { kill: (s?: NodeJS.Signals) => Promise<number | null> }) {
  expect(await worker.kill('SIGTERM')).toBe(0);
}

function pools(gateway: GatewayProcess, env: Record<string, string | undefined>, ...args: string[]) {
  return spawnSync(process.execPath, [resolve(ROOT, 'packages/gateway/dist/pools-main.js'), ...args], {
    encoding: 'utf8',
    env: { ...process.env, ...env },
  });
}

describe('§24 a pool scales to zero and back', () => {
  it('accepts and queues calls while no worker runs, and answers them once one starts', async () => {
    const { client, startWorker } = await stack();
    const worker = await startWorker();
    await waitFor(async () => (await listed(client)).includes('build_report'), { timeoutMs: 10_000 });
    await stopWorker(worker);

    // Every worker has gone: the tool is still listed and its calls are accepted.
    expect(await listed(client)).toContain('build_report');
    const created = await client.request(
      {
        method: 'tools/call',
        params: { name: 'build_report', arguments: { report: 'queued', items: 2, delayMs: 0 }, task: { ttl: 60_000 } },
      },
      CreateTaskResultSchema,
    );
    // The catalog is re-read within a second (catalogCacheMs): then tasks/get says why the task waits.
    const waiting = await waitFor(
      async () => {
        const task = await client.experimental.tasks.getTask(created.task.taskId);
        return task.statusMessage ? task : undefined;
      },
      { timeoutMs: 5_000 },
    );
    expect(waiting.status).toBe('working');
    expect(waiting.statusMessage).toMatch(/no live worker serves tool build_report/);
    const plain = client.request(
      { method: 'tools/call', params: { name: 'build_report', arguments: { report: 'plain', items: 1, delayMs: 0 } } },
      CallToolResultSchema,
      { timeout: 60_000 },
    );

    await startWorker();
    expect((await plain).structuredContent).toEqual({ report: 'plain', items: 1 });
    await waitFor(async () => (await client.experimental.tasks.getTask(created.task.taskId)).status === 'completed', {
      timeoutMs: 20_000,
    });
    const result = await client.experimental.tasks.getTaskResult(created.task.taskId, CallToolResultSchema);
    expect(result.structuredContent).toEqual({ report: 'queued', items: 2 });
    await client.close();
  });

  it('drops the tool past the retention: tools/list no longer lists it and a call gets Unknown tool', async () => {
    const { client, startWorker } = await stack({ TASKRELAY_CATALOG_RETENTION_MS: '1500' });
    const worker = await startWorker();
    await waitFor(async () => (await listed(client)).includes('build_report'), { timeoutMs: 10_000 });
    await stopWorker(worker);
    await waitFor(async () => !(await listed(client)).includes('build_report'), { timeoutMs: 15_000 });
    const refused = await client.callTool({ name: 'build_report', arguments: { report: 'x', items: 1 } }).then(
      () => undefined,
      (error: unknown) => error as { code: number; message: string },
    );
    expect(refused?.code).toBe(-32602);
    expect(refused?.message).toMatch(/Unknown tool: build_report/);
    await client.close();
  });

  it('forgets a pool an operator retires, and refuses to retire one with live workers', async () => {
    const { client, startWorker, gateway, common } = await stack();
    const worker = await startWorker();
    await waitFor(async () => (await listed(client)).includes('build_report'), { timeoutMs: 10_000 });
    const listing = pools(gateway, common, 'list');
    expect(listing.status).toBe(0);
    const pool = /^(\S+)\tlisted\t/m.exec(listing.stdout)?.[1] ?? '';
    expect(pool).toMatch(/^default\.[0-9a-f]{12}$/);
    // The digest is over the tools at their versions: the listing names both.
    expect(listing.stdout).toMatch(/\tlast seen \d+ s ago\t(\w+@[0-9a-f]{12},)*build_report@[0-9a-f]{12}(,|$)/m);

    const refused = pools(gateway, common, 'retire', pool);
    expect(refused.status).toBe(1);
    expect(refused.stderr).toMatch(/still has live workers/);

    await stopWorker(worker);
    expect(await listed(client)).toContain('build_report');
    const retired = pools(gateway, common, 'retire', pool);
    expect(retired.stderr).toBe('');
    expect(retired.status).toBe(0);
    await waitFor(async () => !(await listed(client)).includes('build_report'), { timeoutMs: 5_000 });
    await client.close();
  });

  it('§24.9 keeps a pool whose tool version a live task last ran: listed as kept, retired only by force', async () => {
    const { client, startWorker, gateway, common } = await stack();
    const worker = await startWorker({ WORKER_SHUTDOWN_GRACE_MS: '200' });
    await waitFor(async () => (await listed(client)).includes('build_report'), { timeoutMs: 10_000 });
    const created = await client.request(
      {
        method: 'tools/call',
        params: {
          name: 'build_report',
          arguments: { report: 'long', items: 600, delayMs: 100 },
          task: { ttl: 60_000 },
        },
      },
      CreateTaskResultSchema,
    );
    // The run has started (it recorded its tool version); SIGTERM hands it back, and no worker is left.
    await waitFor(async () => (await client.experimental.tasks.getTask(created.task.taskId)).statusMessage, {
      timeoutMs: 10_000,
    });
    await stopWorker(worker);
    const listing = pools(gateway, common, 'list');
    expect(listing.status).toBe(0);
    const kept = /^(\S+)\tkept: live tasks last ran build_report [0-9a-f]{12}\t/m.exec(listing.stdout);
    expect(kept, listing.stdout).not.toBeNull();
    const pool = kept?.[1] ?? '';

    const refused = pools(gateway, common, 'retire', pool);
    expect(refused.status).toBe(1);
    expect(refused.stderr).toMatch(/live tasks last ran: they may still resume on it; --force retires it anyway/);
    const forced = pools(gateway, common, 'retire', pool, '--force');
    expect(forced.stderr).toBe('');
    expect(forced.status).toBe(0);
    await client.experimental.tasks.cancelTask(created.task.taskId);
    await client.close();
  });
});
