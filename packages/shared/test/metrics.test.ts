/** ProcessMetrics: the part of the gateway's and the worker's metrics they share (packages/shared/src/metrics.ts). */
import { EventEmitter } from 'node:events';
import { Writable } from 'node:stream';
import { describe, expect, it } from 'vitest';
import { ProcessMetrics, createLogger, type RedisClient } from '@taskrelay/shared';
import { GatewayMetrics } from '../../gateway/src/metrics/gateway-metrics.js';
import { WorkerMetrics } from '../../worker/src/metrics.js';

class SomeMetrics extends ProcessMetrics {
  readonly things = this.counter({ name: 'taskrelay_things_total', help: 'Things.', labelNames: ['kind'] as const });

  constructor() {
    super('worker');
  }
}

describe('ProcessMetrics', () => {
  it('counts errors and reconnects of each Redis connection it watches, and logs the errors', async () => {
    const metrics = new SomeMetrics();
    const client = new EventEmitter();
    const lines: string[] = [];
    const destination = new Writable({
      write(chunk: Buffer, _encoding, done) {
        lines.push(chunk.toString());
        done();
      },
    });
    const log = createLogger('test', { level: 'warn', destination });
    metrics.watchRedis(client as unknown as RedisClient, 'subscriber', log);
    client.emit('error', new Error('ECONNRESET'));
    client.emit('error', new Error('ECONNRESET'));
    client.emit('reconnecting');
    const text = await metrics.registry.metrics();
    expect(text).toContain('taskrelay_redis_errors_total{connection="subscriber"} 2');
    expect(text).toContain('taskrelay_redis_reconnects_total{connection="subscriber"} 1');
    expect(lines.map((l) => JSON.parse(l) as Record<string, unknown>)).toEqual([
      expect.objectContaining({ msg: 'Redis connection error', connection: 'subscriber' }),
      expect.objectContaining({ msg: 'Redis connection error', connection: 'subscriber' }),
    ]);
  });

  it('keeps each object in a registry of its own, with the default metrics under the process prefix', async () => {
    const a = new SomeMetrics();
    const b = new SomeMetrics();
    a.things.inc({ kind: 'x' });
    expect(await a.registry.metrics()).toContain('taskrelay_things_total{kind="x"} 1');
    expect(await b.registry.metrics()).not.toContain('taskrelay_things_total{kind="x"}');
    expect(await a.registry.metrics()).toContain('taskrelay_worker_process_cpu_seconds_total');
  });

  it('is what the gateway and the worker metrics are built on (one set of Redis counters, their own prefixes)', async () => {
    const gateway = new GatewayMetrics();
    const worker = new WorkerMetrics();
    expect(gateway).toBeInstanceOf(ProcessMetrics);
    expect(worker).toBeInstanceOf(ProcessMetrics);
    const [g, w] = await Promise.all([gateway.registry.metrics(), worker.registry.metrics()]);
    for (const text of [g, w]) expect(text).toContain('# TYPE taskrelay_redis_errors_total counter');
    expect(g).toContain('taskrelay_gateway_process_cpu_seconds_total');
    expect(w).toContain('taskrelay_worker_process_cpu_seconds_total');
    expect(g).toContain('# TYPE taskrelay_tasks_finished_total counter');
    expect(w).toContain('# TYPE taskrelay_worker_jobs_started_total counter');
  });
});
