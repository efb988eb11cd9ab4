import { describe, expect, it } from 'vitest';
import { createKeys, toolPool } from '../src/protocol/keys.js';

describe('key naming', () => {
  it('puts every key and channel under the prefix', () => {
    const k = createKeys('{acme}');
    const names = [
      k.task('t1'),
      k.principalTasks('alice'),
      k.workers,
      k.workerCatalog('w1'),
      k.live,
      k.reaperLease,
      k.idempotency('alice', 'k1'),
      k.gatewayChannel('g1'),
      k.cancelChannel,
      k.bullJobLock('default', 'j1'),
    ];
    for (const name of names) expect(name.startsWith('{acme}:')).toBe(true);
    expect(k.bullPrefix).toBe('{acme}');
  });

  it('defaults to taskrelay and keeps principals from forging other keys', () => {
    const k = createKeys();
    expect(k.task('abc')).toBe('taskrelay:task:abc');
    expect(k.principalTasks('a:b c')).toBe('taskrelay:principal:a%3Ab%20c:tasks');
  });

  it('builds the gateway channel, task key and BullMQ keys from the prefixes the Lua scripts append to', () => {
    const k = createKeys('p');
    expect(k.gatewayChannel('g')).toBe(`${k.gatewayChannelPrefix}g${k.gatewayChannelSuffix}`);
    expect(k.task('t')).toBe(`${k.taskKeyPrefix}t`);
    expect(k.bullJobLock('default', 'j')).toBe(`${k.bullQueueKeyPrefix}default:j:lock`);
    expect(`${k.bullPrefix}:${k.queueName('default')}`).toBe(`${k.bullQueueKeyPrefix}default`);
  });

  it('keeps principals and idempotency keys from forging other keys', () => {
    const k = createKeys('p');
    expect(k.idempotency('a:b', 'x:y')).toBe('p:idem:a%3Ab:x%3Ay');
  });
});

describe('tool pools (PROTOCOL.md §3.2)', () => {
  it('gives workers with the same tool names one pool, whatever their order', () => {
    expect(toolPool('default', ['b', 'a'])).toBe(toolPool('default', ['a', 'b']));
    expect(toolPool('default', ['a', 'b'])).toMatch(/^default\.[0-9a-f]{12}$/);
  });

  it('gives another tool set, or another queue name, another pool', () => {
    expect(toolPool('default', ['a'])).not.toBe(toolPool('default', ['a', 'b']));
    expect(toolPool('default', ['a'])).not.toBe(toolPool('team', ['a']));
    // A new version of a tool is a new pool (PROTOCOL.md §24.9); the Python worker names it alike.
    expect(toolPool('default', [{ name: 'a', version: '1' }])).not.toBe(
      toolPool('default', [{ name: 'a', version: '2' }]),
    );
    expect(toolPool('default', [{ name: 'a' }])).toBe(toolPool('default', ['a']));
    expect(toolPool('default', [{ name: 'train', version: 'v1' }, { name: 'b' }])).toBe('default.629d9ad52315');
  });
});

describe('key layouts (PROTOCOL.md §1.1)', () => {
  /** Every name the single layout builds: an existing deployment's keys, which must never move. */
  function everyName(k: ReturnType<typeof createKeys>): string[] {
    const batch = k.batch('t');
    const output = k.output('t');
    const slots = k.toolLimit('slots', 's', 'd');
    const rate = k.toolLimit('rate', 's', 'd');
    return [
      k.task('t'),
      k.taskKeyPrefix,
      k.taskArguments('t'),
      k.taskLogs('t'),
      k.principalTasks('a b'),
      k.live,
      k.taskIndex,
      k.audit,
      k.retention,
      k.reaperLease,
      k.requestStateKey,
      k.waitpointKey,
      k.publicUrl,
      k.idempotency('a', 'i'),
      k.workers,
      k.workerCatalog('w'),
      k.pools,
      k.protocol,
      k.gatewayChannel('g'),
      k.cancelChannel,
      k.bullPrefix,
      k.queueName('q'),
      k.bullQueueKeyPrefix,
      k.bullJobLock('q', 'j'),
      k.principalOpenTasks('a'),
      k.rateLimitPrefix('calls'),
      k.webhooks.event('e'),
      k.webhooks.eventPrefix,
      k.webhooks.due,
      k.webhooks.pending,
      k.webhooks.dead,
      k.dedupe('a', 'task', 'tool', 'd'),
      k.fairShare('q', 'a'),
      k.schedule('s'),
      k.scheduleIndex,
      k.firingsQueue,
      k.versionWait('t'),
      slots.a,
      slots.b,
      rate.a,
      rate.b,
      batch.hash,
      batch.items,
      batch.outcomes,
      batch.open,
      batch.running,
      output.text,
      output.blobs,
      output.blob('b'),
      k.principalBlobBytes('a'),
      k.resourcesChannel,
    ];
  }

  it('keeps every key of the single layout byte for byte as it was', () => {
    const k = createKeys('{p}');
    expect(k.layout).toBe('single');
    expect(everyName(k)).toEqual([
      '{p}:task:t',
      '{p}:task:',
      '{p}:task-args:t',
      '{p}:task-logs:t',
      '{p}:principal:a%20b:tasks',
      '{p}:live',
      '{p}:index:tasks',
      '{p}:audit',
      '{p}:config:retention',
      '{p}:reaper:lease',
      '{p}:request-state-key',
      '{p}:waitpoint-key',
      '{p}:config:public-url',
      '{p}:idem:a:i',
      '{p}:workers',
      '{p}:worker:w:catalog',
      '{p}:pools',
      '{p}:protocol',
      '{p}:gateway:g:events',
      '{p}:cancel',
      '{p}',
      'q-q',
      '{p}:q-',
      '{p}:q-q:j:lock',
      '{p}:principal:a:open',
      '{p}:ratelimit:calls',
      '{p}:webhook:e',
      '{p}:webhook:',
      '{p}:webhooks:due',
      '{p}:webhooks:pending',
      '{p}:webhooks:dead',
      '{p}:dedupe:a:task:tool:d',
      '{p}:fair:q:a',
      '{p}:schedule:s',
      '{p}:schedule-index',
      'firings',
      '{p}:version-wait:t',
      '{p}:limit:slots:s:d',
      '{p}:limit:slots:s:d:waiting',
      '{p}:limit:rate:s:d',
      '{p}:limit:rate:s:d:hold',
      '{p}:batch:t',
      '{p}:batch:t:items',
      '{p}:batch:t:outcomes',
      '{p}:batch:t:open',
      '{p}:batch:t:running',
      '{p}:output:t',
      '{p}:blobs:t',
      '{p}:blob:t:b',
      '{p}:principal:a:blob-bytes',
      '{p}:resources',
    ]);
    // A task id names no shard here: every task's keys are these.
    expect(k.forTask('abcd0123')).toBe(k);
    expect(k.shardOf('abcd0123')).toBeUndefined();
  });

  it('puts a task and everything its scripts touch with it under the shard its id names', () => {
    const k = createKeys('p', 'sharded');
    const id = 'beef' + '0'.repeat(32);
    expect(k.shardOf(id)).toBe('beef');
    expect(k.shardOf(`${id}.3`)).toBe('beef');
    const t = k.forTask(id);
    expect(t).toBe(k.forShard('beef'));
    for (const name of [
      t.task(id),
      t.taskArguments(id),
      t.taskLogs(id),
      t.live,
      t.taskIndex,
      t.principalTasks('a'),
      t.principalOpenTasks('a'),
      t.idempotency('a', 'i'),
      t.dedupe('a', 'task', 'x', 'd'),
      t.fairShare('q', 'a'),
      t.bullJobLock('q', id),
      t.webhooks.due,
      t.webhooks.event('e'),
      t.retention,
      t.reaperLease,
      t.batch(id).hash,
      t.output(id).blob('b'),
      t.principalBlobBytes('a'),
      `${t.bullPrefix}:${t.queueName('q')}`,
    ]) {
      expect(name.startsWith('p:{beef}:')).toBe(true);
    }
    // Deployment-wide keys stay home, whichever shard's keys name them.
    for (const keys of [k, t]) {
      for (const name of [keys.workers, keys.pools, keys.protocol, keys.audit, keys.placement]) {
        expect(name.startsWith('p:{home}:')).toBe(true);
      }
    }
    // The gateway and resources channels are per shard (§1.2): the scripts of a shard's tasks publish them with
    // SPUBLISH in their own slot; the home one carries the acks gateways send one another.
    expect(k.gatewayChannel('g')).toBe('p:{home}:gateway:g:events');
    expect(t.gatewayChannel('g')).toBe('p:{beef}:gateway:g:events');
    expect(`${t.gatewayChannelPrefix}g${t.gatewayChannelSuffix}`).toBe('p:{beef}:gateway:g:events');
    expect(t.resourcesChannel).toBe('p:{beef}:resources');
    // The cancel channel is the tool shard's (§1.2): a cancel reaches only the workers of its tool.
    expect(t.cancelChannel).toBe('p:{beef}:cancel');
    expect(k.forShard('0a0a').cancelChannel).toBe('p:{0a0a}:cancel');
    // An id that names no shard is looked for at home, where no task is.
    expect(k.forTask('zz')).toBe(k);
    expect(k.shardOf('not-hex-id')).toBeUndefined();
  });
});
