/**
 * Texts a tool sends its caller (progress messages, log data) as well-formed Unicode (PROTOCOL.md §22.4). A lone
 * UTF-16 surrogate — easy to get from slicing a string, or passed in by a caller — serialises as a `\udXXX` escape that
 * Redis's Lua JSON decoder refuses ("invalid unicode escape code"), and the update was lost. Each lone surrogate
 * becomes U+FFFD, as `String.prototype.toWellFormed` (ES2024, not in this project's lib) does.
 */
const LONE_SURROGATE = /[\uD800-\uDBFF](?![\uDC00-\uDFFF])|(?<![\uD800-\uDBFF])[\uDC00-\uDFFF]/g;

/** `text` with every lone surrogate replaced by U+FFFD. */
export function wellFormedText(text: string): string {
  return text.replace(LONE_SURROGATE, '\uFFFD');
}

/** A JSON value with every string in it (keys included) made well-formed; other values are kept as they are. */
export function wellFormedJson(value: unknown): unknown {
  if (typeof value === 'string') return wellFormedText(value);
  if (Array.isArray(value)) return value.map(wellFormedJson);
  if (value !== null && typeof value === 'object') {
    if (typeof (value as { toJSON?: unknown }).toJSON === 'function') return value;
    return Object.fromEntries(Object.entries(value).map(([k, v]) => [wellFormedText(k), wellFormedJson(v)]));
  }
  return value;
}

/**
 * The most bytes (UTF-8) of a progress message (PROTOCOL.md §22.4): a message is status text, and every one is
 * published to the gateway that routes the task. Without a bound, 200 KB messages made Redis cut that gateway's
 * subscriber (its 32 MB pub/sub output limit), and every task on the gateway lost live notifications while it
 * reconnected.
 */
export const MAX_PROGRESS_MESSAGE_BYTES = 4_096;

/** `text` cut to at most `maxBytes` of UTF-8, on a character boundary, with a marker saying how much there was. */
export function boundedText(text: string, maxBytes: number): string {
  const bytes = Buffer.byteLength(text);
  if (bytes <= maxBytes) return text;
  const marker = ` …[truncated: ${bytes} bytes]`;
  const room = Math.max(0, maxBytes - Buffer.byteLength(marker));
  // encodeInto writes whole characters only: `read` is where a cut leaves no half of a character behind.
  const { read } = new TextEncoder().encodeInto(text, new Uint8Array(room));
  return text.slice(0, read) + marker;
}
