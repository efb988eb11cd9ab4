/**
 * Issue 33 item 4, PROTOCOL.md §29: a Python worker survives a Redis outage. A durable Redis (AOF, fsync always) is
 * SIGKILLed under a running Python task and restarted on the same port 3 s later: the worker process stays up,
 * reconnects by itself, the task it was running ends completed exactly once, and a call made after the outage runs.
 */
import { setTimeout as delay } from 'node:timers/promises';
import { resolve } from 'node:path';
import { beforeAll, describe, expect, it } from 'vitest';
import type { Client } from '@modelcontextprotocol/sdk/client/index.js';
import type { TestRedis } from '../helpers/redis.js';
import { waitFor } from '../helpers/wait-for.js';
import { PYTHON, ROOT, type GatewayProcess, type ManagedProcess } from '../helpers/processes.js';
import { useStack } from '../helpers/stack.js';
import { startTask, taskResult } from '../helpers/tasks.js';
import { absenceWindow } from '../helpers/load.js';

if (PYTHON === undefined) console.log('python-worker fault suite skipped: no .venv/bin/python (needs Python 3.11+)');

describe.skipIf(PYTHON === undefined)('a Python worker through a Redis outage', () => {
  const stack = useStack({
    name: 'f-py',
    redis: { owned: true, appendOnly: true },
    gateways: [{ TASKRELAY_REAPER_INTERVAL_MS: '500' }],
    workers: [],
    pythonWorkers: [
      { TASKRELAY_TOOLS: resolve(ROOT, 'test/fixtures/python_tools.py'), WORKER_LOCK_DURATION_MS: '2000' },
    ],
    mcp: true,
  });
  let redis: TestRedis;
  let gateway: GatewayProcess;
  let worker: ManagedProcess;
  let client: Client;

  beforeAll(() => {
    ({ redis, gateway, mcp: client } = stack);
    [worker] = stack.pythonWorkers as [ManagedProcess];
  });

  it('keeps running, reconnects, finishes the task it held once, and takes new work', async () => {
    const taskId = await startTask(client, 'py_slow', { seconds: 3 });
    await waitFor(() => worker.logs().some((l) => l['taskId'] === taskId && l['msg'] === 'tool started'));
    await delay(500);
    await redis.kill();
    await delay(3_000);
    expect(worker.child.exitCode).toBeNull();
    await redis.restart();
    await waitFor(async () => (await fetch(gateway.url.replace(/\/mcp$/, '/readyz'))).status === 200, {
      timeoutMs: 15_000,
      message: 'the gateway did not come back',
    });
    const result = await taskResult(client, taskId, 60_000);
    expect(result.structuredContent).toMatchObject({ slept: 3 });
    // The worker logs its completion just after the write that answered the client: wait for the line.
    const completions = () => worker.logs().filter((l) => l['taskId'] === taskId && l['msg'] === 'task completed');
    await waitFor(() => completions().length > 0);
    await absenceWindow(200);
    expect(completions()).toHaveLength(1);
    const after = await taskResult(client, await startTask(client, 'py_count', { n: 2, delay_ms: 1 }), 30_000);
    expect(after.structuredContent).toMatchObject({ counted: 2 });
    expect(worker.child.exitCode).toBeNull();
  }, 120_000);
});
