/**
 * A tiny loopback HTTP load balancer in front of several gateways, routing per request (as a non-sticky L7
 * balancer does): each request goes to the current upstream over a fresh connection, its response (SSE included) is
 * streamed back. `use(i)` makes upstream `i` current, so a client's next request lands on that replica even over the
 * same keep-alive connection to the balancer — a client switching replicas between polls.
 */
import { createServer, request, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';

export interface LoadBalancer {
  /** `http://127.0.0.1:<port>/mcp` */
  readonly url: string;
  use(index: number): void;
  /** Requests sent to each upstream so far. */
  readonly counts: readonly number[];
  close(): Promise<void>;
}

export async function startLoadBalancer(upstreamPorts: readonly number[]): Promise<LoadBalancer> {
  const counts = upstreamPorts.map(() => 0);
  let current = 0;
  const server: Server = createServer((req, res) => {
    const index = current;
    counts[index] = (counts[index] ?? 0) + 1;
    const upstream = request(
      {
        host: '127.0.0.1',
        port: upstreamPorts[index] ?? 0,
        method: req.method,
        path: req.url,
        headers: req.headers,
        agent: false,
      },
      (upstreamRes) => {
        res.writeHead(upstreamRes.statusCode ?? 502, upstreamRes.headers);
        upstreamRes.pipe(res);
      },
    );
    upstream.on('error', () => res.destroy());
    // The client went away (a closed SSE stream): so does the upstream request.
    res.on('close', () => upstream.destroy());
    req.pipe(upstream);
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address() as AddressInfo;
  return {
    url: `http://127.0.0.1:${port}/mcp`,
    counts,
    use(index: number) {
      current = index;
    },
    async close() {
      server.closeAllConnections();
      await new Promise<void>((resolve) => server.close(() => resolve()));
    },
  };
}
