/**
 * PROTOCOL.md §26.10, issue 45: batches in the sharded key layout, on a real 3-master Redis Cluster. The parent tool
 * (`fan_out`) runs on a worker that serves nothing else; its child tool (`shard_child`, `shards: 3`) runs on two other
 * workers, over three shards the placement puts on the three masters. Child `i` queues on shard `i mod 3`; the
 * aggregate is exact with each child counted once; a cancel of the parent reaches every running child on its own
 * shard's channel (the children's workers' cancel sweep is 10 minutes here, so only the SPUBLISH can stop them in
 * time); fail-fast stops the rest.
 */
import { writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, expect } from 'vitest';
import { ROOT } from './helpers/processes.js';
import { nodeShardChild, shardedParentChecks } from './helpers/sharded-batch.js';
import { useStack } from './helpers/stack.js';

const TRACE = join(tmpdir(), `taskrelay-batch-sharded-${process.pid}-${Date.now()}.trace`);
writeFileSync(TRACE, '');
/** A gate file nobody makes: children waiting on it run until they are stopped. */
const NEVER = join(tmpdir(), `taskrelay-batch-sharded-never-${process.pid}`);
const child = nodeShardChild(TRACE);

const stack = useStack({
  name: 'batch-sharded',
  cluster: { braces: false },
  workers: [
    { TASKRELAY_TOOLS: `${ROOT}/test/fixtures/shard-batch-parent.mjs`, WORKER_CONCURRENCY: '4', LOG_LEVEL: 'info' },
    child,
    child,
  ],
  mcp: true,
  hookTimeoutMs: 180_000,
});

describe('§26.10 batches in the sharded layout', () => {
  shardedParentChecks({
    stack,
    parentTool: 'fan_out',
    children: () => stack.workers.slice(1),
    trace: TRACE,
    never: NEVER,
    // Child 7's result is over the stored 16 KiB: it is kept by reference in its parent's blobs (§34.3), a write the
    // child makes under its lock, which is on its own shard.
    big: true,
    aggregate: async (taskId, { redis, keys }) => {
      const seventh = JSON.parse((await redis.hget(keys.forTask(taskId).batch(taskId).outcomes, '7')) ?? '{}') as {
        result?: { content?: Array<{ type: string }> };
      };
      expect(seventh.result?.content?.some((block) => block.type === 'resource_link')).toBe(true);
    },
  });
});
