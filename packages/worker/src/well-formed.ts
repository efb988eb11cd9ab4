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
