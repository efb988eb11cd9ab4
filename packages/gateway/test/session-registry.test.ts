/**
 * PROTOCOL.md §22.2: under memory pressure, idle sessions are closed from the principal that holds the most first,
 * never by one least-recently-seen order across principals (there, carol's and dave's new sessions evicted 156 of
 * alice's and bob's 200 idle sessions).
 */
import { describe, expect, it } from 'vitest';
import { createLogger } from '@taskrelay/shared';
import { SessionRegistry, type Session } from '../src/app/session-registry.js';
import { GatewayMetrics } from '../src/metrics/gateway-metrics.js';
import { SessionEventStore } from '../src/transports/session/event-store.js';

function registry(): SessionRegistry {
  return new SessionRegistry({
    idleMs: 60_000,
    maxPerPrincipal: 0,
    metrics: new GatewayMetrics(),
    log: createLogger('gateway', { level: 'silent' }),
    onClosed: () => undefined,
  });
}

function session(principal: string, lastSeenAt: number, open = 0): Session {
  return {
    principal,
    lastSeenAt,
    openResponses: open,
    events: new SessionEventStore({ ttlMs: 60_000 }),
    transport: { close: () => Promise.resolve() } as unknown as Session['transport'],
    server: {} as Session['server'],
  };
}

const principals = (r: SessionRegistry, ids: string[]) =>
  ids.filter((id) => r.get(id, id.split('-')[0] ?? '') !== undefined).map((id) => id.split('-')[0]);

describe('session eviction under memory pressure', () => {
  it('closes the idle sessions of the principal holding the most first, oldest of them first', () => {
    const r = registry();
    const ids: string[] = [];
    // alice and bob: 100 idle sessions each, seen long ago.
    for (const p of ['alice', 'bob']) {
      for (let i = 0; i < 100; i++) {
        r.add(`${p}-${i}`, session(p, 1_000 + i));
        ids.push(`${p}-${i}`);
      }
    }
    // carol opens 150 sessions, recently: under a budget of 300 sessions, the 50 over it must be hers.
    for (let i = 0; i < 150; i++) {
      r.add(`carol-${i}`, session('carol', 10_000 + i));
      ids.push(`carol-${i}`);
    }
    expect(r.evictIdle(() => r.size <= 300)).toBe(true);
    const left = principals(r, ids);
    expect(left.filter((p) => p === 'alice')).toHaveLength(100);
    expect(left.filter((p) => p === 'bob')).toHaveLength(100);
    expect(left.filter((p) => p === 'carol')).toHaveLength(100);
    // Hers went oldest first.
    expect(r.get('carol-0', 'carol')).toBeUndefined();
    expect(r.get('carol-149', 'carol')).toBeDefined();
  });

  it('never closes a session with an open response, and says when it could not make room', () => {
    const r = registry();
    r.add('dave-0', session('dave', 1, 1));
    r.add('erin-0', session('erin', 2, 0));
    expect(r.evictIdle(() => r.size === 0)).toBe(false);
    expect(r.get('dave-0', 'dave')).toBeDefined();
    expect(r.get('erin-0', 'erin')).toBeUndefined();
  });
});

describe('relieving one principal under memory pressure (the gateway’s relieve loop)', () => {
  it('closes its least recently seen idle session first, then halves its largest event store, never others’', () => {
    const r = registry();
    const busy = session('alice', 1, 1);
    for (let i = 0; i < 100; i++) busy.events.storeJson('s', 'x'.repeat(10_000));
    r.add('alice-busy', busy);
    r.add('alice-idle', session('alice', 2));
    const bob = session('bob', 0);
    for (let i = 0; i < 10; i++) bob.events.storeJson('s', 'y'.repeat(10_000));
    r.add('bob-idle', bob);
    expect(r.heldByPrincipal().get('alice')).toBeGreaterThan(r.heldByPrincipal().get('bob') ?? 0);
    expect(r.relieveFrom('alice')).toBe(true);
    expect(r.get('alice-idle', 'alice')).toBeUndefined();
    const before = busy.events.bytes;
    expect(r.relieveFrom('alice')).toBe(true);
    expect(busy.events.bytes).toBeLessThanOrEqual(before / 2);
    expect(r.get('alice-busy', 'alice')).toBeDefined();
    expect(r.get('bob-idle', 'bob')).toBeDefined();
    expect(bob.events.bytes).toBeGreaterThan(0);
    while (r.relieveFrom('alice'));
    expect(busy.events.bytes).toBe(0);
    expect(r.relieveFrom('alice')).toBe(false);
  });
});
