/**
 * Every use the gateway makes of BullMQ's internals, in one place (issue 47 item 5), each with a test named for the
 * BullMQ behaviour it relies on (packages/gateway/test/bullmq-adapter.test.ts, and the dispatcher's integration test):
 * - BullMQ ships `addPrioritizedJob` as `dist/cjs/scripts/addPrioritizedJob-9.js`, its includes resolved, taking
 *   9 keys (the `-9`): the task's create script runs it in the same EVALSHA (PROTOCOL.md §10.1).
 * - `Queue.getBackend().addJobToTransaction` builds a job's add command (BullMQ's flow producer uses it), and
 *   `Job.validateOptions` checks its options as `Queue.add` does.
 * When either is missing or other than expected, jobs are added by `Queue.add` after the create (one round trip
 * more, nothing lost), and the dispatcher says so once, at warn.
 */
import { createRequire } from 'node:module';
import { Job, type Queue } from 'bullmq';
import type { JobData } from '@taskrelay/shared';

/** The keys BullMQ's `addPrioritizedJob` takes (the `-9` of its file name); the create script passes them on. */
export const ADD_PRIORITIZED_JOB_KEYS = 9;
/** Its ARGV: msgpacked arguments, the job data, msgpacked options. */
export const ADD_PRIORITIZED_JOB_ARGS = 3;
const ADD_PRIORITIZED_JOB_MODULE = `bullmq/dist/cjs/scripts/addPrioritizedJob-${ADD_PRIORITIZED_JOB_KEYS}.js`;

type LoadModule = (id: string) => unknown;

/**
 * BullMQ's `addPrioritizedJob` script, includes resolved, as the installed BullMQ ships it (the same source its
 * `Queue.add` runs); otherwise why not (then jobs are added by `Queue.add`).
 */
export function bullmqAddPrioritizedLua(
  load: LoadModule = createRequire(import.meta.url),
): { lua: string } | { missing: string } {
  let mod: { addPrioritizedJob?: { content?: unknown; keys?: unknown } };
  try {
    mod = load(ADD_PRIORITIZED_JOB_MODULE) as typeof mod;
  } catch (error) {
    return { missing: `${ADD_PRIORITIZED_JOB_MODULE} not found (${(error as Error).message})` };
  }
  const script = mod.addPrioritizedJob;
  if (typeof script?.content !== 'string') return { missing: `${ADD_PRIORITIZED_JOB_MODULE} has no script content` };
  if (script.keys !== ADD_PRIORITIZED_JOB_KEYS) {
    return { missing: `addPrioritizedJob takes ${String(script.keys)} keys, not ${ADD_PRIORITIZED_JOB_KEYS}` };
  }
  return { lua: script.content };
}

/** What BullMQ's Redis backend exposes to batch an add onto a caller's transaction (its flow producer uses it). */
interface AddToTransaction {
  addJobToTransaction(
    client: { runCommand(name: string, args: unknown[]): Promise<unknown> },
    job: unknown,
    jobId: string,
    parentKeyOpts?: { parentKey?: string; parentDependenciesKey?: string },
  ): Promise<unknown>;
}

/**
 * The add command BullMQ builds for a job (`Queue.add` with `opts`), recorded instead of run: its script's name and
 * its keys and arguments. A string says why there is none (this BullMQ's backend cannot lend it).
 */
export async function recordJobAdd(
  queue: Queue,
  name: string,
  data: JobData,
  opts: ConstructorParameters<typeof Job>[3],
): Promise<{ command: string; args: unknown[] } | string> {
  const backend = queue.getBackend() as unknown as Partial<AddToTransaction>;
  if (typeof backend.addJobToTransaction !== 'function') return 'the queue backend has no addJobToTransaction';
  const job = new Job(queue, name, data, opts, data.taskId);
  const json = job.asJSON();
  (job as unknown as { validateOptions(json: unknown): void }).validateOptions(json);
  let recorded: { command: string; args: unknown[] } | undefined;
  const recorder = {
    runCommand: (command: string, args: unknown[]) => {
      recorded = { command, args };
      return Promise.resolve(data.taskId);
    },
  };
  await backend.addJobToTransaction(recorder, json, data.taskId, { parentDependenciesKey: '' });
  return recorded ?? 'addJobToTransaction ran no command';
}
