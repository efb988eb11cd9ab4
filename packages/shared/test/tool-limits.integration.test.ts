/**
 * PROTOCOL.md §3.5 against a real Redis: the scripts of the worker-admitted limits. A slot limit holds per key, a
 * holder renews, an expired holder's slot comes back, and a release answers the waiters with room, oldest first; a
 * rate limit allows at most `max` starts in any window (exactly), per key, and a hold stops every start.
 */
import { describe, expect, it } from 'vitest';
import { uniquePrefix } from '../../../test/helpers/redis.js';
import { useRedis } from '../../../test/helpers/use-redis.js';
import { createKeys } from '../src/protocol/keys.js';
import { StoreRunner } from '../src/store/store-runner.js';
import { ToolLimitStore, limitKeyDigest } from '../src/tool-limit-store.js';

const db = useRedis();

const store = () => {
  const keys = createKeys(uniquePrefix('limits'));
  return { keys, limits: new ToolLimitStore(new StoreRunner(db.redis, keys)) };
};
const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

describe('§3.5 slot limits', () => {
  it('holds per key: the second holder of a key waits, another key runs', async () => {
    const { limits } = store();
    const a = { tool: 't', key: 'acme', limit: 1 };
    expect(await limits.takeSlot(a, 'j1', 'q j1', 10_000)).toEqual({ ok: true });
    const refused = await limits.takeSlot(a, 'j2', 'q j2', 10_000);
    expect(refused.ok).toBe(false);
    expect(refused.ok === false && refused.waitMs).toBeGreaterThan(9_000);
    expect(await limits.takeSlot({ ...a, key: 'globex' }, 'j3', 'q j3', 10_000)).toEqual({ ok: true });
    // The holder renews; a peek with room takes nothing.
    expect(await limits.takeSlot(a, 'j1', 'q j1', 10_000)).toEqual({ ok: true });
    expect((await limits.takeSlot(a, 'j4', 'q j4', 10_000, 'peek')).ok).toBe(false);
    expect(await limits.takeSlot({ ...a, key: 'initech' }, 'j5', 'q j5', 10_000, 'peek')).toEqual({ ok: true });
    expect(await limits.takeSlot({ ...a, key: 'initech' }, 'j6', 'q j6', 10_000)).toEqual({ ok: true });
  });

  it('step 3: a waiter dropped by a releaser that found it active is back in line after its peek finds no room', async () => {
    const { limits, keys } = store();
    const l = { tool: 't', key: 'k', limit: 1 };
    await limits.takeSlot(l, 'h', 'q h', 10_000);
    expect((await limits.takeSlot(l, 'w', 'q w', 10_000)).ok).toBe(false);
    // h releases while w's run is still active (before its delayed move): the promotion fails and w leaves the line.
    expect(await limits.releaseSlot(l, 'h', 'q h')).toEqual(['q w']);
    await limits.dropWaiters(l, ['q w']);
    // A newcomer takes the room; then w, now delayed, peeks: no room, and it is back in line.
    expect(await limits.takeSlot(l, 'n', 'q n', 10_000)).toEqual({ ok: true });
    expect((await limits.takeSlot(l, 'w', 'q w', 10_000, 'peek')).ok).toBe(false);
    expect(await db.redis.zrange(keys.toolLimit('slots', 't', limitKeyDigest('k')).b, 0, -1)).toEqual(['q w']);
    // So the newcomer's release wakes it, instead of w sleeping to its delay's end.
    expect(await limits.releaseSlot(l, 'n', 'q n')).toEqual(['q w']);
  });

  it('answers the oldest waiters with room when a holder releases, and none twice', async () => {
    const { limits, keys } = store();
    const l = { tool: 't', key: 'k', limit: 2 };
    await limits.takeSlot(l, 'h1', 'q h1', 10_000);
    await limits.takeSlot(l, 'h2', 'q h2', 10_000);
    for (const w of ['w1', 'w2', 'w3']) expect((await limits.takeSlot(l, w, `q ${w}`, 10_000)).ok).toBe(false);
    // A waiter that asks again keeps its first place.
    await limits.takeSlot(l, 'w1', 'q w1', 10_000);
    expect(await limits.releaseSlot(l, 'h1', 'q h1')).toEqual(['q w1']);
    // w1 takes the room; the next release answers w2.
    expect(await limits.takeSlot(l, 'w1', 'q w1', 10_000)).toEqual({ ok: true });
    expect(await limits.releaseSlot(l, 'h2', 'q h2')).toEqual(['q w2']);
    const waiting = keys.toolLimit('slots', 't', limitKeyDigest('k')).b;
    expect(await db.redis.zrange(waiting, 0, -1)).toEqual(['q w2', 'q w3']);
  });

  it('a renewal only renews a slot still held: one in flight when its run released takes nothing', async () => {
    const { limits } = store();
    const l = { tool: 't', key: 'k', limit: 1 };
    await limits.takeSlot(l, 'h', 'q h', 10_000);
    expect(await limits.takeSlot(l, 'h', 'q h', 10_000, 'renew')).toEqual({ ok: true });
    await limits.releaseSlot(l, 'h', 'q h');
    expect((await limits.takeSlot(l, 'h', 'q h', 10_000, 'renew')).ok).toBe(false);
    expect(await limits.takeSlot(l, 'next', 'q next', 10_000)).toEqual({ ok: true });
  });

  it('gives an expired holder’s slot back (a SIGKILLed run stops renewing)', async () => {
    const { limits } = store();
    const l = { tool: 't', key: 'k', limit: 1 };
    await limits.takeSlot(l, 'dead', 'q dead', 150);
    expect((await limits.takeSlot(l, 'next', 'q next', 10_000)).ok).toBe(false);
    await sleep(200);
    expect(await limits.takeSlot(l, 'next', 'q next', 10_000)).toEqual({ ok: true });
  });
});

describe('§3.5 rate limits', () => {
  it('allows at most max starts in any window, exactly, per key', async () => {
    const { limits } = store();
    const l = { scope: 'name:upstream', key: 'acme', max: 2, perMs: 300 };
    // Room for another after the first; the second fills the window until the first leaves it (§3.3's pacer).
    expect(await limits.takeStart(l, 's1')).toEqual({ ok: true, roomInMs: 0 });
    await sleep(100);
    const full = await limits.takeStart(l, 's2');
    expect(full.ok && full.roomInMs).toBeGreaterThan(100);
    expect(full.ok && full.roomInMs).toBeLessThanOrEqual(200);
    const refused = await limits.takeStart(l, 's3');
    // The oldest start leaves the window about 200 ms from now.
    expect(refused.ok).toBe(false);
    expect(refused.ok === false && refused.waitMs).toBeGreaterThan(100);
    expect(refused.ok === false && refused.waitMs).toBeLessThanOrEqual(300);
    expect(await limits.takeStart({ ...l, key: 'globex' }, 's4')).toEqual({ ok: true, roomInMs: 0 });
    await sleep(220);
    // s1 left the window, s2 has not: one more, not two.
    expect((await limits.takeStart(l, 's5')).ok).toBe(true);
    expect((await limits.takeStart(l, 's6')).ok).toBe(false);
  });

  it('a hold stops every start until it ends, and a shorter hold keeps the longer', async () => {
    const { limits } = store();
    const l = { scope: 'name:upstream', key: '', max: 100, perMs: 1_000 };
    await limits.hold(l, 400);
    await limits.hold(l, 50);
    const refused = await limits.takeStart(l, 's1');
    expect(refused.ok === false && refused.waitMs).toBeGreaterThan(300);
    await sleep(450);
    expect(await limits.takeStart(l, 's2')).toEqual({ ok: true, roomInMs: 0 });
  });
});
