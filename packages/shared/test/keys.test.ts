import { describe, expect, it } from 'vitest';
import { createKeys, toolPool } from '../src/keys.js';

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
