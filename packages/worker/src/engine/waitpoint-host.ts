/**
 * Opens a task's waitpoints for `ctx.waitpoint` (PROTOCOL.md §32): seals a token with the deployment's key, stores
 * the waitpoint (or reads the one an earlier run stored), and puts the gateways' public URL in front of its token.
 */
import {
  TaskrelayError,
  WaitpointTokens,
  readPublicUrl,
  waitpointUrl,
  type JobLock,
  type Keys,
  type RedisClient,
  type Waitpoints,
} from '@taskrelay/shared';
import type { WaitpointHost } from '../context-types.js';

export class WaitpointOpener implements WaitpointHost {
  /** Made at the first waitpoint: a deployment that never opens one never makes its key. */
  private tokens: Promise<WaitpointTokens> | undefined;

  constructor(
    private readonly o: {
      redis: RedisClient;
      keys: Keys;
      store: Pick<Waitpoints, 'open'>;
      secret: string | undefined;
    },
  ) {}

  async open(taskId: string, lock: JobLock, name: string, timeoutMs: number) {
    const base = await readPublicUrl(this.o.redis, this.o.keys);
    if (base === undefined) {
      throw new TaskrelayError('INTERNAL', 'ctx.waitpoint: no gateway has announced its public URL yet');
    }
    this.tokens ??= WaitpointTokens.create({ secret: this.o.secret, redis: this.o.redis, keys: this.o.keys });
    const tokens = await this.tokens.catch((error: unknown) => {
      this.tokens = undefined;
      throw error;
    });
    const opened = await this.o.store.open(taskId, lock, name, await tokens.seal(taskId, name), timeoutMs);
    if (!opened.ok) return opened;
    return { ok: true as const, record: opened.record, url: waitpointUrl(base, opened.record.token) };
  }
}
