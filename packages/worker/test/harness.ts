/**
 * What the worker's integration tests play instead of a gateway: the task hash (TaskStore), the BullMQ queue,
 * the cancel publish, and a capture of the worker's log lines. Every harness has its own key prefix.
 */
import { Writable } from 'node:stream';
import { Queue } from 'bullmq';
import { Redis } from 'ioredis';
import {
  TaskStore,
  createKeys,
  createLogger,
  type CancelRequest,
  type Keys,
  type Logger,
  type TaskRecord,
  type TaskStatus,
  toolQueue,
} from '@taskrelay/shared';
import { uniquePrefix } from '../../../test/helpers/redis.js';
import { waitFor } from '../../../test/helpers/wait-for.js';
import type { ToolDefinition } from '../src/define-tool.js';
import { startWorker, type WorkerHandle, type WorkerOptions } from '../src/worker.js';

export type LogLine = Record<string, unknown> & { msg?: string; level?: number; taskId?: string };

/** A pino destination that keeps every line, parsed. */
export class LogCapture extends Writable {
  readonly lines: LogLine[] = [];

  override _write(chunk: Buffer, _encoding: string, callback: () => void): void {
    for (const line of chunk.toString('utf8').split('\n')) {
      if (line.trim()) this.lines.push(JSON.parse(line) as LogLine);
    }
    callback();
  }

  /** The first line whose `msg` equals (string) or matches (RegExp) `msg`, for one task when `taskId` is given. */
  find(msg: string | RegExp, taskId?: string): LogLine | undefined {
    return this.lines.find(
      (l) =>
        (typeof msg === 'string' ? l.msg === msg : msg.test(l.msg ?? '')) &&
        (taskId === undefined || l.taskId === taskId),
    );
  }

  logger(): Logger {
    return createLogger('worker', { level: 'debug', destination: this });
  }
}

export interface EnqueueOptions {
  /** Add the job to this tool's queue instead of its own (a hand-made job in the wrong queue). */
  intoQueueOf?: string;
  timeoutMs?: number;
  attempts?: number;
  /** What the caller's client can answer (recorded on the task as the gateway does). */
  clientCapabilities?: string[];
  /** Create the task hash but do not add the job (the test adds it with `addJob`). */
  jobless?: boolean;
  /** A job that does not name its principal (not a gateway's): its run starts before its tool (§21.2.1). */
  noPrincipal?: boolean;
}

export class Harness {
  readonly prefix = uniquePrefix('worker');
  readonly keys: Keys = createKeys(this.prefix);
  readonly gatewayId = 'gw-test';
  readonly logs = new LogCapture();
  readonly redis: Redis;
  readonly store: TaskStore;
  private readonly queueConnection: Redis;
  private readonly queues = new Map<string, Queue>();
  /** The TASKRELAY_QUEUE jobs go under: the last started worker's, or the one `useQueueName` named. */
  private queueName = 'default';
  /** Each enqueued task's tool, so its job is found in its tool's queue (PROTOCOL.md §3.2). */
  private readonly toolOf = new Map<string, string>();
  private lastTool = '';
  private readonly handles: WorkerHandle[] = [];
  private readonly clients: Redis[] = [];

  constructor(readonly redisUrl: string) {
    this.redis = new Redis(redisUrl, { maxRetriesPerRequest: null });
    this.queueConnection = new Redis(redisUrl, { maxRetriesPerRequest: null });
    this.store = new TaskStore(this.redis, this.keys);
  }

  /** The BullMQ queue of the last enqueued tool. */
  get queue(): Queue {
    return this.queueOf(this.lastTool);
  }

  /** The BullMQ queue of a tool (PROTOCOL.md §3.2: one per tool and TASKRELAY_QUEUE). */
  queueOf(tool: string): Queue {
    const name = toolQueue(this.queueName, tool);
    let queue = this.queues.get(name);
    if (!queue) {
      queue = new Queue(this.keys.queueName(name), {
        connection: this.queueConnection,
        prefix: this.keys.bullPrefix,
      });
      this.queues.set(name, queue);
    }
    return queue;
  }

  private queueOfTask(taskId: string): Queue {
    return this.queueOf(this.toolOf.get(taskId) ?? this.lastTool);
  }

  /** Sends the next jobs under this TASKRELAY_QUEUE (a worker process this harness did not start). */
  useQueueName(queueName: string): void {
    this.queueName = queueName;
  }

  /** Starts a worker on this harness's prefix; closed by `close()`. */
  async start(tools: ToolDefinition[], options: Partial<WorkerOptions> = {}): Promise<WorkerHandle> {
    const handle = await startWorker({
      redisUrl: this.redisUrl,
      prefix: this.prefix,
      tools,
      logger: this.logs.logger(),
      abortGraceMs: 300,
      ...options,
    });
    this.handles.push(handle);
    this.queueName = options.queue ?? 'default';
    return handle;
  }

  /** Writes the task hash as the gateway does (§4.2), then adds its job (§4.3). Returns the task id. */
  async enqueue(tool: string, args: Record<string, unknown>, options: EnqueueOptions = {}): Promise<string> {
    const task = await this.store.records.create({
      tool,
      queue: toolQueue(this.queueName, tool),
      principal: 'test',
      mode: 'task',
      ttl: 60_000,
      pollInterval: 100,
      gatewayId: this.gatewayId,
      ...(options.clientCapabilities === undefined ? {} : { clientCapabilities: options.clientCapabilities }),
    });
    if (!options.jobless) await this.addJob(task.taskId, tool, args, options);
    return task.taskId;
  }

  async addJob(
    taskId: string,
    tool: string,
    args: Record<string, unknown>,
    options: EnqueueOptions = {},
  ): Promise<void> {
    // Named as a gateway's jobs name it: a first run then defers its start (PROTOCOL.md §21.2.1).
    const data: Record<string, unknown> = { taskId, tool, arguments: args };
    if (!options.noPrincipal) data['principal'] = 'test';
    if (options.timeoutMs !== undefined) data['timeoutMs'] = options.timeoutMs;
    const queueTool = options.intoQueueOf ?? tool;
    this.toolOf.set(taskId, queueTool);
    this.lastTool = queueTool;
    await this.queueOf(queueTool).add(tool, data, {
      jobId: taskId,
      attempts: options.attempts ?? 1,
      removeOnComplete: true,
    });
  }

  /** The gateway's cancel (§7.2, §7.3): state first, then the wake-up, unless `publish` is false. */
  async cancel(taskId: string, publish = true): Promise<void> {
    const outcome = await this.store.runs.transition(taskId, 'cancelled', { cancelReason: 'CLIENT_CANCELLED' });
    if (!outcome.ok) throw new Error(`task ${taskId} could not be cancelled (status ${outcome.status ?? 'missing'})`);
    const request: CancelRequest = { taskId, reason: 'CLIENT_CANCELLED' };
    if (publish) await this.redis.publish(this.keys.cancelChannel, JSON.stringify(request));
  }

  /** The gateway's side of PROTOCOL.md §12.3: store the answer, then promote the delayed job. */
  async answer(taskId: string, n: number, answer: unknown): Promise<boolean> {
    const outcome = await this.store.runs.answerInput(taskId, n, answer, Date.now() + 60_000);
    if (outcome.ok && outcome.resumed) await this.promote(taskId);
    return outcome.ok;
  }

  /** Promotes the task's delayed job, if it is delayed. */
  async promote(taskId: string): Promise<void> {
    const job = await this.queueOfTask(taskId).getJob(taskId);
    await job?.promote().catch(() => undefined);
  }

  task(taskId: string): Promise<TaskRecord | undefined> {
    return this.store.records.get(taskId);
  }

  async waitForStatus(taskId: string, status: TaskStatus, timeoutMs = 10_000): Promise<TaskRecord> {
    return waitFor(
      async () => {
        const task = await this.store.records.get(taskId);
        return task?.status === status ? task : undefined;
      },
      { timeoutMs, message: `task ${taskId} did not become ${status}` },
    );
  }

  /** BullMQ's view of the job: 'completed' jobs are removed, so they read as 'unknown'. */
  jobState(taskId: string): Promise<string> {
    return this.queueOfTask(taskId).getJobState(taskId);
  }

  /** A separate subscriber connection, closed with the harness. */
  async subscribe(channels: string[], onMessage: (channel: string, message: string) => void): Promise<Redis> {
    const client = new Redis(this.redisUrl, { maxRetriesPerRequest: null });
    this.clients.push(client);
    client.on('message', onMessage);
    await client.subscribe(...channels);
    return client;
  }

  async close(): Promise<void> {
    await Promise.all(this.handles.map((h) => h.close({ graceMs: 0 })));
    await Promise.all([...this.queues.values()].map((q) => q.close()));
    // Nothing else uses this prefix: remove what the test wrote instead of ever flushing a shared server.
    let cursor = '0';
    do {
      const [next, keys] = await this.redis.scan(cursor, 'MATCH', `${this.prefix}:*`, 'COUNT', 500);
      if (keys.length > 0) await this.redis.del(...keys);
      cursor = next;
    } while (cursor !== '0');
    await Promise.all([this.redis, this.queueConnection, ...this.clients].map((c) => c.quit().catch(() => undefined)));
  }
}

/** A promise with its resolve function, for tools that wait on the test. */
export function gate(): { promise: Promise<void>; open: () => void } {
  let open = () => undefined as void;
  const promise = new Promise<void>((resolve) => {
    open = resolve;
  });
  return { promise, open };
}
