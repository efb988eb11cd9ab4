/**
 * Plain calls in flight on this gateway, whichever transport carried them (PROTOCOL.md §11, §14).
 */
export interface InflightCallHandlers {
  /** Ends the call because the gateway is shutting down: its task is cancelled with `GATEWAY_SHUTDOWN`. */
  shutdown: () => Promise<void>;
}

export interface TrackedCall {
  /**
   * The request's signal, until the gateway starts ending calls: from then on the SDK aborting every handler as it
   * closes the transports is not the client cancelling.
   */
  readonly signal: AbortSignal;
  /** The call has answered. */
  done(): void;
}

interface Entry {
  handlers: InflightCallHandlers;
}

/**
 * Plain calls in flight, by session and JSON-RPC id (tasks are never in here): a draining gateway ends those still
 * running when its grace period is over, and from then on a request's aborted signal is no client cancel (on the
 * 2026-07-28 transport a closed response stream is one, PROTOCOL.md §14).
 */
export class InflightCalls {
  private readonly calls = new Map<string, Entry>();
  private endingCalls = false;

  /** @param onSettled called each time a call leaves the table (the drain waits for it to empty). */
  constructor(private readonly onSettled: () => void = () => undefined) {}

  get size(): number {
    return this.calls.size;
  }

  /** True once `endAll` ran: no call may start, none is cancelled as the client's. */
  get ending(): boolean {
    return this.endingCalls;
  }

  track(
    sessionId: string | undefined,
    requestId: string | number,
    requestSignal: AbortSignal,
    handlers: InflightCallHandlers,
  ): TrackedCall {
    const key = inflightKey(sessionId, requestId);
    const entry: Entry = { handlers };
    const controller = new AbortController();
    const follow = () => {
      if (!this.endingCalls) controller.abort(requestSignal.reason);
    };
    if (requestSignal.aborted) follow();
    else requestSignal.addEventListener('abort', follow, { once: true });
    this.calls.set(key, entry);
    // A call that got here after the drain ended the others (its task was still being created) ends too.
    if (this.endingCalls) void handlers.shutdown();
    return {
      signal: controller.signal,
      done: () => {
        requestSignal.removeEventListener('abort', follow);
        if (this.calls.get(key) !== entry) return;
        this.calls.delete(key);
        this.onSettled();
      },
    };
  }

  /** Ends every call in flight with `GATEWAY_SHUTDOWN` and resolves once each is cancelled (state first). */
  async endAll(): Promise<void> {
    this.endingCalls = true;
    await Promise.allSettled([...this.calls.values()].map((entry) => entry.handlers.shutdown()));
  }
}

function inflightKey(sessionId: string | undefined, requestId: string | number): string {
  return `${sessionId ?? ''}\u0000${JSON.stringify(requestId)}`;
}
