import { describe, expect, it } from 'vitest';
import { createKeys } from '../src/keys.js';

describe('key naming', () => {
  it('puts every key and channel under the prefix', () => {
    const k = createKeys('{acme}');
    const names = [
      k.task('t1'),
      k.principalTasks('alice'),
      k.workers,
      k.workerCatalog('w1'),
      k.eventStream('s1'),
      k.statusChannel,
      k.gatewayProgressChannel('g1'),
      k.cancelChannel,
    ];
    for (const name of names) expect(name.startsWith('{acme}:')).toBe(true);
    expect(k.bullPrefix).toBe('{acme}');
  });

  it('defaults to taskrelay and keeps principals from forging other keys', () => {
    const k = createKeys();
    expect(k.task('abc')).toBe('taskrelay:task:abc');
    expect(k.principalTasks('a:b c')).toBe('taskrelay:principal:a%3Ab%20c:tasks');
  });

  it('builds the progress channel from the prefix the Lua script appends to', () => {
    const k = createKeys('p');
    expect(k.gatewayProgressChannel('g')).toBe(`${k.gatewayProgressChannelPrefix}g:progress`);
  });
});
