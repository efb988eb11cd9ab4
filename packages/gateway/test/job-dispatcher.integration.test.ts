import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import getPort from 'get-port';
import { Redis } from 'ioredis';
import { FAIL_FAST_REDIS_OPTIONS, createKeys, createLogger, createRedis, type TaskrelayError } from '@taskrelay/shared';
import { startRedis, uniquePrefix, type TestRedis } from '../../../test/helpers/redis.js';
import { JobDispatcher } from '../src/tasks/job-dispatcher.js';
import { toMcpError } from '../src/wire/errors.js';
import type { CatalogTool } from '../src/tasks/catalog.js';

let server: TestRedis;
let redis: Redis;
const log = createLogger('test', { level: 'silent' });
const tool: CatalogTool = {
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
});
