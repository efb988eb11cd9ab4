/**
 * The small template language of job-API tools (docs/JOB-API.md): `{{id}}`, `{{args}}`, `{{args.NAME}}` (a dot path into
 * the arguments), `{{taskId}}`, `{{statusUrl}}`, and dot paths (`a.b.0.c`) into JSON responses. `${env:NAME}` is
 * resolved once, when a file is loaded (config-file.ts), never per request.
 */
import { TaskrelayError } from '@taskrelay/shared';

/** What a template may refer to. `id` and `statusUrl` exist once the job is submitted. */
export interface TemplateScope {
  args: Record<string, unknown>;
  taskId: string;
  id?: string;
  statusUrl?: string;
}

const TOKEN = /\{\{\s*([A-Za-z0-9_.-]+)\s*\}\}/g;
const WHOLE_TOKEN = /^\{\{\s*([A-Za-z0-9_.-]+)\s*\}\}$/;

/** The names a template may use: `id`, `taskId`, `statusUrl`, `args` and `args.<path>`. */
export function isKnownToken(name: string): boolean {
  return name === 'id' || name === 'taskId' || name === 'statusUrl' || name === 'args' || /^args\.[^.]/.test(name);
}

/** Every `{{name}}` in a string, in order. */
export function tokensOf(template: string): string[] {
  return [...template.matchAll(TOKEN)].map((match) => match[1] ?? '');
}

/** The value a token stands for; `undefined` when the scope does not have it (an absent argument, say). */
export function tokenValue(name: string, scope: TemplateScope): unknown {
  if (name === 'args') return scope.args;
  if (name === 'id') return scope.id;
  if (name === 'taskId') return scope.taskId;
  if (name === 'statusUrl') return scope.statusUrl;
  if (name.startsWith('args.')) return getPath(scope.args, name.slice('args.'.length));
  return undefined;
}

/** A value as text inside a string: strings as they are, anything else as JSON, absent as ''. */
function asText(value: unknown): string {
  if (value === undefined || value === null) return '';
  return typeof value === 'string' ? value : JSON.stringify(value);
}

/**
 * Renders a string template. Inside a URL (`encode: true`) every substituted value is URL-encoded
 * (`encodeURIComponent`), except `{{statusUrl}}`, which is a URL itself (`{{statusUrl}}/result`).
 */
export function renderString(template: string, scope: TemplateScope, options: { encode?: boolean } = {}): string {
  return template.replace(TOKEN, (_match, name: string) => {
    const text = asText(tokenValue(name, scope));
    return options.encode && name !== 'statusUrl' ? encodeURIComponent(text) : text;
  });
}

/** A value that would change which path a URL asks for; the tool fails with this (PROTOCOL.md §23.2). */
export class PathValueError extends TaskrelayError {
  constructor(message: string) {
    super('INVALID_PATH_VALUE', message);
    this.name = 'PathValueError';
  }
}

/** Percent-decodes until nothing changes (at most 5 rounds), so `%252e%252e` is seen as the `..` it may become. */
function fullyDecoded(text: string): string {
  let current = text;
  for (let round = 0; round < 5; round++) {
    let next: string;
    try {
      next = decodeURIComponent(current);
    } catch {
      return current; // a lone `%`: nothing more decodes
    }
    if (next === current) return current;
    current = next;
  }
  return current;
}

/**
 * Renders a URL template (PROTOCOL.md §23.2): values are URL-encoded as by `renderString`, and each path segment that a
 * value went into is checked. A segment that is, or decodes to, `.`, `..` or nothing, or that holds a `/` or `\`
 * (encoded or not, once or more), would make the request climb out of, or step beside, the path the template names
 * (`/clips/{{args.clip}}/render` with `clip: ".."` is `POST /render`): it throws `PathValueError` naming the value's
 * template. `{{statusUrl}}` (a URL the upstream gave, only at the start) is not checked; the query and fragment are
 * not path segments.
 */
export function renderUrl(template: string, scope: TemplateScope): string {
  const cut = template.search(/[?#]/);
  const path = cut === -1 ? template : template.slice(0, cut);
  const rest = cut === -1 ? '' : template.slice(cut);
  const lead = /^\{\{\s*statusUrl\s*\}\}/.exec(path)?.[0] ?? '';
  const segments = path.slice(lead.length).split('/');
  const checked = segments.map((segment) => {
    const names = tokensOf(segment);
    const rendered = renderString(segment, scope, { encode: true });
    if (names.length === 0) return rendered;
    const decoded = fullyDecoded(rendered);
    if (decoded === '' || decoded === '.' || decoded === '..' || /[/\\]/.test(decoded)) {
      const shown = decoded.length > 40 ? `${decoded.slice(0, 40)}…` : decoded;
      throw new PathValueError(
        `${names.map((n) => `{{${n}}}`).join(', ')} gives the URL path segment "${shown}": a value in a path may not be ` +
          'empty, ".", ".." or hold "/" or "\\", encoded or not',
      );
    }
    return rendered;
  });
  return renderString(lead, scope) + checked.join('/') + renderString(rest, scope, { encode: true });
}

/**
 * The arguments a tool's published `inputSchema` declares (PROTOCOL.md §23.1): at the top, only the names in its
 * `properties` (none when it lists none); inside a value whose schema names `properties` of its own, only those, all
 * the way down (and through `items` of arrays). A value whose schema names none (`{type: object}` inside an argument,
 * a string, a union) is kept as it is. `additionalProperties` never forwards a name beside declared ones: a free-form
 * map is one declared property of type object.
 */
export function declaredOnly(args: Record<string, unknown>, schema: unknown): Record<string, unknown> {
  const properties = isRecord(schema) && isRecord(schema['properties']) ? schema['properties'] : {};
  return pruneObject(args, properties);
}

function pruneObject(value: Record<string, unknown>, properties: Record<string, unknown>): Record<string, unknown> {
  const out: Record<string, unknown> = {};
  for (const [name, schema] of Object.entries(properties)) {
    if (Object.prototype.hasOwnProperty.call(value, name)) out[name] = pruneValue(value[name], schema);
  }
  return out;
}

function pruneValue(value: unknown, schema: unknown): unknown {
  if (!isRecord(schema)) return value;
  const properties = schema['properties'];
  if (isRecord(value) && isRecord(properties)) {
    // `{type: object}` as a zod round trip publishes it: no names and anything allowed, a free-form map.
    const freeForm = Object.keys(properties).length === 0 && schema['additionalProperties'] !== false;
    return freeForm ? value : pruneObject(value, properties);
  }
  if (Array.isArray(value) && isRecord(schema['items'])) return value.map((item) => pruneValue(item, schema['items']));
  return value;
}

function isRecord(value: unknown): value is Record<string, unknown> {
  return typeof value === 'object' && value !== null && !Array.isArray(value);
}

/**
 * Renders a request body: a string that is exactly one token becomes that value itself (so `"{{args}}"` sends the
 * arguments object and `"{{args.count}}"` keeps a number a number); other strings are rendered as text; objects and
 * arrays are rendered member by member.
 */
export function renderValue(template: unknown, scope: TemplateScope): unknown {
  if (typeof template === 'string') {
    const whole = WHOLE_TOKEN.exec(template);
    if (whole) return tokenValue(whole[1] ?? '', scope);
    return renderString(template, scope);
  }
  if (Array.isArray(template)) return template.map((item) => renderValue(item, scope));
  if (typeof template === 'object' && template !== null) {
    const out: Record<string, unknown> = {};
    for (const [key, value] of Object.entries(template)) {
      const rendered = renderValue(value, scope);
      if (rendered !== undefined) out[key] = rendered;
    }
    return out;
  }
  return template;
}

/**
 * The value at a dot path (`a.b.0.c`: numeric segments index arrays), or `undefined` when any step is missing.
 * `.` or `''` is the value itself.
 */
export function getPath(value: unknown, path: string): unknown {
  if (path === '' || path === '.') return value;
  let current: unknown = value;
  for (const segment of path.split('.')) {
    if (current === null || current === undefined) return undefined;
    if (Array.isArray(current)) {
      if (!/^\d+$/.test(segment)) return undefined;
      current = current[Number(segment)];
    } else if (typeof current === 'object') {
      if (!Object.prototype.hasOwnProperty.call(current, segment)) return undefined;
      current = (current as Record<string, unknown>)[segment];
    } else {
      return undefined;
    }
  }
  return current;
}

/** Every string inside a JSON-like value, with its path (for validating templates at load). */
export function stringsIn(value: unknown, path: string[] = []): Array<{ path: string[]; text: string }> {
  if (typeof value === 'string') return [{ path, text: value }];
  if (Array.isArray(value)) return value.flatMap((item, i) => stringsIn(item, [...path, String(i)]));
  if (typeof value === 'object' && value !== null) {
    return Object.entries(value).flatMap(([key, item]) => stringsIn(item, [...path, key]));
  }
  return [];
}
