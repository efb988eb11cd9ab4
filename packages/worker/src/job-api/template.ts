/**
 * The small template language of job-API tools (docs/JOB-API.md): `{{id}}`, `{{args}}`, `{{args.NAME}}` (a dot path into
 * the arguments), `{{taskId}}`, `{{statusUrl}}`, and dot paths (`a.b.0.c`) into JSON responses. `${env:NAME}` is
 * resolved once, when a file is loaded (config-file.ts), never per request.
 */

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
