/**
 * Which webhook URLs the gateway POSTs to (PROTOCOL.md §27.1, §27.4): the SSRF rules, checked when a task is created
 * and again before every try. A URL must name a host on `TASKRELAY_WEBHOOK_ALLOWED_HOSTS` (none by default), and every
 * address its name resolves to must be public unicast or itself on that list. The try then connects to the address
 * that passed (`ResolvedTarget`), never to a second DNS answer.
 */
import { lookup as dnsLookup } from 'node:dns/promises';
import ipaddr from 'ipaddr.js';
import { z } from 'zod';
import { TaskrelayError } from '@taskrelay/shared';

/** `_meta` key naming a task's completion webhook (docs/WEBHOOKS.md). */
export const WEBHOOK_META_KEY = 'dev.taskrelay/webhook';

/** Longest webhook URL accepted. */
export const MAX_WEBHOOK_URL_LENGTH = 2_048;

/** How long one DNS resolution may take before the URL counts as not resolving. */
const LOOKUP_TIMEOUT_MS = 2_000;

const WebhookMetaSchema = z.object({ url: z.string().min(1).max(MAX_WEBHOOK_URL_LENGTH) }).strict();

/**
 * A webhook the policy refuses: at creation the wire answers it JSON-RPC -32602 (`data.code` `WEBHOOK_REFUSED`), at
 * delivery it is a dead letter. The message is the reason.
 */
export class WebhookRefusedError extends TaskrelayError {
  constructor(reason: string) {
    super('WEBHOOK_REFUSED', `Webhook refused: ${reason}`);
    this.name = 'WebhookRefusedError';
  }
}

/** The principal has as many events waiting as it may: the wire answers it JSON-RPC -32600. */
export class PendingWebhooksCapError extends TaskrelayError {
  constructor(message: string) {
    super('TOO_MANY_PENDING_WEBHOOKS', message);
    this.name = 'PendingWebhooksCapError';
  }
}

/** The URL's name did not resolve (now): a try is retried, a creation refused. */
export class WebhookLookupError extends TaskrelayError {
  constructor(host: string, cause: unknown) {
    super(
      'WEBHOOK_UNRESOLVED',
      `${host} does not resolve (${cause instanceof Error ? cause.message : String(cause)})`,
      {
        cause,
      },
    );
    this.name = 'WebhookLookupError';
  }
}

export interface LookupAddress {
  address: string;
  family: number;
}

/** All addresses of a name, in the resolver's order (`dns.lookup` with `all`; tests inject their own). */
export type WebhookLookup = (hostname: string) => Promise<LookupAddress[]>;

/** Where one try connects: the URL, and the checked address its connection is pinned to. */
export interface ResolvedTarget {
  url: URL;
  address: string;
  family: 4 | 6;
}

export interface WebhookPolicyOptions {
  /** Whether `TASKRELAY_WEBHOOK_SECRET` is set: without it every webhook is refused. */
  secretSet: boolean;
  /** `host` or `host:port` entries (IPv6 in brackets). */
  allowedHosts: readonly string[];
  /** Default: `dns.lookup` of the system resolver (what an ordinary connection would use), bounded by 2 s. */
  lookup?: WebhookLookup;
}

interface HostEntry {
  key: string;
  port: number | undefined;
}

export class WebhookPolicy {
  private readonly entries: HostEntry[];
  private readonly lookup: WebhookLookup;

  constructor(private readonly options: WebhookPolicyOptions) {
    this.entries = options.allowedHosts.map(parseEntry);
    this.lookup = options.lookup ?? systemLookup;
  }

  /** The webhook URL a request's `_meta` names (unchecked), or undefined when it names none. */
  urlOf(meta: Record<string, unknown> | undefined): string | undefined {
    const value = meta?.[WEBHOOK_META_KEY];
    if (value === undefined) return undefined;
    const parsed = WebhookMetaSchema.safeParse(value);
    if (!parsed.success) {
      throw new WebhookRefusedError(
        `_meta["${WEBHOOK_META_KEY}"] must be {"url": "<http or https URL of at most ${MAX_WEBHOOK_URL_LENGTH} characters>"}`,
      );
    }
    return parsed.data.url;
  }

  /** Every check of PROTOCOL.md §27.1 but the pending cap: the address a try would connect to, or a refusal. */
  async check(raw: string): Promise<ResolvedTarget> {
    return this.resolve(this.checkUrl(raw));
  }

  /** The checks that need no DNS: a secret is set, the URL's form, and its host on the allow-list. */
  checkUrl(raw: string): URL {
    if (!this.options.secretSet) {
      throw new WebhookRefusedError('webhooks are off on this gateway (TASKRELAY_WEBHOOK_SECRET is not set)');
    }
    let url: URL;
    try {
      url = new URL(raw);
    } catch {
      throw new WebhookRefusedError(`${JSON.stringify(raw)} is not a URL`);
    }
    if (url.protocol !== 'http:' && url.protocol !== 'https:') {
      throw new WebhookRefusedError(`the URL must be http:// or https:// (got ${url.protocol})`);
    }
    if (url.username !== '' || url.password !== '') {
      throw new WebhookRefusedError('the URL must not carry a user name or password');
    }
    const port = portOf(url);
    const key = hostKey(url.hostname);
    if (!this.entries.some((e) => e.key === key && (e.port === undefined || e.port === port))) {
      throw new WebhookRefusedError(
        `host ${url.host} is not allowed (not on TASKRELAY_WEBHOOK_ALLOWED_HOSTS${this.entries.length === 0 ? ', which is empty' : ''})`,
      );
    }
    return url;
  }

  /** Resolves the URL's name and checks every address; the first is the one to connect to. */
  async resolve(url: URL): Promise<ResolvedTarget> {
    const host = bare(url.hostname);
    const port = portOf(url);
    let addresses: LookupAddress[];
    if (ipaddr.isValid(host)) {
      addresses = [{ address: host, family: host.includes(':') ? 6 : 4 }];
    } else {
      try {
        addresses = await this.lookup(host);
      } catch (error) {
        throw new WebhookLookupError(host, error);
      }
      if (addresses.length === 0) throw new WebhookLookupError(host, new Error('no address'));
    }
    for (const { address } of addresses) {
      if (!this.addressAllowed(address, port)) {
        const range = ipaddr.isValid(address) ? ipaddr.process(address).range() : 'unparsable';
        throw new WebhookRefusedError(
          `${url.host} resolves to ${address}, a ${range} address (only public addresses, or addresses on TASKRELAY_WEBHOOK_ALLOWED_HOSTS, are allowed)`,
        );
      }
    }
    const first = addresses[0]!;
    return { url, address: first.address, family: first.family === 6 ? 6 : 4 };
  }

  private addressAllowed(address: string, port: number): boolean {
    if (!ipaddr.isValid(address)) return false;
    if (ipaddr.process(address).range() === 'unicast') return true;
    const key = hostKey(address);
    return this.entries.some((e) => e.key === key && (e.port === undefined || e.port === port));
  }
}

function bare(host: string): string {
  return host.replace(/^\[|\]$/g, '');
}

/** One spelling per host: an IP in its normalised form (IPv4-mapped IPv6 as IPv4), a name lowercased. */
function hostKey(host: string): string {
  const h = bare(host).toLowerCase().replace(/\.$/, '');
  return ipaddr.isValid(h) ? `ip:${ipaddr.process(h).toNormalizedString()}` : `name:${h}`;
}

function portOf(url: URL): number {
  if (url.port !== '') return Number(url.port);
  return url.protocol === 'https:' ? 443 : 80;
}

function parseEntry(entry: string): HostEntry {
  const match = /^(\[[^\]]+\]|[^:]+)(?::(\d+))?$/.exec(entry.trim());
  if (!match?.[1]) return { key: `invalid:${entry}`, port: undefined };
  return { key: hostKey(match[1]), port: match[2] === undefined ? undefined : Number(match[2]) };
}

const systemLookup: WebhookLookup = async (hostname) => {
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<never>((_resolve, reject) => {
    timer = setTimeout(() => reject(new Error(`no answer within ${LOOKUP_TIMEOUT_MS} ms`)), LOOKUP_TIMEOUT_MS);
  });
  try {
    return await Promise.race([dnsLookup(hostname, { all: true, verbatim: true }), timeout]);
  } finally {
    clearTimeout(timer);
  }
};
