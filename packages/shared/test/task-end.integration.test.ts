/**
 * A task's end at the store (PROTOCOL.md §10.1, §34.6, issue 46): the keys that end with the task (its output, stored
 * values and kept log lines) expire with it once a run wrote any, which the task's `sideKeys` field records; a task
 * that wrote none has the field unset, so its end looks at no such key. Real Redis.
 */
import { Redis } from 'ioredis';
import { describe, expect, it } from 'vitest';
import { uniquePrefix } from '../../../test/helpers/redis.js';
import { useRedis } from '../../../test/helpers/use-redis.js';
import { createKeys } from '../src/protocol/keys.js';
import { TASK_FIELDS } from '../src/protocol/task-fields.js';
import { TaskStore } from '../src/store/task-store.js';
import { terminalRecord } from '../src/store/task-codec.js';
import { GatewayEventSchema } from '../src/protocol/messages.js';
import { DEFAULT_OUTPUT_LIMITS, TaskOutputStore } from '../src/task-output.js';

const db = useRedis();

function setup(label: string) {
  const keys = createKeys(uniquePrefix(label));
  const store = new TaskStore(db.redis, keys, { reaperIntervalMs: 0 });
  return { keys, store, output: new TaskOutputStore(store.runner) };
}

const base = {
  tool: 'build_report',
  queue: 'default',
  principal: 'alice',
  mode: 'task' as const,
  ttl: 30_000,
  pollInterval: 1000,
  gatewayId: 'g1',
};

/** Milliseconds a key has left: between 0 and the task's ttl means it goes with the task. */
async function goesWithTask(key: string): Promise<void> {
  const left = await db.redis.pttl(key);
  expect(left, key).toBeGreaterThan(0);
  expect(left, key).toBeLessThanOrEqual(base.ttl);
}

describe('§10.1 a task’s end and the keys that end with it', () => {
  it('lets the output, stored values and kept log lines a run wrote go with the task', async () => {
    const { store, keys, output } = setup('side');
    const { taskId } = await store.records.create(base);
    expect(await db.redis.hget(keys.task(taskId), TASK_FIELDS.sideKeys)).toBeNull();
    await output.writeOutput(taskId, 'append', 'line 1\n', undefined);
    await output.putBlobChunk({
      taskId,
      principal: base.principal,
      blobId: 'b1',
      chunk: Buffer.from('bytes'),
      first: true,
      meta: { name: 'b1.txt', mimeType: 'text/plain', text: true, kind: 'artifact' },
      lock: undefined,
      notify: false,
    });
    await store.logs.keep(taskId, [JSON.stringify({ msg: 'hello' })]);
    expect(await db.redis.hget(keys.task(taskId), TASK_FIELDS.sideKeys)).toBe('1');
    // Their own TTL (a day by default) is longer than the task's: the end brings each down to the task's.
    const o = keys.output(taskId);
    for (const key of [o.text, o.blobs, o.blob('b1'), keys.taskLogs(taskId)]) {
      expect(await db.redis.pttl(key), key).not.toBe(-2);
    }
    expect((await store.runs.transition(taskId, 'completed', { result: { content: [] } })).ok).toBe(true);
    for (const key of [keys.task(taskId), o.text, o.blobs, o.blob('b1'), keys.taskLogs(taskId)]) {
      await goesWithTask(key);
    }
  });

  it('marks a task by a log line alone, and not by a write refused at a bound', async () => {
    const { store, keys } = setup('logs');
    const { taskId } = await store.records.create(base);
    await store.logs.keep(taskId, [JSON.stringify({ msg: 'only a log' })]);
    await store.runs.transition(taskId, 'failed', { error: { code: 'TOOL_FAILED', message: 'x' } });
    await goesWithTask(keys.taskLogs(taskId));

    const small = new TaskOutputStore(store.runner, { ...DEFAULT_OUTPUT_LIMITS, maxTaskBytes: 2 });
    const other = await store.records.create(base);
    await expect(
      small.putBlobChunk({
        taskId: other.taskId,
        principal: base.principal,
        blobId: 'big',
        chunk: Buffer.from('too many bytes'),
        first: true,
        meta: { name: 'big.txt', mimeType: 'text/plain', text: true, kind: 'artifact' },
        lock: undefined,
        notify: false,
      }),
    ).rejects.toThrow(/at most 2 bytes/);
    expect(await db.redis.hget(keys.task(other.taskId), TASK_FIELDS.sideKeys)).toBeNull();
  });

  it('ends a task that wrote nothing but its hash: kept its ttl, out of the live set, watchers dropped', async () => {
    const { store, keys } = setup('bare');
    const { taskId } = await store.records.create({ ...base, argumentsJson: '{"n":1}' });
    await store.records.watch(taskId, 'g2');
    expect(await db.redis.hget(keys.task(taskId), TASK_FIELDS.watchers)).toBe('g2');
    expect((await store.runs.transition(taskId, 'completed', { result: { content: [] } })).ok).toBe(true);
    await goesWithTask(keys.task(taskId));
    await goesWithTask(keys.taskArguments(taskId));
    expect(await db.redis.zscore(keys.live, taskId)).toBeNull();
    expect(await db.redis.hget(keys.task(taskId), TASK_FIELDS.watchers)).toBeNull();
    expect(await db.redis.hget(keys.task(taskId), TASK_FIELDS.sideKeys)).toBeNull();
  });

  it('publishes a terminal event with the outcome as JSON values, the stored text written in place (§6.7)', async () => {
    const { store, keys } = setup('outcome');
    const { taskId } = await store.records.create(base);
    const subscriber = new Redis(db.server.url);
    try {
      const heard: string[] = [];
      subscriber.on('message', (_channel: string, message: string) => heard.push(message));
      await subscriber.subscribe(keys.gatewayChannel(base.gatewayId));
      // Quotes, a backslash, a newline and non-ASCII: what escaping the stored text again as a string would touch.
      const result = { content: [{ type: 'text', text: 'say "hi"\\ \n ünï' }], structuredContent: { n: [1, null] } };
      expect((await store.runs.transition(taskId, 'completed', { result })).ok).toBe(true);
      await expect.poll(() => heard.length).toBe(1);
      const raw = heard[0] ?? '';
      // The stored text, byte for byte, is the event's `resultJson` member.
      const stored = (await db.redis.hget(keys.task(taskId), TASK_FIELDS.result)) ?? '';
      expect(raw).toContain(`"resultJson":${stored}`);
      const event = GatewayEventSchema.parse(JSON.parse(raw));
      expect(event).toMatchObject({ type: 'status', status: 'completed', finalJson: true, resultJson: result });
      // Neither `final` nor `result`: a gateway that knows only those reads the hash.
      expect(event).not.toHaveProperty('result');
      expect(event).not.toHaveProperty('final');
      if (event.type !== 'status') throw new Error('not a status event');
      const record = await store.records.get(taskId);
      expect(terminalRecord(record!, event).result).toEqual(result);
      // An event as an earlier script sends it (the outcome as JSON text) still reads the same.
      const { resultJson: _json, finalJson: _final, ...older } = event;
      expect(terminalRecord(record!, { ...older, final: true, result: stored }).result).toEqual(result);
    } finally {
      subscriber.disconnect();
    }
  });
});
