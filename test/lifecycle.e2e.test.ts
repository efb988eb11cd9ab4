/**
 * Each process's life, from outside, state by state (PROTOCOL.md §11 for the gateway, §21.1 for the worker), the way
 * Temporal tests its worker's lifecycle: every state is entered once and in order, and in each state the process does
 * what that state promises.
 * - gateway: starting → ready (`/readyz` 200) → draining on SIGTERM (`/readyz` 503 at once; a plain call in flight
 *   still gets its result) → closed (exit 0).
 * - worker: starting → running (its catalog listed) → draining on SIGTERM (a running tool finishes; its catalog stays
 *   listed) → stopping → stopped (its catalog gone, exit 0).
 * - a SIGTERM that comes while a worker starts, Node or Python, is kept: the worker starts, then drains (exit 0). Until
 *   a process listens for SIGTERM, the kernel's default ends it at once, with no drain; a worker that listened only
 *   after its `worker ready` line could be ended by a SIGTERM sent on seeing that line.
 * - a second signal while a worker drains ends it at once, exit code 1, Node and Python alike.
 */
import { describe, expect, it } from 'vitest';
import { CallToolResultSchema } from '@modelcontextprotocol/sdk/types.js';
import { createKeys } from '@taskrelay/shared';
import { waitFor } from './helpers/wait-for.js';
import {
  GATEWAY_MAIN,
  PYTHON,
  WORKER_MAIN,
  spawnNode,
  spawnProcess,
  type ManagedProcess,
} from './helpers/processes.js';
import { startTcpProxy } from './helpers/tcp-proxy.js';
import { startTask } from './helpers/tasks.js';
import { useStack } from './helpers/stack.js';

const stack = useStack({
  name: 'lifecycle',
  // The state lines are debug lines; a long grace, so the drain waits for the call in flight.
  gateways: [{ LOG_LEVEL: 'debug', GATEWAY_SHUTDOWN_GRACE_MS: '30000' }],
  workers: [{ LOG_LEVEL: 'debug', WORKER_SHUTDOWN_GRACE_MS: '30000' }],
});

/**
 * A plain `build_report` call of ~1.5 s, resolved once its first progress arrived (the tool is running in the worker):
 * then `result` is its answer.
 */
async function callInFlight(url: string): Promise<{ result: Promise<{ isError?: boolean; content: unknown }> }> {
  const client = await stack.client({}, url);
  let progressed!: () => void;
  const running = new Promise<void>((resolve) => (progressed = resolve));
  const result = client.request(
    { method: 'tools/call', params: { name: 'build_report', arguments: { report: 'drain', items: 30, delayMs: 50 } } },
    CallToolResultSchema,
    { timeout: 60_000, onprogress: () => progressed() },
  );
  await Promise.race([running, result]);
  return { result };
}

/** The `to` of each state line a process logged, in order. */
function states(proc: ManagedProcess, msg: string): string[] {
  return proc
    .logs()
    .filter((l) => l['msg'] === msg)
    .map((l) => String(l['to']));
}

describe('process lifecycles', () => {
  it('gateway: starting → ready → draining (readyz 503, a call in flight answered) → closed', async () => {
    // A gateway of its own, so the worker's test keeps the stack's.
    const gateway = await stack.addGateway({ LOG_LEVEL: 'debug', GATEWAY_SHUTDOWN_GRACE_MS: '30000' });
    const base = gateway.url.replace(/\/mcp$/, '');
    expect(states(gateway, 'gateway state')).toEqual(['ready']);
    expect((await fetch(`${base}/readyz`)).status).toBe(200);

    const call = await callInFlight(gateway.url);
    gateway.child.kill('SIGTERM');
    await waitFor(() => states(gateway, 'gateway state').includes('draining'), {
      message: 'the gateway did not enter draining',
    });
    // Draining: not ready for new work (a connection kept alive from before gets 503, a new one is refused).
    expect(
      await fetch(`${base}/readyz`).then(
        (r) => r.status,
        () => 'refused',
      ),
    ).not.toBe(200);
    const result = await call.result;
    expect(result.isError).toBeFalsy();
    expect(JSON.stringify(result.content)).toContain('built from 30 items');
    expect(await gateway.exited).toBe(0);
    expect(states(gateway, 'gateway state')).toEqual(['ready', 'draining', 'closed']);
  });

  it('worker: starting → running → draining (a running tool finishes, still listed) → stopping → stopped (unlisted)', async () => {
    const worker = stack.workers[0]!;
    const keys = createKeys(stack.prefix);
    const workerId = await waitFor(
      () => worker.logs().find((l) => l['msg'] === 'worker ready')?.['workerId'] as string | undefined,
      { message: 'no worker id in the ready line' },
    );
    expect(states(worker, 'worker state')).toEqual(['starting', 'running']);
    expect(await stack.r.zscore(keys.workers, workerId)).not.toBeNull();

    const call = await callInFlight(stack.gateway.url);
    worker.child.kill('SIGTERM');
    await waitFor(() => states(worker, 'worker state').includes('draining'), { message: 'no draining' });
    // Draining: still listed, so the gateway keeps routing the tool and its calls queue.
    expect(await stack.r.zscore(keys.workers, workerId)).not.toBeNull();
    const result = await call.result;
    expect(result.isError).toBeFalsy();
    expect(JSON.stringify(result.content)).toContain('built from 30 items');
    expect(await worker.exited).toBe(0);
    expect(states(worker, 'worker state')).toEqual(['starting', 'running', 'draining', 'stopping', 'stopped']);
    expect(await stack.r.zscore(keys.workers, workerId)).toBeNull();
    expect(await stack.r.exists(keys.workerCatalog(workerId))).toBe(0);
  });

  it('gateway: a SIGTERM while it starts is kept, and drains it once it has started (exit 0)', async () => {
    // Its Redis is held behind a paused proxy: the gateway's first connection there says it is past its first line,
    // and it cannot be ready before the proxy resumes.
    const proxy = await startTcpProxy({ port: stack.redis.port });
    try {
      proxy.pause();
      const gateway = spawnNode(GATEWAY_MAIN, {
        ...stack.env,
        REDIS_URL: proxy.url,
        HOST: '127.0.0.1',
        PORT: '0',
        LOG_LEVEL: 'debug',
      });
      await waitFor(() => proxy.accepted > 0, { message: 'the gateway never reached its Redis' });
      gateway.child.kill('SIGTERM');
      proxy.resume();
      expect(await gateway.exited, gateway.output()).toBe(0);
      expect(states(gateway, 'gateway state')).toEqual(['ready', 'draining', 'closed']);
    } finally {
      await proxy.close();
    }
  });

  /** Starts a worker whose tools take 1.5 s to load, and sends SIGTERM once they start to. */
  const signalWhileStarting = async (worker: ManagedProcess) => {
    await waitFor(() => worker.output().includes('slow tools: loading'), {
      message: 'the tools did not start to load',
    });
    worker.child.kill('SIGTERM');
    return worker.exited;
  };

  it('worker: a SIGTERM while it starts is kept, and drains it once it has started (exit 0)', async () => {
    const worker = spawnNode(WORKER_MAIN, {
      ...stack.env,
      LOG_LEVEL: 'debug',
      TASKRELAY_TOOLS: 'test/fixtures/slow-start-tools.mjs',
      TASKRELAY_QUEUE: 'slowstart',
    });
    expect(await signalWhileStarting(worker), worker.output()).toBe(0);
    expect(states(worker, 'worker state')).toEqual(['starting', 'running', 'draining', 'stopping', 'stopped']);
  });

  it.skipIf(PYTHON === undefined)(
    'python worker: a SIGTERM while it starts is kept, and drains it (exit 0)',
    async () => {
      const worker = spawnProcess(PYTHON!, ['-m', 'taskrelay_worker'], {
        ...stack.env,
        TASKRELAY_TOOLS: 'test/fixtures/python_slow_start.py',
        TASKRELAY_QUEUE: 'slowstart-py',
      });
      expect(await signalWhileStarting(worker), worker.output()).toBe(0);
      const said = worker.logs().map((l) => l['msg']);
      expect(said.filter((m) => ['worker ready', 'worker draining', 'worker stopped'].includes(String(m)))).toEqual([
        'worker ready',
        'worker draining',
        'worker stopped',
      ]);
    },
  );

  /** SIGTERMs a worker running a long task, then again once it drains: it exits 1 without waiting for the task. */
  const signalTwice = async (worker: ManagedProcess, tool: string, args: Record<string, unknown>) => {
    const client = await stack.client();
    const taskId = await startTask(client, tool, args);
    await waitFor(() => worker.logs().some((l) => l['taskId'] === taskId && l['msg'] === 'tool started'), {
      message: 'the task did not start on the worker',
    });
    worker.child.kill('SIGTERM');
    await waitFor(() => worker.logs().some((l) => /draining/.test(String(l['to'] ?? l['msg']))), {
      message: 'the worker did not drain',
    });
    worker.child.kill('SIGTERM');
    expect(await worker.exited, worker.output()).toBe(1);
    expect(worker.logs().map((l) => l['msg'])).toContain('second signal; exiting without waiting for running tools');
  };

  it('worker: a second SIGTERM while it drains exits at once (exit 1)', async () => {
    const worker = await stack.addWorker({ LOG_LEVEL: 'debug', WORKER_SHUTDOWN_GRACE_MS: '120000' });
    await signalTwice(worker, 'build_report', { report: 'twice', items: 2_000, delayMs: 50 });
  });

  it.skipIf(PYTHON === undefined)(
    'python worker: a second SIGTERM while it drains exits at once (exit 1)',
    async () => {
      const worker = await stack.addPythonWorker({
        TASKRELAY_TOOLS: 'test/fixtures/python_tools.py',
        WORKER_SHUTDOWN_GRACE_MS: '120000',
      });
      await signalTwice(worker, 'py_count', { n: 2_000, delay_ms: 50 });
    },
  );
});
