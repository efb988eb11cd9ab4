/** Exit codes of `taskrelay` (docs/CLI.md) and the error that maps to a usage error. */
export const EXIT = {
  /** The call completed (and the tool did not return `isError`); any other command succeeded. */
  ok: 0,
  /** The call failed or the tool returned `isError`; or the gateway answered with an error. */
  failed: 1,
  /** Bad command line: unknown command or option, malformed `key=value`. */
  usage: 2,
  /** Interrupted: the calls were cancelled (Ctrl-C) or ended `cancelled`. */
  cancelled: 130,
} as const;

export type ExitCode = (typeof EXIT)[keyof typeof EXIT];

/** A command-line mistake: printed as one line, exit code 2. */
export class UsageError extends Error {
  override readonly name = 'UsageError';
}

/** The worst of several outcomes: cancelled beats failed beats ok. */
export function worstExit(codes: readonly ExitCode[]): ExitCode {
  if (codes.includes(EXIT.cancelled)) return EXIT.cancelled;
  if (codes.includes(EXIT.failed)) return EXIT.failed;
  return EXIT.ok;
}

/**
 * One line that says what to do, for the ways a newcomer's first command fails before MCP: a gateway that is not
 * there (Node's bare `fetch failed`), a URL that is not the MCP endpoint (the SDK's error carries the whole HTML page
 * that answered), and a missing or refused token (the gateway's JSON body). Anything else keeps its own message.
 */
export function explainFailure(error: unknown, target: { url: string; token: string | undefined }): string {
  const message = error instanceof Error ? error.message : String(error);
  const status = httpStatusOf(error);
  if (status === 401) {
    return target.token === undefined
      ? `the gateway at ${target.url} needs a bearer token (HTTP 401): pass --token <token> or set TASKRELAY_TOKEN`
      : `the gateway at ${target.url} refused the token (HTTP 401): check --token or TASKRELAY_TOKEN`;
  }
  if (status === 403) return `the gateway at ${target.url} refused this token for that (HTTP 403)`;
  if (status !== undefined && (status === 404 || status === 405 || /<(!doctype|html)/i.test(message))) {
    const hint = mcpEndpointHint(target.url);
    return `${target.url} is not an MCP endpoint (HTTP ${status})${hint}`;
  }
  if (status !== undefined && /<(!doctype|html)/i.test(message)) return `${target.url} answered HTTP ${status}`;
  const refusal = httpRefusal(error, ` at ${target.url}`);
  if (refusal !== undefined) return refusal;
  const network = networkCodeOf(error);
  if (network !== undefined || message === 'fetch failed') {
    const cause = (error as { cause?: unknown }).cause;
    const why =
      network !== undefined
        ? (NETWORK_REASONS[network] ?? network)
        : cause instanceof Error
          ? cause.message
          : 'no answer';
    return (
      `cannot reach the gateway at ${target.url} (${why}): is it running? ` +
      'Start one with `npm start`, or point --url (or TASKRELAY_URL) at it'
    );
  }
  return message;
}

const NETWORK_REASONS: Record<string, string> = {
  ECONNREFUSED: 'connection refused',
  ENOTFOUND: 'unknown host',
  EAI_AGAIN: 'host name lookup failed',
  ETIMEDOUT: 'timed out',
  ECONNRESET: 'connection reset',
  EHOSTUNREACH: 'host unreachable',
};

/** The HTTP status of the MCP SDK's `StreamableHTTPError` (its `code`), if it is one. */
function httpStatusOf(error: unknown): number | undefined {
  const code = (error as { code?: unknown } | null)?.code;
  return typeof code === 'number' && code >= 100 && code < 600 ? code : undefined;
}

/** `fetch failed` hides the reason in `cause` (Node's undici): `ECONNREFUSED`, `ENOTFOUND`… */
function networkCodeOf(error: unknown): string | undefined {
  let current: unknown = error;
  for (let depth = 0; depth < 4 && current !== null && typeof current === 'object'; depth += 1) {
    const code = (current as { code?: unknown }).code;
    if (typeof code === 'string' && /^E[A-Z_]+$/.test(code)) return code;
    const errors = (current as { errors?: unknown }).errors; // an AggregateError (IPv4 and IPv6 both refused)
    if (Array.isArray(errors) && errors.length > 0) current = errors[0];
    else current = (current as { cause?: unknown }).cause;
  }
  return undefined;
}

/**
 * A refusal the gateway answers before MCP (a rate limit, a cap, a full memory budget) comes as a JSON-RPC error body,
 * which the SDK's error carries as it came: its message in one line, not the JSON. Undefined for any other error.
 */
export function httpRefusal(error: unknown, where = ''): string | undefined {
  const status = httpStatusOf(error);
  if (status === undefined) return undefined;
  const said = bodyMessage(error instanceof Error ? error.message : String(error));
  if (status === 429)
    return `the gateway${where} is limiting this principal (HTTP 429): ${said ?? 'too many requests'}`;
  return said === undefined ? undefined : `the gateway${where} answered HTTP ${status}: ${said}`;
}

/** The message of a JSON error body (`{"error":{"message"}}` JSON-RPC, or `{"error":"…"}`) inside an SDK error's text. */
function bodyMessage(text: string): string | undefined {
  const start = text.indexOf('{');
  if (start < 0) return undefined;
  let body: unknown;
  try {
    body = JSON.parse(text.slice(start));
  } catch {
    return undefined;
  }
  const error = (body as { error?: unknown } | null)?.error;
  if (typeof error === 'string') return error;
  const nested = (error as { message?: unknown } | null | undefined)?.message;
  return typeof nested === 'string' ? nested : undefined;
}

function mcpEndpointHint(url: string): string {
  let parsed: URL;
  try {
    parsed = new URL(url);
  } catch {
    return '';
  }
  if (parsed.pathname.replace(/\/+$/, '').endsWith('/mcp')) return '';
  return `: the gateway serves MCP at /mcp; try --url ${parsed.origin}/mcp`;
}
