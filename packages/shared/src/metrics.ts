/**
 * What the gateway's and the worker's Prometheus metrics have in common: one registry per process object (several
 * gateways or workers in one process, as in tests, never collide), Node's default metrics under the process's own
 * prefix, the Redis connection counters, and metric constructors bound to that registry.
 */
import {
  Counter,
  Gauge,
  Histogram,
  Registry,
  collectDefaultMetrics,
  type CounterConfiguration,
  type GaugeConfiguration,
  type HistogramConfiguration,
} from 'prom-client';
import type { Logger } from './logger.js';
import type { RedisClient } from './redis.js';

export abstract class ProcessMetrics {
  readonly registry = new Registry();
  readonly redisErrors: Counter<'connection'>;
  readonly redisReconnects: Counter<'connection'>;

  /** `process` names the default metrics: `taskrelay_gateway_process_cpu_seconds_total`, … */
  protected constructor(process: 'gateway' | 'worker') {
    collectDefaultMetrics({ register: this.registry, prefix: `taskrelay_${process}_` });
    this.redisErrors = this.counter({
      name: 'taskrelay_redis_errors_total',
      help: "Errors reported by this process's Redis connections, by connection.",
      labelNames: ['connection'] as const,
    });
    this.redisReconnects = this.counter({
      name: 'taskrelay_redis_reconnects_total',
      help: "Reconnect attempts of this process's Redis connections, by connection.",
      labelNames: ['connection'] as const,
    });
  }

  /** Counts the errors and reconnects of one Redis connection, and logs its errors (never the console). */
  watchRedis(client: RedisClient, connection: string, log: Logger): void {
    client.on('error', (error: unknown) => {
      this.redisErrors.inc({ connection });
      log.warn({ err: error, connection }, 'Redis connection error');
    });
    client.on('reconnecting', () => this.redisReconnects.inc({ connection }));
  }

  protected counter<T extends string = string>(config: Omit<CounterConfiguration<T>, 'registers'>): Counter<T> {
    return new Counter<T>({ ...config, registers: [this.registry] });
  }

  protected gauge<T extends string = string>(config: Omit<GaugeConfiguration<T>, 'registers'>): Gauge<T> {
    return new Gauge<T>({ ...config, registers: [this.registry] });
  }

  protected histogram<T extends string = string>(config: Omit<HistogramConfiguration<T>, 'registers'>): Histogram<T> {
    return new Histogram<T>({ ...config, registers: [this.registry] });
  }
}
