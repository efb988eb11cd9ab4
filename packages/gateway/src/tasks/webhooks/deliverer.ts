/**
 * Delivers the webhook outbox (PROTOCOL.md §27.3–§27.5). Every gateway runs one deliverer: it polls the outbox for due
 * events, leases them, and makes one signed, SSRF-checked, time- and size-bounded POST per event; what the receiver
 * answers decides whether the event is done, tried again later, or dead-lettered. Nothing but the tries in flight is
 * held in memory: a gateway that dies leaves its leased events to whichever gateway polls after the lease ends.
 */
import { setMaxListeners } from 'node:events';
import http from 'node:http';
import https from 'node:https';
import type { LookupFunction } from 'node:net';
import type { Claimed, Logger, OutboxEvent, Settlement, WebhookConfig, WebhookOutbox } from '@taskrelay/shared';
import type { GatewayMetrics } from '../../metrics/gateway-metrics.js';
import type { SignedHeaders, WebhookSigner } from './signer.js';
import { ReceiverHealth, receiverOf } from './receiver-health.js';
import { WebhookLookupError, WebhookRefusedError, type ResolvedTarget, type WebhookPolicy } from './url-policy.js';

/** Most of a receiver's answer body that is read (the rest is cut off): the status is all that counts. */
export const MAX_ANSWER_BYTES = 64 * 1024;
/** Longest `statusMessage` an event body carries. */
export const MAX_EVENT_MESSAGE_CHARS = 1_024;
/** Tries one gateway makes at once. */
export const DELIVERY_SLOTS = 16;
/**
 * Tries one principal may have in flight on one gateway: a quarter of the slots. Before any cap, one principal's 300
 * events to a receiver that never answered held all 16 slots and another principal's webhooks arrived after 178 s.
 */
export const PER_PRINCIPAL_SLOTS = 4;
/**
 * Free slots only a principal with no try in flight may take (PROTOCOL.md §27.3). The per-principal cap alone let
 * 4 principals with hanging receivers hold all 16 slots: another principal's webhooks were not delivered within 90 s.
 */
export const RESERVED_SLOTS = 4;
/**
 * Tries to suspected receivers (one whose last try failed) in flight at once, at most: however many receivers fail,
 * their probes (one per receiver, SUSPECT_TIMEOUT_MS each) leave the other slots to receivers that answer.
 */
export const SUSPECT_SLOTS = 4;
/** Events of backed-off receivers one claim defers, at most (each is one settle). */
const DEFER_PER_CLAIM = 256;

/** The event body: the same bytes on every try of one event (PROTOCOL.md §27.4). No result: the client reads it. */
export function eventBody(event: Pick<OutboxEvent, 'taskId' | 'status' | 'statusMessage' | 'timestamp'>): string {
  const body: Record<string, string> = { type: 'task.status', taskId: event.taskId, status: event.status };
  if (event.statusMessage !== undefined && event.statusMessage !== '') {
    const chars = [...event.statusMessage];
    body['statusMessage'] =
      chars.length > MAX_EVENT_MESSAGE_CHARS ? chars.slice(0, MAX_EVENT_MESSAGE_CHARS).join('') : event.statusMessage;
  }
  body['timestamp'] = event.timestamp;
  return JSON.stringify(body);
}

/** What one POST came to: the receiver's status (and `Retry-After`), or why there was no answer. */
export type TryResult = { kind: 'answer'; status: number; retryAfterMs?: number } | { kind: 'error'; message: string };

export interface RetryPolicy {
  maxAttempts: number;
  retryBaseMs: number;
  retryMaxMs: number;
}

/** Wait before the try after failed try `attempt` (1-based): exponential, capped, between half and all of it. */
export function retryDelayMs(attempt: number, policy: RetryPolicy, random: () => number = Math.random): number {
  const full = Math.min(policy.retryMaxMs, policy.retryBaseMs * 2 ** Math.max(0, attempt - 1));
  return Math.round(full / 2 + (random() * full) / 2);
}

/** PROTOCOL.md §27.5: which answers end, stop, retry or dead-letter an event. */
export function settlementOf(
  result: TryResult,
  attempt: number,
  policy: RetryPolicy,
  random: () => number = Math.random,
): Settlement {
  let reason: string;
  let retryAfterMs: number | undefined;
  if (result.kind === 'answer') {
    const { status } = result;
    if (status >= 200 && status < 300) return { outcome: 'delivered' };
    if (status === 410) return { outcome: 'gone' };
    if (!(status === 408 || status === 425 || status === 429 || status >= 500)) {
      const why =
        status >= 300 && status < 400 ? 'redirects are not followed' : 'only 408, 425, 429 and 5xx answers are retried';
      return { outcome: 'dead', reason: `the receiver answered ${status} (${why})` };
    }
    reason = `the receiver answered ${status}`;
    retryAfterMs = result.retryAfterMs;
  } else {
    reason = result.message;
  }
  if (attempt >= policy.maxAttempts) {
    return { outcome: 'dead', reason: `gave up after ${attempt} tries; the last: ${reason}` };
  }
  const backoff = retryDelayMs(attempt, policy, random);
  const delayMs = Math.min(policy.retryMaxMs, Math.max(backoff, retryAfterMs ?? 0));
  return { outcome: 'retry', delayMs, reason };
}

/**
 * One POST to `target`, connected to its checked address only (a `lookup` that answers nothing else, so a DNS
 * answer that changed since the check cannot redirect it), no redirect followed (node's client follows none), at
 * most `timeoutMs` from start to the socket's close — headers and body alike — and at most MAX_ANSWER_BYTES of the
 * answer read.
 */
export function postOnce(
  target: ResolvedTarget,
  headers: SignedHeaders,
  body: string,
  options: { timeoutMs: number; signal?: AbortSignal; userAgent: string },
): Promise<TryResult> {
  return new Promise((resolve) => {
    let settled = false;
    // The result is known at the status line; the deadline still holds until the socket is gone, so a receiver that
    // sends its headers and then stalls the body cannot keep the socket (one leaked per try, before).
    const finish = (result: TryResult) => {
      if (settled) return;
      settled = true;
      resolve(result);
    };
    const pinned: LookupFunction = (_hostname, lookupOptions, callback) => {
      if ((lookupOptions as { all?: boolean }).all) {
        (callback as unknown as (e: null, a: Array<{ address: string; family: number }>) => void)(null, [
          { address: target.address, family: target.family },
        ]);
      } else {
        callback(null, target.address, target.family);
      }
    };
    const client = target.url.protocol === 'https:' ? https : http;
    const req = client.request(
      target.url,
      {
        method: 'POST',
        agent: false,
        lookup: pinned,
        headers: {
          'content-type': 'application/json',
          'content-length': String(Buffer.byteLength(body)),
          'user-agent': options.userAgent,
          ...headers,
        },
      },
      (res) => {
        const status = res.statusCode ?? 0;
        const retryAfter = Number(res.headers['retry-after']);
        const result: TryResult = { kind: 'answer', status };
        if (Number.isInteger(retryAfter) && retryAfter > 0) result.retryAfterMs = retryAfter * 1000;
        finish(result);
        // Drain a little for a clean close, never more than the bound.
        let read = 0;
        res.on('data', (chunk: Buffer) => {
          read += chunk.length;
          if (read > MAX_ANSWER_BYTES) res.destroy();
        });
        res.on('error', () => undefined);
        res.on('end', () => req.destroy());
      },
    );
    const timer = setTimeout(() => {
      finish({ kind: 'error', message: `no answer within ${options.timeoutMs} ms` });
      req.destroy();
    }, options.timeoutMs);
    const onAbort = () => {
      finish({ kind: 'error', message: 'the try was stopped (gateway shutting down)' });
      req.destroy();
    };
    options.signal?.addEventListener('abort', onAbort, { once: true });
    // However the try ends (answered and drained, cut at the bound, timed out, refused), its socket is gone here.
    req.on('close', () => {
      clearTimeout(timer);
      options.signal?.removeEventListener('abort', onAbort);
    });
    req.on('error', (error: NodeJS.ErrnoException) => {
      finish({ kind: 'error', message: `could not reach the receiver (${error.code ?? error.message})` });
    });
    req.end(body);
  });
}

export interface WebhookDelivererOptions extends Pick<
  WebhookConfig,
  'maxAttempts' | 'retryBaseMs' | 'retryMaxMs' | 'timeoutMs' | 'pollMs'
> {
  /** This gateway's id: the lease holder. */
  gatewayId: string;
  /** `user-agent` of every try. */
  userAgent: string;
}

/**
 * The deliverer's lifecycle: `idle` until `start`, `running` while it polls, `stopping` while the tries in flight are
 * stopped and handed back, `stopped` after.
 */
type State = 'idle' | 'running' | 'stopping' | 'stopped';

export class WebhookDeliverer {
  private state: State = 'idle';
  private timer: NodeJS.Timeout | undefined;
  private polling: Promise<boolean> | undefined;
  private readonly inFlight = new Set<Promise<void>>();
  /** Tries in flight by principal: a claim takes no event of a principal at PER_PRINCIPAL_SLOTS. */
  private readonly inFlightBy = new Map<string, number>();
  private readonly stop$ = new AbortController();
  /** A try's lease outlives its longest try (the timeout) with room for one more round trip. */
  private readonly leaseMs: number;
  /** Each receiver's circuit (PROTOCOL.md §27.3): a receiver that keeps failing is backed off as a whole. */
  private readonly health: ReceiverHealth;

  constructor(
    private readonly outbox: WebhookOutbox,
    private readonly policy: WebhookPolicy,
    private readonly signer: WebhookSigner,
    private readonly metrics: GatewayMetrics,
    private readonly log: Logger,
    private readonly options: WebhookDelivererOptions,
  ) {
    this.leaseMs = 2 * options.timeoutMs + 1_000;
    // Every try in flight listens for the stop: up to DELIVERY_SLOTS of them, past node's warning at 10.
    setMaxListeners(DELIVERY_SLOTS + 1, this.stop$.signal);
    // The circuit stays open for the least an event's own backoff could be (half the step, no jitter): a receiver's
    // only event, retried on its own schedule, never finds its circuit still open.
    this.health = new ReceiverHealth(options, (failures) => retryDelayMs(failures, options, () => 0));
  }

  start(): void {
    if (this.state !== 'idle') return;
    this.state = 'running';
    this.schedule(0);
  }

  /** Stops polling; tries in flight are stopped and handed back (due again at once, for any gateway). */
  async stop(): Promise<void> {
    if (this.state === 'stopped' || this.state === 'stopping') return;
    this.state = 'stopping';
    clearTimeout(this.timer);
    this.stop$.abort();
    await this.polling;
    await Promise.allSettled([...this.inFlight]);
    this.state = 'stopped';
  }

  /** One poll now (tests); resolves when its tries have started, true when it filled every free slot. */
  async poll(): Promise<boolean> {
    this.polling ??= this.claimAndStart().finally(() => {
      this.polling = undefined;
    });
    return this.polling;
  }

  /** Resolves when no try is in flight (tests). */
  async idle(): Promise<void> {
    while (this.inFlight.size > 0) await Promise.allSettled([...this.inFlight]);
  }

  private schedule(ms: number): void {
    if (this.state !== 'running') return;
    this.timer = setTimeout(() => {
      void this.poll().then((full) => this.schedule(full ? 0 : this.options.pollMs));
    }, ms);
    this.timer.unref();
  }

  /**
   * Claims as many due events as there are free slots, fairly (PROTOCOL.md §27.3), and settles at once the due events
   * of receivers whose circuit is open; true when either came back full, or when a receiver's events were left for its
   * slow start only (more may be due: the next claim, at once, sees its try in flight).
   */
  private async claimAndStart(): Promise<boolean> {
    const free = DELIVERY_SLOTS - this.inFlight.size;
    if (this.state !== 'running') return false;
    let claimed: Claimed;
    try {
      claimed = await this.outbox.claim(this.options.gatewayId, free, this.leaseMs, {
        perPrincipal: PER_PRINCIPAL_SLOTS,
        inFlight: this.inFlightBy,
        reserve: RESERVED_SLOTS,
        blocked: this.health.blocked(),
        deferMax: DEFER_PER_CLAIM,
        probes: Math.max(0, SUSPECT_SLOTS - this.health.suspectInFlight()),
        trusted: this.health.trusted(),
      });
    } catch (error) {
      this.log.warn({ err: error }, 'webhook outbox claim failed; trying again next poll');
      return false;
    }
    for (const event of claimed.events) {
      const receiver = receiverOf(event.url);
      this.health.started(receiver);
      this.inFlightBy.set(event.principal, (this.inFlightBy.get(event.principal) ?? 0) + 1);
      const run = this.deliver(event, receiver).finally(() => {
        this.inFlight.delete(run);
        const left = (this.inFlightBy.get(event.principal) ?? 1) - 1;
        if (left > 0) this.inFlightBy.set(event.principal, left);
        else this.inFlightBy.delete(event.principal);
      });
      this.inFlight.add(run);
    }
    await Promise.all(claimed.deferred.map((event) => this.defer(event)));
    return (free > 0 && claimed.events.length === free) || claimed.deferred.length === DEFER_PER_CLAIM || claimed.more;
  }

  /**
   * An event of a receiver whose circuit is open: a failed try that was not sent, due again when the circuit closes
   * at the earliest (its own backoff when that is later), so a receiver that stays down dead-letters its events on the
   * same schedule as if each had been sent.
   */
  private async defer(event: OutboxEvent): Promise<void> {
    const receiver = receiverOf(event.url);
    const until = this.health.blocked()[receiver] ?? 0;
    const message = `not sent: the receiver is backed off after failed tries (the last: ${this.health.lastError(receiver)})`;
    const settlement = settlementOf({ kind: 'error', message }, event.attempts, this.options);
    const final: Settlement =
      settlement.outcome === 'retry'
        ? { ...settlement, delayMs: Math.max(settlement.delayMs, until - Date.now()) }
        : settlement;
    await this.record(event, final);
  }

  private async deliver(event: OutboxEvent, receiver: string): Promise<void> {
    const { settlement, failure, answered } = await this.tryOnce(event, this.health.timeoutFor(receiver));
    const stopped = this.stop$.signal.aborted && settlement.outcome === 'retry';
    // A try stopped by the drain says nothing of the receiver; any other failure to retry is one the circuit counts.
    this.health.ended(
      receiver,
      stopped || (failure === undefined && !answered)
        ? { kind: 'neither' }
        : failure === undefined
          ? { kind: 'answered' }
          : { kind: 'failed', why: failure },
    );
    // A try cut short by the drain is handed back at once rather than after its lease.
    await this.record(event, stopped ? { ...settlement, delayMs: 0 } : settlement);
  }

  private async record(event: OutboxEvent, final: Settlement): Promise<void> {
    const log = this.log.child({ webhookId: event.id, taskId: event.taskId, attempt: event.attempts });
    let settled: boolean;
    try {
      settled = await this.outbox.settle(event, final);
    } catch (error) {
      log.warn({ err: error }, 'could not record a webhook try; its lease will run out and it is tried again');
      return;
    }
    if (!settled) {
      log.info('webhook try outlived its lease; the event is in another try now');
      return;
    }
    const counted = final.outcome === 'retry' ? 'retried' : final.outcome;
    this.metrics.webhookDeliveries.inc({ outcome: counted });
    if (final.outcome === 'dead') log.warn({ url: event.url, reason: final.reason }, 'webhook dead-lettered');
    else if (final.outcome === 'retry')
      log.info({ reason: final.reason, delayMs: final.delayMs }, 'webhook try failed; retrying');
    else log.debug({ outcome: final.outcome }, 'webhook settled');
  }

  /**
   * One try and what it decided; `failure` says why when the receiver failed in a way that is retried, `answered` that
   * it gave an answer that is not such a failure.
   */
  private async tryOnce(
    event: OutboxEvent,
    timeoutMs: number,
  ): Promise<{ settlement: Settlement; failure?: string; answered?: boolean }> {
    let target: ResolvedTarget;
    try {
      // The allow-list and DNS may have changed since the task was created: checked again on every try.
      target = await this.policy.check(event.url);
    } catch (error) {
      if (error instanceof WebhookRefusedError) return { settlement: { outcome: 'dead', reason: error.message } };
      const message = error instanceof WebhookLookupError ? error.message : String(error);
      return { settlement: settlementOf({ kind: 'error', message }, event.attempts, this.options), failure: message };
    }
    const body = eventBody(event);
    const result = await postOnce(target, this.signer.sign(event.id, body), body, {
      timeoutMs,
      signal: this.stop$.signal,
      userAgent: this.options.userAgent,
    });
    const settlement = settlementOf(result, event.attempts, this.options);
    return isFailure(result) ? { settlement, failure: describe(result) } : { settlement, answered: true };
  }
}

/** An answer or error that §27.5 retries: what a receiver's circuit counts against it. */
function isFailure(result: TryResult): boolean {
  if (result.kind === 'error') return true;
  return result.status === 408 || result.status === 425 || result.status === 429 || result.status >= 500;
}

function describe(result: TryResult): string {
  return result.kind === 'error' ? result.message : `the receiver answered ${result.status}`;
}
