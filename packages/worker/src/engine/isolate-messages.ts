/**
 * What crosses between the worker and the child of an isolated run (PROTOCOL.md §31.2): the start data, the messages
 * both ways, and the one pair that turns an error into a message and back. Values cross by the structured clone
 * algorithm (`postMessage`, `fork` with `serialization: 'advanced'`); an error's class does not, so it crosses as its
 * fields and is made again on the other side.
 */
import { z } from 'zod';
import {
  ERROR_CODES,
  LOG_LEVELS,
  ProtocolError,
  TaskrelayError,
  type CancelReason,
  type ErrorCode,
} from '@taskrelay/shared';
import { ISOLATE_CALLS } from '../context-surface.js';
import { CancelledError, RetryAfterError, SuspendedError, isCancelReason } from '../errors.js';

/** Set on the global object of an isolated run's child: `startWorker` refuses to start there (§31.4). */
export const ISOLATED_CHILD: unique symbol = Symbol.for('taskrelay.isolatedChild');

/** What the child is started with. */
export interface IsolateStart {
  moduleUrl: string;
  tool: string;
  input: Record<string, unknown>;
  taskId: string;
  attempt: number;
  state: unknown;
  answers: Record<string, unknown>;
  /** The run logger's level: the child's `ctx.log` sends only the lines the worker would write. */
  logLevel: string;
}

/** An error as it crosses: its class is named, its fields kept. */
const WireErrorSchema = z.object({
  name: z.string(),
  message: z.string(),
  code: z.string().optional(),
  data: z.record(z.string(), z.unknown()).optional(),
  reason: z.string().optional(),
  retryAfterMs: z.number().optional(),
  rpcCode: z.number().optional(),
  rpcData: z.unknown().optional(),
  stack: z.string().optional(),
});
export type WireError = z.infer<typeof WireErrorSchema>;

/** A value, or the error a call or handler ended with. */
export type Settled = { ok: true; value: unknown } | { ok: false; error: WireError };

/** Worker → child. */
export type ParentMessage =
  | { t: 'start'; start: IsolateStart }
  | { t: 'abort'; reason: CancelReason }
  | { t: 'reply'; id: number; settled: Settled; state?: unknown; answers?: Record<string, unknown> }
  /** Run the function of step call `id` (the parent's real `ctx.step` runs it, §31.2). */
  | { t: 'invoke'; id: number };

const SettledSchema = z.union([
  z.object({ ok: z.literal(true), value: z.unknown() }),
  z.object({ ok: z.literal(false), error: WireErrorSchema }),
]);

/**
 * Child → worker. Checked on arrival: the child runs a tool's code, which can post on the same channel.
 */
export const ChildMessageSchema = z.discriminatedUnion('t', [
  z.object({
    t: z.literal('progress'),
    progress: z.number(),
    total: z.number().optional(),
    message: z.string().optional(),
  }),
  z.object({ t: z.literal('notify'), level: z.enum(LOG_LEVELS), data: z.unknown(), logger: z.string().optional() }),
  z.object({ t: z.literal('log'), line: z.string() }),
  // The calls of the ctx declaration (context-surface.ts); their arguments are the real context's to check.
  z.object({ t: z.literal('call'), id: z.number().int(), method: z.enum(ISOLATE_CALLS), args: z.array(z.unknown()) }),
  z.object({ t: z.literal('invoked'), id: z.number().int(), settled: SettledSchema }),
  z.object({ t: z.literal('end'), settled: SettledSchema }),
]);
export type ChildMessage = z.infer<typeof ChildMessageSchema>;

/** An error (of any copy of the packages) as it crosses. */
export function toWireError(error: unknown): WireError {
  if (!(error instanceof Error)) return { name: 'Error', message: typeof error === 'string' ? error : String(error) };
  const fields = error as Error & Partial<Record<'code' | 'data' | 'reason' | 'retryAfterMs' | 'rpcCode', unknown>>;
  const wire: WireError = { name: error.name, message: error.message };
  if (typeof fields.code === 'string') wire.code = fields.code;
  if (isRecord(fields.data)) wire.data = fields.data;
  if (typeof fields.reason === 'string') wire.reason = fields.reason;
  if (typeof fields.retryAfterMs === 'number') wire.retryAfterMs = fields.retryAfterMs;
  if (typeof fields.rpcCode === 'number') {
    wire.rpcCode = fields.rpcCode;
    wire.rpcData = (error as { rpcData?: unknown }).rpcData;
  }
  if (error.stack !== undefined) wire.stack = error.stack;
  return wire;
}

/**
 * The error again, as the side that reads it branches on it: the worker's classes for the kinds `settle` and
 * `serializeError` tell apart (suspension, cancel, back-off, protocol error, any taskrelay code), else an `Error` with
 * the same name and message.
 */
export function fromWireError(wire: WireError): Error {
  const error = rebuild(wire);
  if (wire.stack !== undefined) error.stack = wire.stack;
  return error;
}

function rebuild(wire: WireError): Error {
  if (wire.name === 'SuspendedError') return new SuspendedError(wire.message);
  if (wire.code === 'CANCELLED' && isCancelReason(wire.reason)) return new CancelledError(wire.reason, wire.message);
  if (wire.name === 'RetryAfterError' && wire.retryAfterMs !== undefined) {
    return new RetryAfterError(wire.retryAfterMs, wire.message);
  }
  if (wire.name === 'ProtocolError' && wire.rpcCode !== undefined) {
    return new ProtocolError(wire.rpcCode, wire.message, wire.rpcData);
  }
  if (wire.code !== undefined && (ERROR_CODES as readonly string[]).includes(wire.code)) {
    const error = new TaskrelayError(wire.code as ErrorCode, wire.message, wire.data ? { data: wire.data } : undefined);
    error.name = wire.name;
    return error;
  }
  const error = new Error(wire.message);
  error.name = wire.name;
  return error;
}

function isRecord(value: unknown): value is Record<string, unknown> {
  return typeof value === 'object' && value !== null && !Array.isArray(value);
}
