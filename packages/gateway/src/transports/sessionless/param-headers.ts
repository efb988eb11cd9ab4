/**
 * SEP-2243 headers that mirror the body (PROTOCOL.md §16.2): `Mcp-Name`, and the `Mcp-Param-{Name}` header of each
 * tool argument whose `inputSchema` property carries `"x-mcp-header": "<Name>"`. Proxies route on them without reading
 * the body, so the gateway, which reads it, refuses a request whose headers say something else (400, -32020). A value
 * that a header cannot carry as is travels as `=?base64?<base64 of its UTF-8>?=`.
 */

/** RFC 9110 field-value characters after the parser removed OWS: visible ASCII, space and tab. */
const FIELD_VALUE = /^[\t\x20-\x7e]*$/;
const BASE64 = /^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$/;
const SENTINEL_PREFIX = '=?base64?';
const SENTINEL_SUFFIX = '?=';

/** A header's value as the client meant it: decoded when it is a Base64 sentinel; undefined when it is malformed. */
export function decodeHeaderValue(raw: string): string | undefined {
  const value = raw.trim();
  if (!FIELD_VALUE.test(value)) return undefined;
  if (value.length < SENTINEL_PREFIX.length + SENTINEL_SUFFIX.length) return value;
  if (!value.startsWith(SENTINEL_PREFIX) || !value.endsWith(SENTINEL_SUFFIX)) return value;
  const encoded = value.slice(SENTINEL_PREFIX.length, value.length - SENTINEL_SUFFIX.length);
  // Strict: Buffer.from would skip characters outside the alphabet and accept missing padding.
  if (!BASE64.test(encoded)) return undefined;
  const bytes = Buffer.from(encoded, 'base64');
  const text = new TextDecoder('utf-8', { fatal: true });
  try {
    return text.decode(bytes);
  } catch {
    return undefined;
  }
}

/** An argument mirrored into a header: its property path in the arguments and the header's name. */
interface HeaderParam {
  path: string[];
  header: string;
  type: unknown;
}

/** Chains of `properties` keys that end at an `x-mcp-header` annotation (the only places SEP-2243 allows one). */
export function headerParams(inputSchema: Record<string, unknown>, path: string[] = [], depth = 0): HeaderParam[] {
  const properties = inputSchema['properties'];
  if (depth > 8 || typeof properties !== 'object' || properties === null) return [];
  const found: HeaderParam[] = [];
  for (const [name, sub] of Object.entries(properties as Record<string, unknown>)) {
    if (typeof sub !== 'object' || sub === null) continue;
    const schema = sub as Record<string, unknown>;
    const header = schema['x-mcp-header'];
    if (typeof header === 'string' && header !== '')
      found.push({ path: [...path, name], header, type: schema['type'] });
    found.push(...headerParams(schema, [...path, name], depth + 1));
  }
  return found;
}

/** The body's value at `path`, or undefined. */
function valueAt(args: Record<string, unknown>, path: string[]): unknown {
  let value: unknown = args;
  for (const key of path) {
    if (typeof value !== 'object' || value === null || Array.isArray(value)) return undefined;
    value = (value as Record<string, unknown>)[key];
  }
  return value;
}

/** Whether a header's decoded text stands for the body's value (integers compared as numbers, §Server Validation). */
function matches(text: string, value: unknown, type: unknown): boolean {
  if (typeof value === 'string') return text === value;
  if (typeof value === 'boolean') return text === String(value);
  if (typeof value === 'number') {
    if (text.trim() === '' || !/^[-+]?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?$/.test(text)) return false;
    return Number(text) === value && (type !== 'integer' || Number.isInteger(value));
  }
  return false;
}

/**
 * Checks each mirrored argument of a `tools/call` against its `Mcp-Param-*` header: a value in the body needs the
 * header, and the header must decode to it; no value (absent or null) needs no header. Returns why it fails, or
 * undefined.
 */
export function checkParamHeaders(
  header: (name: string) => string | undefined,
  inputSchema: Record<string, unknown>,
  args: Record<string, unknown>,
): string | undefined {
  for (const param of headerParams(inputSchema)) {
    const name = `Mcp-Param-${param.header}`;
    const raw = header(name);
    const value = valueAt(args, param.path);
    if (value === undefined || value === null) continue;
    if (raw === undefined) return `${name} header is required: arguments.${param.path.join('.')} is in the body`;
    const text = decodeHeaderValue(raw);
    if (text === undefined) return `${name} header is malformed (invalid characters or Base64)`;
    if (!matches(text, value, param.type)) {
      return `${name} header does not match arguments.${param.path.join('.')}`;
    }
  }
  return undefined;
}
