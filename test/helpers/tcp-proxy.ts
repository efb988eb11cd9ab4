/**
 * A tiny loopback TCP proxy for network faults between one process and Redis. Point a process's `REDIS_URL` at
 * `proxy.url` and it reaches the real server only through here:
 * - `pause()` stops forwarding in both directions and holds new connections (a partition: nothing is lost, TCP keeps
 *   the connection open, and everything sent meanwhile is delivered late, on `resume()`);
 * - `cut()` destroys every connection and drops new ones at once until `resume()` (the client sees resets and
 *   reconnects, replaying whatever it queued).
 */
import { createServer, connect, type Server, type Socket } from 'node:net';
import type { AddressInfo } from 'node:net';

export type ProxyState = 'open' | 'paused' | 'cut';

export interface TcpProxy {
  /** `redis://127.0.0.1:<port>` */
  readonly url: string;
  readonly port: number;
  readonly state: ProxyState;
  pause(): void;
  cut(): void;
  resume(): void;
  /** Connections accepted so far (a client that reconnected shows up again). */
  readonly accepted: number;
  close(): Promise<void>;
}

interface Pair {
  client: Socket;
  upstream: Socket;
}

export async function startTcpProxy(target: { host?: string; port: number }): Promise<TcpProxy> {
  const host = target.host ?? '127.0.0.1';
  const pairs = new Set<Pair>();
  let state: ProxyState = 'open';
  let accepted = 0;

  const setFlowing = (pair: Pair, flowing: boolean) => {
    for (const socket of [pair.client, pair.upstream]) {
      if (flowing) socket.resume();
      else socket.pause();
    }
  };

  const server: Server = createServer((client) => {
    if (state === 'cut') {
      client.destroy();
      return;
    }
    accepted++;
    client.pause();
    const upstream = connect({ host, port: target.port });
    upstream.pause();
    const pair: Pair = { client, upstream };
    pairs.add(pair);
    const drop = () => {
      pairs.delete(pair);
      client.destroy();
      upstream.destroy();
    };
    client.on('error', drop).on('close', drop);
    upstream.on('error', drop).on('close', drop);
    // pipe() would resume the sources; forward by hand so pause() really holds the bytes.
    client.on('data', (chunk: Buffer) => upstream.write(chunk));
    upstream.on('data', (chunk: Buffer) => client.write(chunk));
    upstream.once('connect', () => {
      if (state === 'open') setFlowing(pair, true);
    });
  });
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(0, '127.0.0.1', () => resolve());
  });
  const port = (server.address() as AddressInfo).port;

  return {
    url: `redis://127.0.0.1:${port}`,
    port,
    get state() {
      return state;
    },
    get accepted() {
      return accepted;
    },
    pause() {
      state = 'paused';
      for (const pair of pairs) setFlowing(pair, false);
    },
    cut() {
      state = 'cut';
      for (const pair of [...pairs]) {
        pair.client.destroy();
        pair.upstream.destroy();
      }
      pairs.clear();
    },
    resume() {
      state = 'open';
      for (const pair of pairs) if (!pair.upstream.connecting) setFlowing(pair, true);
    },
    close: () =>
      new Promise<void>((resolve) => {
        for (const pair of pairs) {
          pair.client.destroy();
          pair.upstream.destroy();
        }
        pairs.clear();
        server.close(() => resolve());
      }),
  };
}
