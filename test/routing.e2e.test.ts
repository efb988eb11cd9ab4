/**
 * PROTOCOL.md §3.2 routing by tool, end to end: workers with different tool sets, started with the same (default)
 * queue as a user following the README would, each get only calls for tools they serve; a queued task whose pool has
 * no live worker says so in its `statusMessage` and the gateway log, and runs once a worker of its pool is back.
 */
import { beforeAll, describe, expect, it } from 'vitest';
import type { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { CallToolResultSchema, GetTaskResultSchema } from '@modelcontextprotocol/sdk/types.js';
import { waitFor } from './helpers/wait-for.js';
import { FIXTURE_TOOLS, type GatewayProcess, type ManagedProcess } from './helpers/processes.js';
import { useStack } from './helpers/stack.js';
import { startTask } from './helpers/tasks.js';

const CALLS = 60;

describe('§3.2 a job is only taken by a worker that serves its tool', () => {
  let workers: ManagedProcess[];
  let client: Client;

  // Both on the default queue (no TASKRELAY_QUEUE): what a user starting a second worker per the README gets.
  const stack = useStack({ name: 'route', workers: [{}, { TASKRELAY_TOOLS: FIXTURE_TOOLS }], mcp: true });

  beforeAll(() => {
    ({ workers, mcp: client } = stack);
  });

  it('runs every call of two workers with different tool sets on the same queue, none misrouted', async () => {
    const calls = Array.from({ length: CALLS }, (_, i) =>
      i % 2 === 0
        ? client.request({ method: 'tools/call', params: { name: 'echo', arguments: { i } } }, CallToolResultSchema)
        : client.request(
            {
              method: 'tools/call',
              params: { name: 'build_report', arguments: { report: `r${i}`, items: 1, delayMs: 0 } },
            },
            CallToolResultSchema,
          ),
    );
    const results = await Promise.all(calls);
    const failed = results.filter((r) => r.isError);
    expect(failed).toEqual([]);
    results.forEach((r, i) => {
      expect(r.structuredContent).toEqual(i % 2 === 0 ? { i } : { report: `r${i}`, items: 1 });
    });
    for (const worker of workers) expect(worker.output()).not.toContain('is not served by worker');
  });
});

describe('§3.2 a queued task whose pool has no live worker', () => {
  let gateway: GatewayProcess;
  let client: Client;
  let env: Record<string, string | undefined>;

  const stack = useStack({ name: 'unserved', workers: [], mcp: true });

  beforeAll(() => {
    ({ gateway, env, mcp: client } = stack);
  });

  const getTask = (taskId: string) => client.request({ method: 'tasks/get', params: { taskId } }, GetTaskResultSchema);

  it('says so in its statusMessage and the gateway log, and runs once a worker serving it is back', async () => {
    const workerEnv = { ...env, TASKRELAY_TOOLS: FIXTURE_TOOLS, WORKER_CONCURRENCY: '1', WORKER_HEARTBEAT_MS: '200' };
    const first = await stack.addWorker(workerEnv);
    // The only slot is busy (jobs are taken in order), so the echo task stays queued; then its only worker dies
    // without a word.
    const busy = await startTask(client, 'sleepy', { ms: 600_000, stepMs: 100 });
    const queued = await startTask(client, 'echo', { waiting: true });
    expect((await getTask(queued)).statusMessage).toBeUndefined();
    await first.kill('SIGKILL');

    const waiting = await waitFor(
      async () => {
        const task = await getTask(queued);
        return task.statusMessage?.includes('no live worker') ? task : undefined;
      },
      { timeoutMs: 10_000, message: 'no statusMessage about the missing worker' },
    );
    expect(waiting.status).toBe('working');
    expect(waiting.statusMessage).toMatch(/no live worker serves tool echo/);
    await waitFor(() =>
      gateway.logs().some((l) => l['level'] === 40 && l['tool'] === 'echo' && /no live worker/.test(String(l['msg']))),
    );

    await stack.addWorker({ ...workerEnv, WORKER_CONCURRENCY: '2' });
    const done = await waitFor(
      async () => {
        const task = await getTask(queued);
        return task.status === 'completed' ? task : undefined;
      },
      { timeoutMs: 15_000, message: 'the queued task did not run once its worker was back' },
    );
    expect(done.statusMessage).toBeUndefined();
    await client
      .request({ method: 'tasks/cancel', params: { taskId: busy } }, GetTaskResultSchema)
      .catch(() => undefined);
  });
});
