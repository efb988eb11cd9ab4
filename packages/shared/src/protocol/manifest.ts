/**
 * What another language must honour, as data (PROTOCOL.md §29.2): the manifest the build writes for the Python worker.
 * Every key template is made by calling `createKeys` itself with placeholder arguments, so the templates cannot drift
 * from the keys the Node processes build; the message shapes are the zod schemas as JSON Schema (`z.toJSONSchema`).
 */
import { z } from 'zod';
import { BATCH_FIELDS } from './batch-fields.js';
import { ERROR_CODES, JSON_RPC } from './errors.js';
import { HOME_TAG, SHARD_CODE_LENGTH, batchChildId, createKeys, placementField, toolQueue, type Keys } from './keys.js';
import {
  MAX_TOOL_SHARDS,
  AckEventSchema,
  CancelRequestSchema,
  JobDataSchema,
  LogEventSchema,
  PoolCatalogSchema,
  ProgressEventSchema,
  StatusEventSchema,
  WorkerCatalogSchema,
} from './messages.js';
import { ResultCode } from './script-results.js';
import { TASK_FIELDS, TASK_FIELD_PREFIXES } from './task-fields.js';
import { CANCEL_REASONS, LOG_LEVELS, TASK_STATUSES } from './task-model.js';

/**
 * A placeholder while a template is made: control characters appear in no key, and `encodeURIComponent` turns them
 * into `%01…%02`, so a placeholder the key encodes is told from one it embeds as it is.
 */
const hole = (name: string) => `\u0001${name}\u0002`;
// eslint-disable-next-line no-control-regex -- the placeholders are control characters on purpose (above)
const RAW = /\u0001(\w+)\u0002/g;
const ENCODED = /%01(\w+)%02/g;

/** `<name>`: the value as it is; `<name:uri>`: the value as JavaScript's `encodeURIComponent` writes it. */
export function toTemplate(built: string): string {
  return built.replace(ENCODED, '<$1:uri>').replace(RAW, '<$1>');
}

/** Fills a template as another language does: one pass, so a value holding `<x>` is never filled again. */
export function fillTemplate(template: string, values: Readonly<Record<string, string>>): string {
  return template.replace(/<(\w+)(:uri)?>/g, (_, name: string, uri: string | undefined) => {
    const value = values[name];
    if (value === undefined) throw new Error(`key template ${template} needs <${name}>`);
    return uri ? encodeURIComponent(value) : value;
  });
}

type KeyName = Exclude<keyof Keys, 'layout' | 'forTask' | 'forShard' | 'shardOf' | 'prefix'>;

/**
 * Every key of `Keys`, by the name the manifest gives it, built with placeholders. `satisfies` makes a key added to
 * `Keys` and left out here a compile error. Objects of several keys (`batch`, `output`, `webhooks`, `toolLimit`) give
 * one template per member, named `<key>.<member>`.
 */
const KEY_BUILDERS = {
  task: (k) => ({ task: k.task(hole('taskId')) }),
  taskKeyPrefix: (k) => ({ taskKeyPrefix: k.taskKeyPrefix }),
  taskArguments: (k) => ({ taskArguments: k.taskArguments(hole('taskId')) }),
  taskLogs: (k) => ({ taskLogs: k.taskLogs(hole('taskId')) }),
  principalTasks: (k) => ({ principalTasks: k.principalTasks(hole('principal')) }),
  live: (k) => ({ live: k.live }),
  taskIndex: (k) => ({ taskIndex: k.taskIndex }),
  audit: (k) => ({ audit: k.audit }),
  adminSession: (k) => ({ adminSession: k.adminSession(hole('cookieDigest')) }),
  retention: (k) => ({ retention: k.retention }),
  reaperLease: (k) => ({ reaperLease: k.reaperLease }),
  requestStateKey: (k) => ({ requestStateKey: k.requestStateKey }),
  waitpointKey: (k) => ({ waitpointKey: k.waitpointKey }),
  publicUrl: (k) => ({ publicUrl: k.publicUrl }),
  idempotency: (k) => ({ idempotency: k.idempotency(hole('principal'), hole('key')) }),
  dedupe: (k) => ({ dedupe: k.dedupe(hole('principal'), hole('mode'), hole('tool'), hole('digest')) }),
  workers: (k) => ({ workers: k.workers }),
  workerCatalog: (k) => ({ workerCatalog: k.workerCatalog(hole('workerId')) }),
  pools: (k) => ({ pools: k.pools }),
  protocol: (k) => ({ protocol: k.protocol }),
  gatewayChannel: (k) => ({ gatewayChannel: k.gatewayChannel(hole('gatewayId')) }),
  gatewayChannelPrefix: (k) => ({ gatewayChannelPrefix: k.gatewayChannelPrefix }),
  gatewayChannelSuffix: (k) => ({ gatewayChannelSuffix: k.gatewayChannelSuffix }),
  gatewayBacklog: (k) => ({ gatewayBacklog: k.gatewayBacklog(hole('gatewayId')) }),
  gatewayBacklogPrefix: (k) => ({ gatewayBacklogPrefix: k.gatewayBacklogPrefix }),
  gatewayBacklogSuffix: (k) => ({ gatewayBacklogSuffix: k.gatewayBacklogSuffix }),
  cancelChannel: (k) => ({ cancelChannel: k.cancelChannel }),
  bullPrefix: (k) => ({ bullPrefix: k.bullPrefix }),
  queueName: (k) => ({ queueName: k.queueName(hole('queue')) }),
  bullQueueKeyPrefix: (k) => ({ bullQueueKeyPrefix: k.bullQueueKeyPrefix }),
  bullJobLock: (k) => ({ bullJobLock: k.bullJobLock(hole('queue'), hole('jobId')) }),
  principalOpenTasks: (k) => ({ principalOpenTasks: k.principalOpenTasks(hole('principal')) }),
  rateLimitPrefix: (k) => ({ rateLimitPrefix: k.rateLimitPrefix(hole('limit')) }),
  webhooks: (k) => ({
    'webhooks.event': k.webhooks.event(hole('eventId')),
    'webhooks.eventPrefix': k.webhooks.eventPrefix,
    'webhooks.due': k.webhooks.due,
    'webhooks.pending': k.webhooks.pending,
    'webhooks.dead': k.webhooks.dead,
  }),
  fairShare: (k) => ({ fairShare: k.fairShare(hole('queue'), hole('principal')) }),
  schedule: (k) => ({ schedule: k.schedule(hole('scheduleId')) }),
  scheduleIndex: (k) => ({ scheduleIndex: k.scheduleIndex }),
  firingsQueue: (k) => ({ firingsQueue: k.firingsQueue }),
  versionWait: (k) => ({ versionWait: k.versionWait(hole('taskId')) }),
  toolLimit: (k) => {
    const slots = k.toolLimit('slots', hole('scope'), hole('keyDigest'));
    const rate = k.toolLimit('rate', hole('scope'), hole('keyDigest'));
    return {
      'toolLimit.slots.a': slots.a,
      'toolLimit.slots.b': slots.b,
      'toolLimit.rate.a': rate.a,
      'toolLimit.rate.b': rate.b,
    };
  },
  slotWaitersBy: (k) => ({ slotWaitersBy: k.slotWaitersBy(hole('scope'), hole('keyDigest')) }),
  batchClaim: (k) => ({ batchClaim: k.batchClaim(hole('childId')) }),
  batch: (k) => {
    const b = k.batch(hole('taskId'));
    return {
      'batch.hash': b.hash,
      'batch.items': b.items,
      'batch.outcomes': b.outcomes,
      'batch.open': b.open,
      'batch.running': b.running,
    };
  },
  output: (k) => {
    const o = k.output(hole('taskId'));
    return { 'output.text': o.text, 'output.blobs': o.blobs, 'output.blob': o.blob(hole('blobId')) };
  },
  principalBlobBytes: (k) => ({ principalBlobBytes: k.principalBlobBytes(hole('principal')) }),
  resourcesChannel: (k) => ({ resourcesChannel: k.resourcesChannel }),
  placement: (k) => ({ placement: k.placement }),
  placementLease: (k) => ({ placementLease: k.placementLease }),
} satisfies Record<KeyName, (k: Keys) => Record<string, string>>;

function templatesOf(keys: Keys): Record<string, string> {
  const out: Record<string, string> = {};
  for (const build of Object.values<(k: Keys) => Record<string, string>>(KEY_BUILDERS)) {
    for (const [name, built] of Object.entries(build(keys))) out[name] = toTemplate(built);
  }
  return Object.fromEntries(Object.entries(out).sort(([a], [b]) => a.localeCompare(b)));
}

/**
 * The key templates of both layouts (PROTOCOL.md §1.1, §29.2). In `single` every template is under `<prefix>`; in
 * `sharded` a home key is under `<prefix>:{home}` and a shard key under `<prefix>:{<code>}`, `<code>` being the shard
 * code of the task id (its first `shardCodeLength` characters when they are lowercase hex) or of the tool shard.
 */
export function keyTemplates() {
  const prefix = hole('prefix');
  return {
    layouts: {
      single: templatesOf(createKeys(prefix, 'single')),
      sharded: templatesOf(createKeys(prefix, 'sharded').forShard(hole('code'))),
    },
    homeTag: HOME_TAG,
    shardCodeLength: SHARD_CODE_LENGTH,
    shardCodePattern: `^[0-9a-f]{${SHARD_CODE_LENGTH}}$`,
    names: {
      toolQueue: toTemplate(toolQueue(hole('queueName'), hole('tool'))),
      placementField: toTemplate(placementField(hole('queue'), hole('index') as unknown as number)),
      batchChildId: toTemplate(batchChildId(hole('parentId'), hole('index') as unknown as number)),
    },
  };
}

/** The message shapes another language reads or writes, as JSON Schema (draft 2020-12). */
export const MESSAGE_SCHEMAS = {
  jobData: JobDataSchema,
  cancelRequest: CancelRequestSchema,
  progressEvent: ProgressEventSchema,
  statusEvent: StatusEventSchema,
  ackEvent: AckEventSchema,
  logEvent: LogEventSchema,
  workerCatalog: WorkerCatalogSchema,
  poolCatalog: PoolCatalogSchema,
} as const;

export function messageSchemas(): Record<string, unknown> {
  const out: Record<string, Record<string, unknown>> = Object.fromEntries(
    Object.entries(MESSAGE_SCHEMAS).map(([name, schema]) => [
      name,
      // `unrepresentable: 'any'`: a `z.custom` becomes `{}`; `io: 'input'`: what a sender may write.
      z.toJSONSchema(schema, { unrepresentable: 'any', io: 'input' }) as Record<string, unknown>,
    ]),
  );
  // The job's `arguments` is a `z.custom` checked only to be an object (not null, not an array): say so in the schema.
  const jobData = out.jobData?.properties as Record<string, unknown> | undefined;
  if (jobData) jobData.arguments = { type: 'object' };
  return out;
}

/** Everything of the manifest but the scripts, the generation and the bullmq pair (the emitter adds those). */
export function protocolManifest() {
  return {
    keys: keyTemplates(),
    resultCodes: Object.fromEntries(Object.entries(ResultCode).filter(([, value]) => typeof value === 'number')),
    errorCodes: [...ERROR_CODES],
    jsonRpc: { ...JSON_RPC },
    fields: TASK_FIELDS,
    fieldPrefixes: TASK_FIELD_PREFIXES,
    batchFields: BATCH_FIELDS,
    taskStatuses: [...TASK_STATUSES],
    cancelReasons: [...CANCEL_REASONS],
    logLevels: [...LOG_LEVELS],
    limits: { maxToolShards: MAX_TOOL_SHARDS },
    messages: messageSchemas(),
  };
}
