/**
 * `pnpm bench --create-path`: the gateway's create path alone, in this process against the run's own Redis — a
 * task created with its BullMQ job added by the same script (what the gateway does, PROTOCOL.md §10.1, §25) against
 * the same create followed by `JobDispatcher.enqueue` (what it did before, and still does for a task with an
 * idempotency key). Sequential (C = 1), alternating blocks, so the figures are the path's own costs: wall time per
 * create, this process's CPU per create (the gateway's share of it) and Redis's time in commands per create
 * (`INFO commandstats`).
 */
import { loadavg } from 'node:os';
import {
  FAIL_FAST_REDIS_OPTIONS,
  TaskStore,
  createKeys,
  createLogger,
  createRedis,
  newTaskId,
  type JobData,
  toolQueue,
} from '@taskrelay/shared';
import { JobDispatcher } from '../../packages/gateway/src/tasks/job-dispatcher.js';
import type { CatalogTool } from '../../packages/gateway/src/tasks/catalog.js';
import { uniquePrefix, type TestRedis } from '../../test/helpers/redis.js';

const TOOL: CatalogTool = {
  name: 'bench_noop',
  description: 'no-op',
  inputSchema: { type: 'object' },
  taskSupport: 'optional',
  queue: toolQueue('default', 'bench_noop'),
  paused: false,
};
const CREATES = 2_000;
const ROUNDS = 3;

export async function runCreatePath(o: { redis: TestRedis; log: (m: string) => void }): Promise<number> {
  const admin = createRedis(o.redis.url);
  const log = createLogger('bench', { level: 'silent' });
  const redisUsec = async () => {
    const info = await admin.info('commandstats');
    let usec = 0;
    for (const m of info.matchAll(/cmdstat_\w+:calls=\d+,usec=(\d+)/g)) usec += Number(m[1]);
    return usec;
  };
  const figures: Record<string, { wall: number[]; cpu: number[]; redis: number[] }> = {
    'create + add in one script': { wall: [], cpu: [], redis: [] },
    'create, then Queue.add': { wall: [], cpu: [], redis: [] },
  };
  try {
    for (let round = 0; round <= ROUNDS; round++) {
      const order = Object.keys(figures);
      if (round % 2 === 1) order.reverse();
      for (const mode of order) {
        const keys = createKeys(uniquePrefix('create'));
        const connection = createRedis(o.redis.url, FAIL_FAST_REDIS_OPTIONS);
        const command = createRedis(o.redis.url);
        const dispatcher = new JobDispatcher(connection, keys, log);
        const store = new TaskStore(command, keys);
        const one = async () => {
          const taskId = newTaskId();
          const data: JobData = { taskId, tool: TOOL.name, arguments: {}, timeoutMs: 1_000, principal: 'p' };
          const input = {
            taskId,
            tool: TOOL.name,
            queue: TOOL.queue,
            principal: 'p',
            mode: 'call' as const,
            ttl: 10_000,
            pollInterval: 1_000,
            fairShare: { ttlMs: 60_000 },
            openTasks: { max: 1_000_000, ttlMs: 60_000 },
          };
          if (mode === 'create + add in one script') {
            const job = await dispatcher.prepare(TOOL, data);
            if (!job) throw new Error('BullMQ add not available for the create script');
            const outcome = await store.records.createTask({ ...input, job });
            if (!outcome.jobAdded) throw new Error('job not added');
          } else {
            const outcome = await store.records.createTask(input);
            await dispatcher.enqueue(TOOL, data, { priority: outcome.priority ?? 1 });
          }
        };
        try {
          const n = round === 0 ? 300 : CREATES; // round 0 warms both paths up (JIT), not recorded
          const usec0 = await redisUsec();
          const cpu0 = process.cpuUsage();
          const t0 = performance.now();
          for (let i = 0; i < n; i++) await one();
          const wall = (performance.now() - t0) / n;
          const cpu = process.cpuUsage(cpu0);
          const redis = ((await redisUsec()) - usec0) / 1000 / n;
          if (round > 0) {
            figures[mode]!.wall.push(wall);
            figures[mode]!.cpu.push((cpu.user + cpu.system) / 1000 / n);
            figures[mode]!.redis.push(redis);
          }
        } finally {
          await dispatcher.close();
          connection.disconnect();
          command.disconnect();
        }
      }
      o.log(`round ${round} done (load ${loadavg()[0]?.toFixed(2)})`);
    }
  } finally {
    admin.disconnect();
  }
  const median = (v: number[]) => [...v].sort((a, b) => a - b)[Math.floor((v.length - 1) / 2)] ?? Number.NaN;
  const [one, two] = Object.values(figures);
  console.log(
    `\ncreate path, ${CREATES} sequential creates × ${ROUNDS} rounds per mode (medians; load ${loadavg()
      .map((v) => v.toFixed(2))
      .join(' ')})`,
  );
  console.log('mode                          wall ms   gateway CPU-ms   Redis command ms');
  for (const [mode, f] of Object.entries(figures)) {
    console.log(
      `${mode.padEnd(28)}  ${median(f.wall).toFixed(3).padStart(7)}   ${median(f.cpu).toFixed(3).padStart(14)}   ${median(f.redis).toFixed(3).padStart(16)}`,
    );
  }
  console.log(
    `ratio (one script / then add)  ${(median(one!.wall) / median(two!.wall)).toFixed(2).padStart(7)}   ` +
      `${(median(one!.cpu) / median(two!.cpu)).toFixed(2).padStart(14)}   ${(median(one!.redis) / median(two!.redis)).toFixed(2).padStart(16)}`,
  );
  return 0;
}
