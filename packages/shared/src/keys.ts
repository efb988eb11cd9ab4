/**
 * Every Redis key and channel name taskrelay uses. No other file builds a key string.
 * With a `{...}` prefix every key hashes to one Redis Cluster slot, which the Lua scripts and BullMQ need.
 */
export interface Keys {
  readonly prefix: string;
  /** Hash holding one task record. */
  task(taskId: string): string;
  /** Sorted set of one principal's task ids, scored by creation time. */
  principalTasks(principal: string): string;
  /** Sorted set of live worker ids, scored by heartbeat expiry (ms since epoch). */
  readonly workers: string;
  /** String holding one worker's tool catalog (JSON). */
  workerCatalog(workerId: string): string;
  /** Stream holding one SSE stream's events, for Last-Event-ID replay. */
  eventStream(streamId: string): string;
  /** Channel: every task status change. */
  readonly statusChannel: string;
  /** Channel: progress for the tasks whose session lives on one gateway. */
  gatewayProgressChannel(gatewayId: string): string;
  /** Prefix of the gateway progress channels (the Lua progress script appends the gateway id). */
  readonly gatewayProgressChannelPrefix: string;
  /** Channel: cancel wake-ups for workers. */
  readonly cancelChannel: string;
  /** BullMQ `prefix` option. */
  readonly bullPrefix: string;
  /** BullMQ queue name for a worker pool. */
  queueName(queue: string): string;
}

export function createKeys(prefix = 'taskrelay'): Keys {
  const gatewayProgressChannelPrefix = `${prefix}:gateway:`;
  return {
    prefix,
    task: (taskId) => `${prefix}:task:${taskId}`,
    principalTasks: (principal) => `${prefix}:principal:${encodeURIComponent(principal)}:tasks`,
    workers: `${prefix}:workers`,
    workerCatalog: (workerId) => `${prefix}:worker:${workerId}:catalog`,
    eventStream: (streamId) => `${prefix}:stream:${streamId}`,
    statusChannel: `${prefix}:status`,
    gatewayProgressChannelPrefix,
    gatewayProgressChannel: (gatewayId) => `${gatewayProgressChannelPrefix}${gatewayId}:progress`,
    cancelChannel: `${prefix}:cancel`,
    bullPrefix: prefix,
    queueName: (queue) => `q-${queue}`,
  };
}
