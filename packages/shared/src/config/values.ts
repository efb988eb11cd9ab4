/**
 * The value schemas the environment's variables are read with (config/*.ts): whole numbers in bounds, Redis URLs and
 * node lists, prefixes and queue names, and the gateway's lists, flags, URLs and webhook settings. Each says what is
 * wrong in the words `ConfigError` prints after the variable's name.
 */
import { z } from 'zod';
import type { RedisNode } from '../redis.js';

export type Env = Record<string, string | undefined>;

export const LOG_LEVELS = ['fatal', 'error', 'warn', 'info', 'debug', 'trace', 'silent'] as const;

export const int = (min: number, max: number) =>
  z
    .string()
    .trim()
    .regex(/^-?\d+$/, { message: 'must be a whole number' })
    .transform(Number)
    .pipe(
      z
        .number()
        .int()
        .min(min, { message: `must be at least ${min}` })
        .max(max, { message: `must be at most ${max}` }),
    );

/** A whole number within bounds, as an option takes it. */
export const wholeNumber = (min: number, max: number) =>
  z
    .number({ message: 'must be a whole number' })
    .int({ message: 'must be a whole number' })
    .min(min, { message: `must be at least ${min}` })
    .max(max, { message: `must be at most ${max}` });

/** An environment variable read as a whole number, then checked and defaulted by its option's own schema. */
export const intEnv = <T extends z.ZodType<number | undefined, number | undefined>>(option: T) =>
  z
    .string()
    .trim()
    .regex(/^-?\d+$/, { message: 'must be a whole number' })
    .transform(Number)
    .optional()
    .pipe(option);

export const redisUrl = z
  .string()
  .trim()
  .refine((v) => /^rediss?:\/\/[^\s]+$/.test(v) && URL.canParse(v), { message: 'must be a redis:// or rediss:// URL' });

/** `host:port,host:port`: Redis Cluster seed nodes or Sentinels. */
export const nodeList = z.string().transform((value, ctx) => {
  const nodes: RedisNode[] = [];
  for (const item of value
    .split(',')
    .map((v) => v.trim())
    .filter(Boolean)) {
    const match = /^(\[[0-9a-fA-F:]+\]|[^\s:/[\]]+):(\d{1,5})$/.exec(item);
    const port = Number(match?.[2]);
    if (!match?.[1] || !(port >= 1 && port <= 65_535)) {
      ctx.addIssue({
        code: 'custom',
        message: `must be a comma list of host:port (bad entry ${JSON.stringify(item)})`,
      });
      return z.NEVER;
    }
    nodes.push({ host: match[1].replace(/^\[|\]$/g, ''), port });
  }
  if (nodes.length === 0) {
    ctx.addIssue({ code: 'custom', message: 'must list at least one host:port' });
    return z.NEVER;
  }
  return nodes;
});

export const prefix = z
  .string()
  .trim()
  .min(1, { message: 'must not be empty' })
  .regex(/^[^\s]+$/, { message: 'must not contain spaces' });

export const queueName = z
  .string()
  .trim()
  .regex(/^[A-Za-z0-9_.-]+$/, { message: 'must be letters, digits, _ . or -' });

export const authTokens = z.string().transform((value, ctx) => {
  const tokens = new Map<string, string>();
  for (const pair of value
    .split(',')
    .map((p) => p.trim())
    .filter(Boolean)) {
    const at = pair.indexOf(':');
    const principal = at > 0 ? pair.slice(0, at).trim() : '';
    const token = at > 0 ? pair.slice(at + 1).trim() : '';
    if (!principal || !token) {
      ctx.addIssue({ code: 'custom', message: 'must be a comma list of principal:token pairs' });
      return z.NEVER;
    }
    tokens.set(token, principal);
  }
  return tokens;
});

export const originList = z.string().transform((v) =>
  v
    .split(',')
    .map((o) => o.trim())
    .filter(Boolean),
);

export const scopeList = z.string().transform((v) => v.split(/\s+/).filter(Boolean));

export const httpUrl = z
  .string()
  .trim()
  .refine((v) => /^https?:\/\//.test(v) && URL.canParse(v), { message: 'must be an http:// or https:// URL' });

export const flag = z
  .string()
  .trim()
  .toLowerCase()
  .refine((v) => ['1', 'true', 'yes', '0', 'false', 'no'].includes(v), { message: 'must be true or false' })
  .transform((v) => ['1', 'true', 'yes'].includes(v));

/** `TASKRELAY_WEBHOOK_SECRET`: any non-empty value, or `whsec_` and non-empty base64 (PROTOCOL.md §27.4). */
export const webhookSecret = z
  .string()
  .refine(
    (v) =>
      !v.startsWith('whsec_') || /^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$/.test(v.slice(6)),
    {
      message: 'must be base64 after the whsec_ prefix',
    },
  )
  .refine((v) => v !== 'whsec_', { message: 'must not be empty after the whsec_ prefix' });

/** `TASKRELAY_WEBHOOK_ALLOWED_HOSTS`: `host`, `host:port`, `[v6]` or `[v6]:port`, lowercased. */
export const webhookHostList = z.string().transform((value, ctx) => {
  const hosts: string[] = [];
  for (const item of value
    .split(',')
    .map((v) => v.trim().toLowerCase())
    .filter(Boolean)) {
    const match = /^(\[[0-9a-f:.]+\]|[^\s:/[\]@]+)(?::(\d{1,5}))?$/.exec(item);
    if (!match || (match[2] !== undefined && !(Number(match[2]) >= 1 && Number(match[2]) <= 65_535))) {
      ctx.addIssue({
        code: 'custom',
        message: `must be a comma list of host or host:port (bad entry ${JSON.stringify(item)})`,
      });
      return z.NEVER;
    }
    hosts.push(item);
  }
  return hosts;
});
