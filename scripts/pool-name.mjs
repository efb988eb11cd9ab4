#!/usr/bin/env node
// Prints the worker pool (BullMQ queue) a worker joins and the BullMQ keys KEDA scales it on
// (deploy/k8s/worker-autoscaling.yaml): its prioritized set, where every job waits (each is added with its fair-share
// priority, PROTOCOL.md §25), and its wait list, which holds only jobs put back after a worker died. Usage, after `pnpm build`:
//   node scripts/pool-name.mjs [tools module] [--queue NAME] [--prefix PREFIX]
// Without a module: the demo tools. The pool is the queue name plus a digest of the tool names (PROTOCOL.md §3.2).
import { resolve } from 'node:path';
import { pathToFileURL } from 'node:url';
import { parseArgs } from 'node:util';
import { createKeys, toolPool } from '@taskrelay/shared';
import { demoTools, isToolDefinition } from '@taskrelay/worker';

const { values, positionals } = parseArgs({
  allowPositionals: true,
  options: { queue: { type: 'string', default: 'default' }, prefix: { type: 'string', default: 'taskrelay' } },
});
const tools = positionals[0]
  ? Object.values(await import(pathToFileURL(resolve(positionals[0])).href)).filter(isToolDefinition)
  : demoTools;
const pool = toolPool(
  values.queue,
  tools.map((t) => t.name),
);
console.log(`pool:      ${pool}`);
const queueKey = `${createKeys(values.prefix).bullQueueKeyPrefix}${pool}`;
console.log(`prioritized set (KEDA's main listName): ${queueKey}:prioritized`);
console.log(`wait list (jobs put back after a crash): ${queueKey}:wait`);
