/**
 * Fault suite, the whole of PROTOCOL.md §5.6 and §10 at once: 100 tasks in flight while workers are SIGKILLed and
 * restarted round after round and the gateway is SIGKILLed and restarted once. Clients reconnect to the restarted
 * gateway and keep polling by id. Every task must end `completed`, once, readable by id, with its side effect applied
 * exactly once; none may be stuck. The runs/effects histogram is printed with the test output.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { waitFor } from '../helpers/wait-for.js';
import {
  FAULT_TOOLS,
  TERMINAL,
  WorkerPool,
  startTask,
  faultKeys,
  taskResult,
  useFaultStack,
  watchingClient,
  type WatchingClient,
} from '../helpers/faults.js';

const TASKS = 100;
const USERS = 4;
const WORKERS = 3;
/**
 * Worker kills per round; the gateway is killed too in the round marked: the first, which starts as soon as every
 * task is submitted, so it always hits tasks in flight (a later round may come after the last task ended, on a fast
 * run, and then never ran: the run saw no gateway kill).
 */
const ROUNDS: Array<{ workers: number; gateway?: true }> = [
  { workers: 1, gateway: true },
  { workers: 2 },
  { workers: 1 },
  { workers: 2 },
  { workers: 1 },
];
/** A round starts once this many runs started since the last one: the previous kills' jobs were being taken over. */
const RUNS_BETWEEN_ROUNDS = 10;

const faults = useFaultStack({
  name: 'f-chaos',
  gateways: [{ TASKRELAY_REAPER_INTERVAL_MS: '500' }],
  workers: [],
  watch: false,
});
const { stack } = faults;
let pool: WorkerPool;

beforeAll(async () => {
  pool = new WorkerPool(
    {
      TASKRELAY_TOOLS: FAULT_TOOLS,
      WORKER_CONCURRENCY: '20',
      WORKER_LOCK_DURATION_MS: '2000',
      WORKER_HEARTBEAT_MS: '1000',
    },
    (env) => stack.addWorker(env),
  );
  await pool.start(WORKERS);
});

/**
 * One user of the gateway: a session that is replaced by a new one when a request fails (the gateway died, or its
 * restart does not know the old session), as a client that keeps polling by id would do.
 */
class User {
  readonly sessions: WatchingClient[] = [];
  private current: Promise<Client> | undefined;

  client(): Promise<Client> {
    this.current ??= waitFor(
      async () => {
        const session = await watchingClient(stack.gateway.url);
        session.client.onerror = () => undefined;
        this.sessions.push(session);
        return session.client;
      },
      { timeoutMs: 30_000, message: 'could not reconnect to the gateway' },
    );
    return this.current;
  }

  /**
   * Runs a request; on failure drops the session and tries once more on a new one. A user whose tasks all ended
   * before the gateway restart still holds a session the restarted gateway never knew (404): a client reconnects.
   */
  async request<T>(send: (client: Client) => Promise<T>, retry = true): Promise<T> {
    const client = await this.client();
    try {
      return await send(client);
    } catch (error) {
      if (this.current && (await this.current) === client) this.current = undefined;
      if (!retry) throw error;
      return this.request(send, false);
    }
  }

  progressOf(token: string): number[] {
    return this.sessions.flatMap((s) => s.progress.filter((p) => p.progressToken === token).map((p) => p.progress));
  }

  terminalNoticesOf(taskId: string): number {
    return this.sessions.flatMap((s) => s.statuses.filter((n) => n.taskId === taskId && TERMINAL.has(n.status))).length;
  }

  async close(): Promise<void> {
    await Promise.all(this.sessions.map((s) => s.close().catch(() => undefined)));
  }
}

interface Submitted {
  taskId: string;
  user: User;
  token: string;
}

describe('chaos: 100 tasks while workers and the gateway are SIGKILLed and restarted', () => {
  const users = Array.from({ length: USERS }, () => new User());
  const submitted: Submitted[] = [];
  const finalStatus = new Map<string, string>();
  const kills = { workers: 0, gateways: 0 };

  beforeAll(async () => {
    // 0.5–2 s each, spread evenly, with progress every 100 ms.
    await Promise.all(
      users.map(async (user, u) => {
        for (let i = u; i < TASKS; i += USERS) {
          const token = `chaos-${i}`;
          const ms = 500 + ((i * 379) % 1_501);
          // Not retried: a second create would be a second task.
          const taskId = await user.request(
            (c) => startTask(c, 'chaos_job', { ms, stepMs: 100 }, { progressToken: token }),
            false,
          );
          submitted.push({ taskId, user, token });
        }
      }),
    );

    const totalRuns = async () => {
      const values = await stack.r.mget(submitted.map((s) => faultKeys(stack.prefix).runs(s.taskId)));
      return values.reduce((sum, v) => sum + Number(v ?? 0), 0);
    };
    const pending = () => submitted.filter((s) => !finalStatus.has(s.taskId));
    const poll = async () => {
      await Promise.all(
        users.map(async (user) => {
          for (const s of pending().filter((p) => p.user === user)) {
            const task = await user.request((c) => c.experimental.tasks.getTask(s.taskId, { timeout: 5_000 }));
            if (TERMINAL.has(task.status)) finalStatus.set(s.taskId, task.status);
          }
        }),
      );
      return pending().length === 0;
    };

    // The faults, each round once the system has moved on since the last one; polling by id never stops.
    const chaos = (async () => {
      for (const round of ROUNDS) {
        const runsAtRound = await totalRuns();
        const victims = [...pool.procs.values()].slice(0, round.workers);
        await Promise.all(victims.map((w) => w.kill('SIGKILL')));
        kills.workers += victims.length;
        if (round.gateway) {
          await stack.restartGateway();
          kills.gateways++;
        }
        await pool.start(WORKERS - pool.procs.size);
        // No new runs for long means stuck tasks: stop the faults and let the assertions name them.
        const moved = await waitFor(
          async () => pending().length === 0 || (await totalRuns()) >= runsAtRound + RUNS_BETWEEN_ROUNDS,
          { timeoutMs: 15_000 },
        ).catch(() => false);
        if (!moved || pending().length === 0) break;
      }
    })();
    // Stuck tasks are reported by the first test, by id and status.
    const polling = waitFor(() => poll().catch(() => false), { timeoutMs: 40_000, intervalMs: 250 }).catch(
      () => undefined,
    );
    await Promise.all([chaos, polling]);
  }, 90_000);

  afterAll(async () => {
    await Promise.all(users.map((u) => u.close()));
  });

  it('ends every task completed, none stuck, each readable by id from the restarted gateway', async () => {
    const notCompleted = submitted.filter((s) => finalStatus.get(s.taskId) !== 'completed');
    const statuses = await Promise.all(
      notCompleted.map(async (s) => {
        const task = await s.user.request((c) => c.experimental.tasks.getTask(s.taskId));
        return `${s.taskId}: ${task.status} (${task.statusMessage ?? ''})`;
      }),
    );
    expect(statuses).toEqual([]);
    expect(kills).toEqual({ workers: expect.any(Number), gateways: 1 });
    for (const s of submitted) {
      const result = await s.user.request((c) => taskResult(c, s.taskId));
      expect(result.isError, s.taskId).not.toBe(true);
      expect(result.structuredContent, s.taskId).toMatchObject({ attempt: expect.any(Number) });
    }
  });

  it('applies each task’s side effect exactly once, however many runs it took', async () => {
    const rows = await Promise.all(
      submitted.map(async (s) => ({
        taskId: s.taskId,
        runs: await faults.records.counter('runs', s.taskId),
        effects: await faults.records.counter('effects', s.taskId),
        effectRuns: await faults.records.counter('effectRuns', s.taskId),
      })),
    );
    const histogram = (key: 'runs' | 'effects' | 'effectRuns') =>
      Object.fromEntries(
        [...rows.reduce((m, row) => m.set(row[key], (m.get(row[key]) ?? 0) + 1), new Map<number, number>())].sort(
          ([a], [b]) => a - b,
        ),
      );
    console.log(
      `chaos: ${TASKS} tasks, ${kills.workers} worker kills, ${kills.gateways} gateway kill(s)\n` +
        `  runs per task (count → tasks):          ${JSON.stringify(histogram('runs'))}\n` +
        `  runs that reached the effect → tasks:   ${JSON.stringify(histogram('effectRuns'))}\n` +
        `  effects applied per task → tasks:       ${JSON.stringify(histogram('effects'))}`,
    );
    expect(rows.filter((row) => row.effects !== 1)).toEqual([]);
    expect(rows.filter((row) => row.runs < 1 || row.effectRuns > row.runs)).toEqual([]);
  });

  it('never shows a client progress that goes back, nor more than one terminal status per task', () => {
    for (const s of submitted) {
      const values = s.user.progressOf(s.token);
      for (let i = 1; i < values.length; i++) expect(values[i], s.token).toBeGreaterThan(values[i - 1] ?? -Infinity);
      expect(s.user.terminalNoticesOf(s.taskId), s.taskId).toBeLessThanOrEqual(1);
    }
  });
});
