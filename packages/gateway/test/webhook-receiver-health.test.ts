import { describe, expect, it } from 'vitest';
import { ReceiverHealth, SUSPECT_TIMEOUT_MS, receiverOf } from '../src/tasks/webhooks/receiver-health.js';

describe('§27.3 a circuit per receiver', () => {
  it('names a receiver by its lower-cased scheme and authority, whatever the path', () => {
    expect(receiverOf('https://Hooks.Example.com:8443/a/b?c=1#d')).toBe('https://hooks.example.com:8443');
    expect(receiverOf('http://127.0.0.1:9/h')).toBe(receiverOf('HTTP://127.0.0.1:9/other'));
    expect(receiverOf('http://[::1]:80/x')).toBe('http://[::1]:80');
  });

  it('a failure opens the circuit for the backoff; at its end one probe with the short deadline; an answer closes it', () => {
    let now = 1_000;
    const health = new ReceiverHealth(
      { timeoutMs: 10_000, retryMaxMs: 60_000 },
      (n) => 1_000 * 2 ** (n - 1),
      () => now,
    );
    const r = 'http://a:1';
    expect(health.timeoutFor(r)).toBe(10_000);
    // Four tries in flight together (it answered before) all time out: one failure, not four.
    health.started(r);
    health.ended(r, { kind: 'answered' });
    for (let i = 0; i < 4; i++) health.started(r);
    expect(health.trusted()).toEqual(new Set([r]));
    for (let i = 0; i < 4; i++) health.ended(r, { kind: 'failed', why: 'no answer within 10000 ms' });
    expect(health.blocked()).toEqual({ [r]: 2_000 });
    expect(health.timeoutFor(r)).toBe(SUSPECT_TIMEOUT_MS);
    now = 2_000;
    expect(health.blocked()).toEqual({ [r]: -1 });
    health.started(r);
    expect(health.blocked()).toEqual({ [r]: 0 });
    expect(health.suspectInFlight()).toBe(1);
    // The probe fails too: open again, twice as long.
    health.ended(r, { kind: 'failed', why: 'no answer within 2000 ms' });
    expect(health.blocked()).toEqual({ [r]: 4_000 });
    expect(health.lastError(r)).toBe('no answer within 2000 ms');
    now = 4_000;
    health.started(r);
    health.ended(r, { kind: 'answered' });
    expect(health.blocked()).toEqual({});
    expect(health.timeoutFor(r)).toBe(10_000);
  });

  it('slow start: a receiver that has not answered yet has one try at a time; an answer trusts it, a failure ends that', () => {
    const health = new ReceiverHealth(
      { timeoutMs: 10_000, retryMaxMs: 60_000 },
      () => 1_000,
      () => 0,
    );
    const r = 'http://new:1';
    expect(health.blocked()).toEqual({});
    health.started(r);
    // Its first try in flight: its other events stay due, untouched, and it is not trusted with more.
    expect(health.blocked()).toEqual({ [r]: 0 });
    expect(health.trusted()).toEqual(new Set());
    health.ended(r, { kind: 'answered' });
    expect(health.blocked()).toEqual({});
    health.started(r);
    expect(health.blocked()).toEqual({});
    expect(health.trusted()).toEqual(new Set([r]));
    // A try that says nothing of the receiver (the drain stopped it) changes nothing.
    health.started(r);
    health.ended(r, { kind: 'neither' });
    expect(health.trusted()).toEqual(new Set([r]));
    health.ended(r, { kind: 'failed', why: 'no answer within 10000 ms' });
    expect(health.blocked()).toEqual({ [r]: 1_000 });
    // A failure takes the trust back: once it answers a probe it is closed, and trusted again from its next try on.
    health.started(r);
    expect(health.trusted()).toEqual(new Set());
    health.ended(r, { kind: 'answered' });
    expect(health.blocked()).toEqual({});
    health.started(r);
    expect(health.trusted()).toEqual(new Set([r]));
  });
});
