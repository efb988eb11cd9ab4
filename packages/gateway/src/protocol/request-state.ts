/**
 * The `requestState` of a 2026-07-28 input round (MRTR, SEP-2322; PROTOCOL.md §17.2): an opaque string the client
 * echoes on its retry, so any gateway replica can take the retry up. It is `base64url(payload).base64url(mac)` with an
 * HMAC-SHA256 over the payload's text; the payload names the plain call's task, the principal and tool it is bound to,
 * and when it expires. It carries no argument, answer or secret: those stay on the task hash. Hand-written (node's
 * crypto, no library) because it is a dozen lines: a JWT library would bring algorithms and headers nothing here uses.
 */
import { createHmac, randomBytes, timingSafeEqual } from 'node:crypto';
import { z } from 'zod';
import { canonicalDigest, type RedisClient } from '@taskrelay/shared';

const PayloadSchema = z.strictObject({
  /** Format version. */
  v: z.literal(1),
  /** The plain call's task. */
  t: z.string().min(1),
  /** The principal it was issued to. */
  p: z.string(),
  /** The tool called. */
  n: z.string().min(1),
  /** Expiry, ms since epoch: the task's input deadline. */
  e: z.number().int(),
  /** When this round was issued, ms: every round's state differs from the last. */
  i: z.number().int(),
  /** 1 when the call becomes a task once its answers resume it (an `inputFirst` tool, §17.4). */
  k: z.literal(1).optional(),
  /**
   * The call's arguments, digested (`argumentsDigest`): a retry must carry the same ones. Absent only in a state an
   * older gateway issued (accepted unbound until it expires, so a rolling deploy ends no round).
   */
  a: z.string().min(1).optional(),
});
export type RequestStatePayload = z.infer<typeof PayloadSchema>;

/** What a retry's `requestState` stands for, once verified. */
export interface RequestState {
  taskId: string;
  principal: string;
  tool: string;
  expiresAt: number;
  /** The call becomes a task once its answers resume it. */
  becomesTask: boolean;
  /** `argumentsDigest` of the call's arguments: the round belongs to this call, not to another of the same tool. */
  argumentsDigest: string;
}

/**
 * A digest of a call's arguments (SHA-256 of their JSON with every object's keys in order, base64url): what a
 * `requestState` is bound to, so a retry with other arguments is refused instead of getting the first call's result.
 */
export function argumentsDigest(args: Record<string, unknown> | undefined): string {
  return canonicalDigest(args ?? {});
}

/** Why a `requestState` was refused; the client is told only that it is invalid. */
export type RequestStateRefusal = 'malformed' | 'signature' | 'principal' | 'tool' | 'arguments' | 'expired';

export class RequestStateSigner {
  private constructor(private readonly key: Buffer) {}

  /**
   * The signer of this deployment: `secret` (`TASKRELAY_REQUEST_STATE_SECRET`) when given, else a random key stored
   * once in Redis (`SET NX`, no expiry) so every replica signs and verifies with the same one.
   */
  static async create(options: {
    secret: string | undefined;
    redis: RedisClient;
    key: string;
  }): Promise<RequestStateSigner> {
    if (options.secret !== undefined) return new RequestStateSigner(Buffer.from(options.secret, 'utf8'));
    const fresh = randomBytes(32).toString('base64url');
    await options.redis.set(options.key, fresh, 'NX');
    const stored = await options.redis.get(options.key);
    if (stored === null) throw new Error(`the request-state key ${options.key} vanished right after it was set`);
    return new RequestStateSigner(Buffer.from(stored, 'base64url'));
  }

  /** A signer with a given key (tests). */
  static withKey(key: Buffer): RequestStateSigner {
    return new RequestStateSigner(key);
  }

  sign(state: RequestState, now = Date.now()): string {
    const payload: RequestStatePayload = {
      v: 1,
      t: state.taskId,
      p: state.principal,
      n: state.tool,
      e: state.expiresAt,
      i: now,
      a: state.argumentsDigest,
    };
    if (state.becomesTask) payload.k = 1;
    const body = Buffer.from(JSON.stringify(payload), 'utf8').toString('base64url');
    return `${body}.${this.mac(body).toString('base64url')}`;
  }

  /**
   * The state a retry echoed, checked: the MAC in constant time first (nothing of an unsigned payload is read), then
   * the principal, the tool and the expiry.
   */
  verify(
    token: string,
    expect: { principal: string; tool: string; argumentsDigest: string },
    now = Date.now(),
  ): { ok: true; state: RequestState } | { ok: false; reason: RequestStateRefusal } {
    const dot = token.indexOf('.');
    if (dot <= 0 || dot !== token.lastIndexOf('.') || token.length > 4096) return { ok: false, reason: 'malformed' };
    const body = token.slice(0, dot);
    const given = Buffer.from(token.slice(dot + 1), 'base64url');
    const wanted = this.mac(body);
    // Buffer.from(…, 'base64url') skips characters outside the alphabet: a re-encode must give back the text as sent.
    if (given.length !== wanted.length || given.toString('base64url') !== token.slice(dot + 1)) {
      return { ok: false, reason: 'signature' };
    }
    if (!timingSafeEqual(given, wanted)) return { ok: false, reason: 'signature' };
    let payload: RequestStatePayload;
    try {
      const parsed = PayloadSchema.safeParse(JSON.parse(Buffer.from(body, 'base64url').toString('utf8')));
      if (!parsed.success) return { ok: false, reason: 'malformed' };
      payload = parsed.data;
    } catch {
      return { ok: false, reason: 'malformed' };
    }
    if (payload.p !== expect.principal) return { ok: false, reason: 'principal' };
    if (payload.n !== expect.tool) return { ok: false, reason: 'tool' };
    if (payload.a !== undefined && payload.a !== expect.argumentsDigest) return { ok: false, reason: 'arguments' };
    if (payload.e <= now) return { ok: false, reason: 'expired' };
    return {
      ok: true,
      state: {
        taskId: payload.t,
        principal: payload.p,
        tool: payload.n,
        expiresAt: payload.e,
        becomesTask: payload.k === 1,
        argumentsDigest: payload.a ?? expect.argumentsDigest,
      },
    };
  }

  private mac(body: string): Buffer {
    return createHmac('sha256', this.key).update(body, 'utf8').digest();
  }
}
