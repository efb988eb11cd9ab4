#!/usr/bin/env node
// Prints the BullMQ queues a worker consumes, one per tool it serves (PROTOCOL.md §3.2: `<queue>~<tool>`), and for
// each the keys KEDA scales it on (deploy/k8s/worker-autoscaling.yaml): its prioritized set, where every job waits
// (each is added with its fair-share priority, PROTOCOL.md §25), its wait list, which holds only jobs put back, and its
// active list, the running ones. It also prints the worker's pool, the catalog's name for its tool set (§24).
// Usage, after `pnpm build`:
//   node scripts/pool-name.mjs [tools module] [--queue NAME] [--prefix PREFIX]
// Without a module: the demo tools.
import { resolve } from 'node:path';
import { pathToFileURL } from 'node:url';
import { parseArgs } from 'node:util';
import { createKeys, toolPool, toolQueue } from '@taskrelay/shared';
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
  tools.map((t) => ({ name: t.name, version: t.version })),
);
console.log(`pool (the catalog's name for this tool set): ${pool}`);
const prefix = createKeys(values.prefix).bullQueueKeyPrefix;
for (const tool of tools) {
  const queue = toolQueue(values.queue, tool.name);
  const queueKey = `${prefix}${queue}`;
  console.log(`queue ${queue}`);
  console.log(`  prioritized set (KEDA's main listName): ${queueKey}:prioritized`);
  console.log(`  wait list (jobs put back):              ${queueKey}:wait`);
  console.log(`  active list (running jobs):             ${queueKey}:active`);
}
