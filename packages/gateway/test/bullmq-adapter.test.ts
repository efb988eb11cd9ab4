/**
 * The BullMQ behaviours the gateway relies on (src/tasks/bullmq-adapter.ts), one test each, named for it; the add
 * command BullMQ records is pinned by the dispatcher's integration test (it needs a Redis).
 */
import { createRequire } from 'node:module';
import { PassThrough } from 'node:stream';
import { describe, expect, it } from 'vitest';
import { createKeys, createLogger, type RedisClient } from '@taskrelay/shared';
import { ADD_PRIORITIZED_JOB_KEYS, bullmqAddPrioritizedLua } from '../src/tasks/bullmq-adapter.js';
import { JobDispatcher } from '../src/tasks/job-dispatcher.js';
import type { CatalogTool } from '../src/tasks/catalog.js';

describe('bullmq-adapter', () => {
  it('bullmq: addPrioritizedJob-9 ships as a script of 9 keys, its includes resolved', () => {
    const shipped = createRequire(import.meta.url)('bullmq/dist/cjs/scripts/addPrioritizedJob-9.js') as {
      addPrioritizedJob: { keys: number; content: string };
    };
    expect(shipped.addPrioritizedJob.keys).toBe(9);
    expect(ADD_PRIORITIZED_JOB_KEYS).toBe(9);
    const loaded = bullmqAddPrioritizedLua();
    expect(loaded).toEqual({ lua: shipped.addPrioritizedJob.content });
    // Resolved: no include directive is left for Redis to choke on.
    expect(shipped.addPrioritizedJob.content).not.toMatch(/--- @include/);
  });

  it('says why there is no add script: not shipped, or of another key count', () => {
    const gone = bullmqAddPrioritizedLua(() => {
      throw new Error('Cannot find module');
    });
    expect(gone).toEqual({ missing: expect.stringContaining('not found') as string });
    const other = bullmqAddPrioritizedLua(() => ({ addPrioritizedJob: { keys: 10, content: 'return 1' } }));
    expect(other).toEqual({ missing: 'addPrioritizedJob takes 10 keys, not 9' });
  });

  it('a dispatcher without the add script logs it once, at warn, and leaves the add to Queue.add', async () => {
    const out = new PassThrough();
    const lines: Array<{ level: number; msg: string; reason?: string }> = [];
    out.on('data', (chunk: Buffer) => {
      for (const line of chunk.toString().split('\n').filter(Boolean)) lines.push(JSON.parse(line) as never);
    });
    const log = createLogger('test', { level: 'debug', destination: out });
    const connection = { defineCommand: () => undefined } as unknown as RedisClient;
    const dispatcher = new JobDispatcher(connection, createKeys('adapter'), log, {
      addScript: () => ({ missing: 'bullmq/dist/cjs/scripts/addPrioritizedJob-9.js not found' }),
    });
    const tool = { name: 'echo', queue: 'default' } as CatalogTool;
    for (let i = 0; i < 3; i++) {
      expect(await dispatcher.prepare(tool, { taskId: `t${i}`, tool: 'echo', arguments: {} })).toBeUndefined();
    }
    await new Promise((resolve) => setImmediate(resolve));
    const warned = lines.filter((line) => line.level === 40);
    expect(warned).toHaveLength(1);
    expect(warned[0]).toMatchObject({
      msg: 'BullMQ add not in the create script: jobs are added after it, by Queue.add',
      reason: 'bullmq/dist/cjs/scripts/addPrioritizedJob-9.js not found',
    });
  });
});
