/**
 * What one progress update of a long task costs Redis (docs/SCALING.md §6): the `progress` script (lock check, the
 * hash write, the backlog check and the publish to the gateway's channel, which a subscriber reads) run `--updates`
 * times on one task, on one Redis, in the sharded key layout; commands from `INFO commandstats` (exact), Redis CPU from
 * `INFO cpu` (`used_cpu_user + used_cpu_sys`) over the run, less an idle window of the same length.
 *
 *   pnpm build && npx tsx bench/progress-cost.ts [--updates 20000] [--in-flight 64]
 *
 * Loopback only; the Redis it starts is stopped by PID. No thresholds: it prints one line.
 */
import { parseArgs } from 'node:util';
import { Redis } from 'ioredis';
import { TaskStore, createKeys, newTaskId } from '@taskrelay/shared';
import { startRedis, uniquePrefix } from '../test/helpers/redis.js';

const { values } = parseArgs({
  args: process.argv.slice(2).filter((a) => a !== '--'),
  options: { updates: { type: 'string', default: '20000' }, 'in-flight': { type: 'string', default: '64' } },
});
const UPDATES = Number(values.updates);
const IN_FLIGHT = Number(values['in-flight']);

async function cpuAndCommands(redis: Redis): Promise<{ cpu: number; commands: number }> {
  const cpuInfo = await redis.info('cpu');
  let cpu = 0;
  for (const field of ['used_cpu_user', 'used_cpu_sys'])
    cpu += Number(new RegExp(`${field}:([0-9.]+)`).exec(cpuInfo)?.[1]);
  let commands = 0;
  for (const m of (await redis.info('commandstats')).matchAll(/^cmdstat_[^:]+:calls=(\d+)/gm)) commands += Number(m[1]);
  return { cpu, commands };
}

const server = await startRedis({ owned: true });
const redis = new Redis(server.url);
const subscriber = new Redis(server.url);
try {
  const keys = createKeys(uniquePrefix('progress'), 'sharded');
  const store = new TaskStore(redis, keys);
  const [code] = (await store.placement?.codes('default~long', 1)) ?? [];
  // One task per in-flight writer, each routed to gateway g1, whose channel a subscriber reads (as a gateway would).
  const tasks = await Promise.all(
    Array.from({ length: IN_FLIGHT }, () =>
      store.records.create({
        tool: 'long',
        queue: 'default~long',
        principal: 'p',
        mode: 'task',
        ttl: 3_600_000,
        pollInterval: 1000,
        gatewayId: 'g1',
        taskId: newTaskId(code),
      }),
    ),
  );
  let received = 0;
  subscriber.on('message', () => (received += 1));
  await subscriber.subscribe(keys.forTask(tasks[0]!.taskId).gatewayChannel('g1'), keys.gatewayChannel('g1'));
  const idleBefore = await cpuAndCommands(redis);
  const started = performance.now();
  let next = 0;
  await Promise.all(
    tasks.map(async (task) => {
      while (next < UPDATES) {
        next += 1;
        await store.runs.recordProgress(task.taskId, { progress: next });
      }
    }),
  );
  const seconds = (performance.now() - started) / 1_000;
  const after = await cpuAndCommands(redis);
  // The idle rate: the same window with nothing sent.
  await new Promise((resolve) => setTimeout(resolve, seconds * 1_000));
  const idle = await cpuAndCommands(redis);
  const idleCpu = idle.cpu - after.cpu;
  const idleCommands = idle.commands - after.commands - 2;
  const cpuUs = ((after.cpu - idleBefore.cpu - idleCpu) * 1e6) / UPDATES;
  const commands = (after.commands - idleBefore.commands - 2 - idleCommands) / UPDATES;
  console.log(
    `${UPDATES} progress updates, ${IN_FLIGHT} in flight, ${Math.round(UPDATES / seconds)}/s: ` +
      `${commands.toFixed(2)} Redis commands and ${cpuUs.toFixed(1)} µs Redis CPU per update; ` +
      `${received} messages reached the subscriber`,
  );
} finally {
  subscriber.disconnect();
  redis.disconnect();
  await server.stop();
}
