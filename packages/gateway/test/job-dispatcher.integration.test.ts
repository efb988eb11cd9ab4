import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import getPort from 'get-port';
import { Redis } from 'ioredis';
import {
  FAIL_FAST_REDIS_OPTIONS,
  OpenCapReached,
  TaskStore,
  createKeys,
  createLogger,
  createRedis,
  type TaskrelayError,
} from '@taskrelay/shared';
import { monitorRedis } from '../../../test/helpers/monitor.js';
import { startRedis, uniquePrefix, type TestRedis } from '../../../test/helpers/redis.js';
import { JobDispatcher } from '../src/tasks/job-dispatcher.js';
import { ADD_PRIORITIZED_JOB_KEYS } from '../src/tasks/bullmq-adapter.js';
import { toMcpError } from '../src/wire/errors.js';
import type { CatalogTool } from '../src/tasks/catalog.js';

let server: TestRedis;
let redis: Redis;
const log = createLogger('test', { level: 'silent' });
const tool: CatalogTool = {
  paused: false,
  name: 'echo',
  description: 'echo',
  inputSchema: { type: 'object' },
  taskSupport: 'optional',
  queue: 'default',
};

beforeAll(async () => {
  server = await startRedis();
  redis = new Redis(server.url);
});

afterAll(async () => {
  redis?.disconnect();
  await server?.stop();
});

describe('§4 job dispatcher', () => {
  it('keeps a short tail of BullMQ queue events', async () => {
    const keys = createKeys(uniquePrefix('dispatch'));
    const connection = createRedis(server.url, FAIL_FAST_REDIS_OPTIONS);
    const dispatcher = new JobDispatcher(connection, keys, log);
    try {
      for (let i = 0; i < 1_500; i++) {
        await dispatcher.enqueue(tool, { taskId: `t${i}`, tool: 'echo', arguments: {}, timeoutMs: 1000 });
      }
      const events = await redis.keys(`${keys.bullPrefix}:*:events`);
      expect(events).toHaveLength(1);
      // XADD MAXLEN ~ trims whole macro nodes, so a little over the cap may remain; BullMQ's own default is 10 000.
      expect(await redis.xlen(events[0]!)).toBeLessThan(1_500);
    } finally {
      await dispatcher.close();
      connection.disconnect();
    }
  });

  it('fails a job for a queue first used while Redis is away as "task store unavailable", without waiting for it', async () => {
    const nowhere = createRedis(`redis://127.0.0.1:${await getPort({ host: '127.0.0.1' })}`, FAIL_FAST_REDIS_OPTIONS);
    nowhere.on('error', () => undefined);
    const dispatcher = new JobDispatcher(nowhere, createKeys(uniquePrefix('dispatch')), log, { readyTimeoutMs: 200 });
    try {
      const error = await dispatcher.enqueue(tool, { taskId: 't', tool: 'echo', arguments: {}, timeoutMs: 1000 }).then(
        () => undefined,
        (e: unknown) => e,
      );
      expect((error as TaskrelayError).code).toBe('REDIS_UNAVAILABLE');
      expect(toMcpError(error).data).toEqual({ code: 'REDIS_UNAVAILABLE' });
    } finally {
      nowhere.disconnect();
      await dispatcher.close();
    }
  });

  it('adds a job in the create script exactly as Queue.add adds it, with the fair-share priority, and none on a refused create', async () => {
    const keys = createKeys(uniquePrefix('dispatch'));
    const connection = createRedis(server.url, FAIL_FAST_REDIS_OPTIONS);
    const command = createRedis(server.url);
    const dispatcher = new JobDispatcher(connection, keys, log);
    const store = new TaskStore(command, keys);
    const retrying: CatalogTool = { ...tool, attempts: 3, backoff: { type: 'fixed', delayMs: 50 } };
    const input = (taskId: string) => ({
      taskId,
      tool: 'echo',
      queue: 'default',
      principal: 'p',
      mode: 'call' as const,
      ttl: 10_000,
      pollInterval: 1000,
      fairShare: { ttlMs: 60_000 },
      openTasks: { max: 3, ttlMs: 60_000 },
    });
    const data = (taskId: string) => ({ taskId, tool: 'echo', arguments: { n: 1 }, timeoutMs: 1000, principal: 'p' });
    try {
      // The reference: the same job through Queue.add (the path without the create script), priority 1.
      await dispatcher.enqueue(retrying, data('ref'), { priority: 1 });
      const jobKey = (id: string) => `${keys.bullPrefix}:${keys.queueName('default')}:${id}`;
      for (const [i, id] of ['a', 'b'].entries()) {
        const job = await dispatcher.prepare(retrying, data(id));
        expect(job).toBeDefined();
        const outcome = await store.records.createTask({ ...input(id), job: job! });
        expect(outcome).toMatchObject({ created: true, jobAdded: true, priority: i + 1 });
      }
      const ref = await redis.hgetall(jobKey('ref'));
      const b = await redis.hgetall(jobKey('b'));
      const strip = (h: Record<string, string>) => {
        const { timestamp: _t, ...rest } = h;
        return { ...rest, data: JSON.parse(rest['data'] ?? '{}') as unknown, opts: JSON.parse(rest['opts'] ?? '{}') };
      };
      expect(strip(b)).toEqual({
        ...strip(ref),
        priority: '2',
        data: data('b'),
        opts: { ...(strip(ref).opts as object), jobId: 'b', priority: 2 },
      });
      const prioritized = await redis.zrange(`${keys.bullPrefix}:${keys.queueName('default')}:prioritized`, 0, -1);
      expect(prioritized).toHaveLength(3);
      // The third create fills the cap; the fourth is refused at it and adds no job.
      expect(
        await store.records.createTask({ ...input('c'), job: (await dispatcher.prepare(retrying, data('c')))! }),
      ).toMatchObject({ created: true });
      const refused = await store.records
        .createTask({ ...input('d'), job: (await dispatcher.prepare(retrying, data('d')))! })
        .catch((e: unknown) => e);
      expect(refused).toBeInstanceOf(OpenCapReached);
      expect((refused as OpenCapReached).open).toBe(3);
      expect(await redis.exists(jobKey('d'), keys.task('d'))).toBe(0);
    } finally {
      await dispatcher.close();
      connection.disconnect();
      command.disconnect();
    }
  });

  it('a cancel tells the workers before it removes the waiting job (§7.3, §21.2.1)', async () => {
    // A server of its own: the monitor sees every command the server runs.
    const own = await startRedis({ owned: true });
    const keys = createKeys(uniquePrefix('dispatch'));
    const connection = createRedis(own.url, FAIL_FAST_REDIS_OPTIONS);
    const dispatcher = new JobDispatcher(connection, keys, log);
    const monitor = await monitorRedis(own.url);
    try {
      await dispatcher.enqueue(tool, { taskId: 'w1', tool: 'echo', arguments: {}, timeoutMs: 1000 });
      const jobKey = `${keys.bullPrefix}:${keys.queueName('default')}:w1`;
      await monitor.ready((marker) => connection.echo(marker));
      const from = monitor.commands.length;
      await dispatcher.cancel('w1', 'default', 'CLIENT_CANCELLED', undefined, false);
      await monitor.ready((marker) => connection.echo(marker));
      expect(await connection.exists(jobKey)).toBe(0);
      // BullMQ's remove is a script on the job's key (EVAL the first time, as the script is not loaded yet).
      const seen = monitor.commands
        .slice(from)
        .filter((c) => !c.fromLua)
        .map((c) =>
          c.name === 'publish' && c.args[0] === keys.cancelChannel
            ? 'publish'
            : (c.name === 'evalsha' || c.name === 'eval') && c.args.includes(jobKey)
              ? 'remove'
              : undefined,
        )
        .filter((c) => c !== undefined);
      expect(seen.slice(0, 2)).toEqual(['publish', 'remove']);
    } finally {
      monitor.close();
      await dispatcher.close();
      connection.disconnect();
      await own.stop();
    }
  });
  it('bullmq: addJobToTransaction records addPrioritizedJob with 9 keys and 3 arguments for the create script', async () => {
    const keys = createKeys(uniquePrefix('dispatch'));
    const connection = createRedis(server.url, FAIL_FAST_REDIS_OPTIONS);
    const dispatcher = new JobDispatcher(connection, keys, log);
    try {
      const job = await dispatcher.prepare(tool, { taskId: 'k', tool: 'echo', arguments: {}, timeoutMs: 1000 });
      expect(job?.keys).toHaveLength(ADD_PRIORITIZED_JOB_KEYS);
      expect(job?.keys).toContain(`${keys.bullPrefix}:${keys.queueName('default')}:prioritized`);
      expect(job?.args).toHaveLength(3);
    } finally {
      await dispatcher.close();
      connection.disconnect();
    }
  });
});
