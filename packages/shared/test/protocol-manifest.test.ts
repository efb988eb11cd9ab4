import { describe, expect, it } from 'vitest';
import { createKeys, type Keys } from '../src/protocol/keys.js';
import { fillTemplate, keyTemplates, protocolManifest } from '../src/protocol/manifest.js';

/** Inputs with what encodeURIComponent changes (space, `/`, `:`, `@`, non-ASCII) and a `<` a one-pass fill keeps. */
const V = {
  taskId: 'a1b2c3d4e5f60718293a4b5c6d7e8f901234',
  principal: 'alice@example.com/ops:x y<z>é',
  key: 'idem key/1',
  mode: 'task',
  tool: 'slow tool',
  digest: 'd1',
  workerId: 'w-1',
  gatewayId: 'g-1',
  queue: 'default~echo',
  jobId: 'a1b2c3d4e5f60718293a4b5c6d7e8f901234.3',
  limit: 'calls',
  eventId: 'msg_x_1',
  scheduleId: 's1',
  scope: 'shared/limit x',
  keyDigest: 'kd',
  blobId: 'b1',
  cookieDigest: 'cd',
};

function built(k: Keys): Record<string, string> {
  const slots = k.toolLimit('slots', V.scope, V.keyDigest);
  const rate = k.toolLimit('rate', V.scope, V.keyDigest);
  return {
    task: k.task(V.taskId),
    principalTasks: k.principalTasks(V.principal),
    idempotency: k.idempotency(V.principal, V.key),
    dedupe: k.dedupe(V.principal, V.mode, V.tool, V.digest),
    bullJobLock: k.bullJobLock(V.queue, V.jobId),
    fairShare: k.fairShare(V.queue, V.principal),
    workers: k.workers,
    gatewayChannel: k.gatewayChannel(V.gatewayId),
    cancelChannel: k.cancelChannel,
    'toolLimit.slots.b': slots.b,
    'toolLimit.rate.b': rate.b,
    slotWaitersBy: k.slotWaitersBy(V.scope, V.keyDigest),
    'output.blob': k.output(V.taskId).blob(V.blobId),
    'batch.running': k.batch(V.taskId).running,
    'webhooks.due': k.webhooks.due,
    placement: k.placement,
    bullPrefix: k.bullPrefix,
    live: k.live,
  };
}

describe('protocol manifest (PROTOCOL.md §29.2)', () => {
  const templates = keyTemplates();

  it('fills every single-layout template to the key createKeys builds', () => {
    for (const prefix of ['taskrelay', '{tr}', 'a:b']) {
      const keys = createKeys(prefix, 'single');
      for (const [name, key] of Object.entries(built(keys))) {
        expect(fillTemplate(templates.layouts.single[name] ?? '', { ...V, prefix }), name).toBe(key);
      }
    }
  });

  it("fills every sharded template to the key of the task's shard, home keys under {home}", () => {
    const keys = createKeys('tr', 'sharded');
    const code = V.taskId.slice(0, templates.shardCodeLength);
    for (const [name, key] of Object.entries(built(keys.forTask(V.taskId)))) {
      expect(fillTemplate(templates.layouts.sharded[name] ?? '', { ...V, prefix: 'tr', code }), name).toBe(key);
    }
    expect(templates.layouts.sharded.workers).toBe('<prefix>:{home}:workers');
    expect(templates.layouts.sharded.task).toBe('<prefix>:{<code>}:task:<taskId>');
  });

  it('has one template per key of both layouts and the same names in each', () => {
    expect(Object.keys(templates.layouts.sharded)).toEqual(Object.keys(templates.layouts.single));
    for (const template of Object.values(templates.layouts.single)) {
      expect(template).not.toContain('\u0001');
      expect(template).not.toMatch(/%0[12]/);
    }
  });

  it('carries the error codes, the result codes and the message shapes as JSON Schema', () => {
    const manifest = protocolManifest();
    expect(manifest.errorCodes).toContain('NON_RETRYABLE');
    expect(manifest.resultCodes.LOCK_LOST).toBe(-2);
    expect(manifest.messages.cancelRequest).toMatchObject({ type: 'object', required: ['taskId', 'reason'] });
    expect(manifest.messages.jobData).toMatchObject({ required: ['taskId', 'tool', 'arguments'] });
  });
});
