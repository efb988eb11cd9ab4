/**
 * A digest of a JSON value that does not depend on the order of object keys (SHA-256 of its JSON with every object's
 * keys sorted, base64url): what binds a `requestState` to a call's arguments (PROTOCOL.md §17.2) and what a dedupe key
 * is made of (§25.2).
 */
import { createHash } from 'node:crypto';

export function canonicalDigest(value: unknown): string {
  return createHash('sha256')
    .update(JSON.stringify(sorted(value)))
    .digest('base64url');
}

function sorted(value: unknown): unknown {
  if (Array.isArray(value)) return value.map(sorted);
  if (value === null || typeof value !== 'object') return value;
  return Object.fromEntries(
    Object.keys(value)
      .sort()
      .map((k) => [k, sorted((value as Record<string, unknown>)[k])]),
  );
}
