/** Parsing of the command line's own values: `key=value` tool arguments and the numeric options. */
import { UsageError } from './errors.js';

/**
 * `key=value` pairs into tool arguments. A value is parsed as JSON when it parses (`items=10`, `ok=true`,
 * `tags=["a"]`), else kept as a string (`report=q3`). `{i}` in a value is replaced by the call's number (1..N) first,
 * so `--parallel 3 report=r{i}` gives each call its own arguments.
 */
export function parseToolArguments(pairs: readonly string[], callNumber: number): Record<string, unknown> {
  const args: Record<string, unknown> = {};
  for (const pair of pairs) {
    const eq = pair.indexOf('=');
    if (eq <= 0) throw new UsageError(`argument "${pair}" is not key=value`);
    const key = pair.slice(0, eq);
    const raw = pair.slice(eq + 1).replaceAll('{i}', String(callNumber));
    args[key] = parseValue(raw);
  }
  return args;
}

function parseValue(raw: string): unknown {
  try {
    return JSON.parse(raw) as unknown;
  } catch {
    return raw;
  }
}

/** A positive integer option (`--parallel 3`, `--ttl 60000`), or a usage error naming the option. */
export function positiveInt(name: string, max?: number) {
  return (value: string): number => {
    const n = Number(value);
    if (!/^\d+$/.test(value) || !Number.isSafeInteger(n) || n < 1) {
      throw new UsageError(`${name} must be a positive integer, got "${value}"`);
    }
    if (max !== undefined && n > max) throw new UsageError(`${name} must be at most ${max}, got ${value}`);
    return n;
  };
}
