/**
 * One HTTP exchange of a job-API tool, with the retry rule of docs/JOB-API.md: network errors, timeouts, 5xx, 408 and
 * 429 are transient and retried with exponential backoff (and jitter, and `Retry-After` when the upstream sends one);
 * any other 4xx is permanent and fails the task without retry, carrying the upstream's own message.
 */
import { NonRetryableError, TaskrelayError } from '@taskrelay/shared';
import { CancelledError, RetryAfterError, cancelReasonOf } from '../errors.js';

/** Which request of a job this is; hooks and error messages name it. */
export type JobApiPhase = 'submit' | 'poll' | 'result' | 'cancel';

/** A request as it goes on the wire (after templates): what a `request` hook may change or sign. */
export interface JobApiHttpRequest {
  method: string;
  url: string;
  headers: Record<string, string>;
  /** The body text; absent for GET and DELETE without a body. */
  body?: string;
}

/** An answer as the tool reads it. `json` is the parsed body when it parses as JSON, else `undefined`. */
export interface JobApiHttpResponse {
  status: number;
  headers: Headers;
  /** The URL that answered (after redirects): relative `Location`s resolve against it. */
  url: string;
  text: string;
  json: unknown;
}

/** Timeout and retries of every request. */
export interface HttpPolicy {
  timeoutMs: number;
  /** Tries per request, the first included. */
  attempts: number;
  minDelayMs: number;
  maxDelayMs: number;
}

/** A transient upstream failure (retried): the last one is thrown when the tries run out. */
export class UpstreamUnavailableError extends TaskrelayError {
  constructor(message: string) {
    super('UPSTREAM_UNAVAILABLE', message);
    this.name = 'UpstreamUnavailableError';
  }
}

/**
 * Where a tool's secrets may go (PROTOCOL.md §23.3, §23.4): the file's headers, its query parameters and whatever a
 * `request` hook adds travel only to hosts the tool trusts; redirects are refused, or followed with the secrets only
 * to trusted hosts.
 */
export interface SecretPolicy {
  redirects: 'none' | 'follow';
  /** Whether this URL's host may receive the tool's secrets. */
  trusts(url: string): boolean;
  /** The headers a request keeps on its way to a host that is not trusted (lower-case names). */
  safeHeaders: ReadonlySet<string>;
}

/** Most redirects one request follows (`http.redirects: follow`). */
export const MAX_REDIRECTS = 5;

/** The request as it may go to a host the tool does not trust: only the headers that carry nothing of the tool's. */
export function withoutSecrets(request: JobApiHttpRequest, policy: SecretPolicy): JobApiHttpRequest {
  const headers: Record<string, string> = {};
  for (const [name, value] of Object.entries(request.headers)) {
    if (policy.safeHeaders.has(name.toLowerCase())) headers[name] = value;
  }
  return { ...request, headers };
}

export interface SendOptions {
  phase: JobApiPhase;
  policy: HttpPolicy;
  /** Aborts waits between tries and (unless `detached`) the request itself. */
  signal: AbortSignal;
  /**
   * Keep the request going when `signal` aborts (submit: an answer already on its way carries the job id we must keep;
   * cancel: runs after the signal aborted). Waits between tries still end on abort unless `ignoreAbort`.
   */
  detached?: boolean;
  /** Keep retrying after `signal` aborted (cancel runs because it did). */
  ignoreAbort?: boolean;
  fetch: typeof fetch;
  /** Redirects and the hosts that may see the tool's secrets. */
  secrets: SecretPolicy;
  /** Called before each try: builds (or re-signs) the request. */
  build: () => Promise<JobApiHttpRequest>;
  /** Told about each transient failure before the wait. */
  onRetry?: (info: { attempt: number; delayMs: number; error: string }) => void;
}

/** Sends a request with retries; resolves with a 2xx/3xx answer. */
export async function sendWithRetry(options: SendOptions): Promise<JobApiHttpResponse> {
  const { policy, signal } = options;
  for (let attempt = 1; ; attempt += 1) {
    if (signal.aborted && !options.ignoreAbort) throw new CancelledError(cancelReasonOf(signal));
    const request = await options.build();
    let failure: { message: string; retryAfterMs?: number };
    try {
      const response = await sendOnce(request, options);
      if (response.status < 400) return response;
      let message = `${options.phase} ${request.method} ${redact(response.url)}: HTTP ${response.status}: ${upstreamMessage(response)}`;
      if ((response.status === 401 || response.status === 403) && !options.secrets.trusts(response.url)) {
        message += ` (sent without the tool's headers: ${hostOf(response.url)} is not a host the tool names; add it to http.trustedHosts)`;
      }
      if (!isTransientStatus(response.status)) {
        throw new NonRetryableError(`Upstream rejected the ${message}`, { data: { status: response.status } });
      }
      failure = { message };
      const retryAfterMs = retryAfter(response.headers.get('retry-after'));
      if (retryAfterMs !== undefined) failure.retryAfterMs = retryAfterMs;
      // The upstream says when to come back (PROTOCOL.md §3.4): the run ends without using an attempt or holding a
      // worker slot, and a new run comes back then (a submit that was refused submits again; a poll resumes). A
      // cancel's own request is not a run of the task: it keeps waiting here.
      if (retryAfterMs !== undefined && (response.status === 429 || response.status === 503) && !options.ignoreAbort) {
        throw new RetryAfterError(retryAfterMs, `Upstream asked to retry later: ${message}`);
      }
    } catch (error) {
      if (!(error instanceof UpstreamUnavailableError)) throw error;
      failure = { message: error.message };
    }
    if (attempt >= policy.attempts) {
      throw new UpstreamUnavailableError(`${failure.message} (gave up after ${attempt} tries)`);
    }
    const backoff = Math.min(policy.maxDelayMs, policy.minDelayMs * 2 ** (attempt - 1));
    const delayMs = Math.min(policy.maxDelayMs, failure.retryAfterMs ?? backoff * (0.5 + Math.random() / 2));
    options.onRetry?.({ attempt, delayMs: Math.round(delayMs), error: failure.message });
    await wait(delayMs, options.ignoreAbort ? undefined : signal);
  }
}

async function sendOnce(request: JobApiHttpRequest, options: SendOptions): Promise<JobApiHttpResponse> {
  const timeout = AbortSignal.timeout(options.policy.timeoutMs);
  const signal = options.detached ? timeout : AbortSignal.any([options.signal, timeout]);
  const where = `${options.phase} ${request.method} ${redact(request.url)}`;
  try {
    // Redirects are ours to follow (§23.4): fetch's own would re-send every header, secrets included, to any host.
    let current = request;
    for (let hop = 0; ; hop += 1) {
      const init: RequestInit = { method: current.method, headers: current.headers, signal, redirect: 'manual' };
      if (current.body !== undefined) init.body = current.body;
      const response = await options.fetch(current.url, init);
      const location = REDIRECTS.has(response.status) ? response.headers.get('location') : null;
      if (location === null) {
        const text = await response.text();
        return { status: response.status, headers: response.headers, url: current.url, text, json: parseJson(text) };
      }
      await response.body?.cancel().catch(() => undefined);
      const target = new URL(location, current.url).toString();
      const redirect = `${options.phase} ${current.method} ${redact(current.url)} answered HTTP ${response.status}, a redirect to ${redact(target)}`;
      if (options.secrets.redirects === 'none') {
        throw new NonRetryableError(
          `Upstream ${redirect}; redirects are not followed (http.redirects: none; "follow" follows them, with the tool's headers only to the hosts it names)`,
          { data: { status: response.status } },
        );
      }
      if (hop >= MAX_REDIRECTS)
        throw new NonRetryableError(`Upstream ${redirect}: more than ${MAX_REDIRECTS} redirects`);
      current = nextHop(request, current, response.status, target, options.secrets);
    }
  } catch (error) {
    if (error instanceof NonRetryableError) throw error;
    if (!options.detached && options.signal.aborted) throw new CancelledError(cancelReasonOf(options.signal));
    if (timeout.aborted)
      throw new UpstreamUnavailableError(`${where}: no answer within ${options.policy.timeoutMs} ms`);
    const cause =
      error instanceof Error ? ((error.cause as Error | undefined)?.message ?? error.message) : String(error);
    throw new UpstreamUnavailableError(`${where}: ${cause}`);
  }
}

const REDIRECTS = new Set([301, 302, 303, 307, 308]);

/**
 * The request a redirect asks for, as browsers make it: 303 (and 301/302 after a POST) turns it into a body-less GET,
 * 307/308 repeat method and body. Its headers are the first request's when the target is trusted, else only the safe
 * ones (the `request` hook is not run again: what it signed was the first URL).
 */
function nextHop(
  first: JobApiHttpRequest,
  current: JobApiHttpRequest,
  status: number,
  url: string,
  policy: SecretPolicy,
): JobApiHttpRequest {
  const toGet =
    status === 303 ? current.method !== 'HEAD' : (status === 301 || status === 302) && current.method === 'POST';
  const base = policy.trusts(url) ? first : withoutSecrets(first, policy);
  const next: JobApiHttpRequest = { method: toGet ? 'GET' : current.method, url, headers: { ...base.headers } };
  if (toGet) delete next.headers['content-type'];
  else if (current.body !== undefined) next.body = current.body;
  return next;
}

function hostOf(url: string): string {
  try {
    return new URL(url).host;
  } catch {
    return url;
  }
}

/** 5xx, 408 Request Timeout and 429 Too Many Requests may succeed later; every other 4xx will not. */
export function isTransientStatus(status: number): boolean {
  return status >= 500 || status === 408 || status === 429;
}

/** The upstream's own words for an error answer: the usual JSON fields, else the start of the body. */
export function upstreamMessage(response: Pick<JobApiHttpResponse, 'json' | 'text' | 'status'>): string {
  const body = response.json as Record<string, unknown> | undefined;
  if (typeof body === 'object' && body !== null) {
    const error = body['error'];
    const candidates = [
      typeof error === 'object' && error !== null ? (error as Record<string, unknown>)['message'] : error,
      body['message'],
      body['detail'],
      body['title'],
      Array.isArray(body['errors'])
        ? (body['errors'][0] as Record<string, unknown> | undefined)?.['message']
        : undefined,
    ];
    const found = candidates.find((c) => typeof c === 'string' && c.trim() !== '');
    if (typeof found === 'string') return oneLineExcerpt(found);
  }
  const text = response.text.trim();
  return text === '' ? 'no message' : oneLineExcerpt(text);
}

function oneLineExcerpt(text: string): string {
  const line = text.replace(/\s+/g, ' ').trim();
  return line.length > 500 ? `${line.slice(0, 500)}…` : line;
}

function parseJson(text: string): unknown {
  if (text.trim() === '') return undefined;
  try {
    return JSON.parse(text) as unknown;
  } catch {
    return undefined;
  }
}

/** `Retry-After` in ms: seconds or an HTTP date. */
function retryAfter(header: string | null): number | undefined {
  if (header === null) return undefined;
  const seconds = Number(header);
  if (Number.isFinite(seconds) && seconds >= 0) return seconds * 1000;
  const at = Date.parse(header);
  return Number.isNaN(at) ? undefined : Math.max(0, at - Date.now());
}

/** A URL for logs and messages: no query string (tokens travel there in some APIs), no credentials. */
export function redact(url: string): string {
  try {
    const parsed = new URL(url);
    parsed.username = '';
    parsed.password = '';
    parsed.search = parsed.search === '' ? '' : '?…';
    return parsed.toString();
  } catch {
    return url;
  }
}

function wait(ms: number, signal: AbortSignal | undefined): Promise<void> {
  if (signal?.aborted) return Promise.reject(new CancelledError(cancelReasonOf(signal)));
  return new Promise((resolve, reject) => {
    const onAbort = () => {
      clearTimeout(timer);
      reject(new CancelledError(cancelReasonOf(signal as AbortSignal)));
    };
    const timer = setTimeout(() => {
      signal?.removeEventListener('abort', onAbort);
      resolve();
    }, ms);
    signal?.addEventListener('abort', onAbort, { once: true });
  });
}
