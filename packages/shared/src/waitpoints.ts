/**
 * Waitpoints (PROTOCOL.md §32): a URL a tool hands to another system and waits on. This module holds what gateways and
 * workers share: the token (a JWE sealed with the deployment's key, through `jose`), the stored record, and where the
 * key and the public URL live in Redis.
 */
import { createHash, randomBytes } from 'node:crypto';
import { CompactEncrypt, compactDecrypt } from 'jose';
import { z } from 'zod';
import type { Keys } from './protocol/keys.js';
import type { RedisClient } from './redis.js';

/** A waitpoint's name: short, printable, safe in a hash field. */
export const WAITPOINT_NAME = /^[A-Za-z0-9._:-]{1,64}$/;
export const MIN_WAITPOINT_TIMEOUT_MS = 1_000;
export const MAX_WAITPOINT_TIMEOUT_MS = 30 * 86_400_000;
export const DEFAULT_WAITPOINT_TIMEOUT_MS = 86_400_000;
/** The status message of a task whose run waits on a waitpoint. */
export const waitpointMessage = (name: string) => `waiting for an external event (${name})`;

/** A waitpoint as the task hash keeps it (`wp:<name>`). */
export const WaitpointRecordSchema = z.object({
  token: z.string().min(1),
  /** When it stops waiting, ms since epoch (Redis' clock). */
  timeoutAt: z.number().int(),
  state: z.enum(['waiting', 'completed', 'timedOut']),
  completedAt: z.number().int().optional(),
  /** The callback's body, once completed. */
  value: z.unknown().optional(),
});
export type WaitpointRecord = z.infer<typeof WaitpointRecordSchema>;

/** What a token seals: the task and the waitpoint's name, and a nonce so two opens never share a token. */
const SealedSchema = z.strictObject({ t: z.string().min(1), n: z.string().regex(WAITPOINT_NAME), r: z.string() });

/**
 * Seals and opens waitpoint tokens with the deployment's key: AES-256-GCM in a compact JWE (`dir`), so a token is
 * unguessable, tamper-evident, bound to its task and name, and says nothing of them to whoever holds it.
 */
export class WaitpointTokens {
  private constructor(private readonly key: Uint8Array) {}

  /**
   * The deployment's sealer: from `secret` (`TASKRELAY_WAITPOINT_SECRET`, hashed to 32 bytes) when given, else from a
   * random key stored once in Redis (`SET NX`, no expiry) that every gateway and worker reads.
   */
  static async create(options: {
    secret: string | undefined;
    redis: RedisClient;
    keys: Keys;
  }): Promise<WaitpointTokens> {
    if (options.secret !== undefined) {
      return new WaitpointTokens(createHash('sha256').update(options.secret, 'utf8').digest());
    }
    const key = options.keys.waitpointKey;
    await options.redis.set(key, randomBytes(32).toString('base64url'), 'NX');
    const stored = await options.redis.get(key);
    if (stored === null) throw new Error(`the waitpoint key ${key} vanished right after it was set`);
    return new WaitpointTokens(Buffer.from(stored, 'base64url'));
  }

  /** A sealer with a given 32-byte key (tests). */
  static withKey(key: Uint8Array): WaitpointTokens {
    return new WaitpointTokens(key);
  }

  async seal(taskId: string, name: string): Promise<string> {
    const plain = JSON.stringify({ t: taskId, n: name, r: randomBytes(6).toString('base64url') });
    return new CompactEncrypt(new TextEncoder().encode(plain))
      .setProtectedHeader({ alg: 'dir', enc: 'A256GCM' })
      .encrypt(this.key);
  }

  /** The task and name a token was sealed for; undefined for anything this deployment did not seal. */
  async open(token: string): Promise<{ taskId: string; name: string } | undefined> {
    if (token.length > 1_024) return undefined;
    try {
      const { plaintext } = await compactDecrypt(token, this.key, {
        keyManagementAlgorithms: ['dir'],
        contentEncryptionAlgorithms: ['A256GCM'],
      });
      const sealed = SealedSchema.safeParse(JSON.parse(new TextDecoder().decode(plaintext)));
      return sealed.success ? { taskId: sealed.data.t, name: sealed.data.n } : undefined;
    } catch {
      return undefined;
    }
  }
}

/** The public base URL gateways announce (`TASKRELAY_PUBLIC_URL`), without a trailing slash. */
export async function readPublicUrl(redis: RedisClient, keys: Keys): Promise<string | undefined> {
  return (await redis.get(keys.publicUrl)) ?? undefined;
}

/**
 * Announces a gateway's public base URL: a configured one overwrites, a default one only fills a gap (so one
 * gateway started without the setting does not replace what the others were told).
 */
export async function announcePublicUrl(
  redis: RedisClient,
  keys: Keys,
  url: string,
  configured: boolean,
): Promise<void> {
  const base = url.replace(/\/+$/, '');
  if (configured) await redis.set(keys.publicUrl, base);
  else await redis.set(keys.publicUrl, base, 'NX');
}

/** The URL of a waitpoint's token under a public base. */
export const waitpointUrl = (base: string, token: string) => `${base}/waitpoints/${token}`;
