import type { RedisClient } from '../redis.js';

/**
 * Reads of large results, apart from everything else (PROTOCOL.md §22.5): each on a connection of its own, one at a
 * time per connection, at most `perPrincipal` at once for one principal; the others wait their turn in order. Before,
 * ten concurrent 16 MiB results went over the gateway's one command connection: nine of them timed out as `Task store
 * unavailable`, and every other principal's commands queued behind them. Hand-written: two counting semaphores.
 */
export class LargeReads {
  private readonly idle: RedisClient[];
  private readonly waiting: Array<() => void> = [];
  private readonly perPrincipalActive = new Map<string, number>();
  private readonly perPrincipalWaiting = new Map<string, Array<() => void>>();

  constructor(
    connections: RedisClient[],
    private readonly perPrincipal: number,
  ) {
    this.idle = [...connections];
  }

  async read<T>(principal: string, fn: (client: RedisClient) => Promise<T>): Promise<T> {
    await this.enterPrincipal(principal);
    try {
      const client = await this.takeConnection();
      try {
        return await fn(client);
      } finally {
        this.idle.push(client);
        this.waiting.shift()?.();
      }
    } finally {
      this.leavePrincipal(principal);
    }
  }

  private async takeConnection(): Promise<RedisClient> {
    while (this.idle.length === 0) await new Promise<void>((resolve) => this.waiting.push(resolve));
    return this.idle.pop() as RedisClient;
  }

  private async enterPrincipal(principal: string): Promise<void> {
    while ((this.perPrincipalActive.get(principal) ?? 0) >= this.perPrincipal) {
      await new Promise<void>((resolve) => {
        const queue = this.perPrincipalWaiting.get(principal) ?? [];
        queue.push(resolve);
        this.perPrincipalWaiting.set(principal, queue);
      });
    }
    this.perPrincipalActive.set(principal, (this.perPrincipalActive.get(principal) ?? 0) + 1);
  }

  private leavePrincipal(principal: string): void {
    const left = (this.perPrincipalActive.get(principal) ?? 1) - 1;
    if (left > 0) this.perPrincipalActive.set(principal, left);
    else this.perPrincipalActive.delete(principal);
    const queue = this.perPrincipalWaiting.get(principal);
    const next = queue?.shift();
    if (queue !== undefined && queue.length === 0) this.perPrincipalWaiting.delete(principal);
    next?.();
  }
}
