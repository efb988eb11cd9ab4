/**
 * What a polling client sees (issue 25, PROTOCOL.md §28): the SDK's own `callToolStream` (tools/call with `task`, then
 * `tasks/get` at the `pollInterval` of the last task it read, then `tasks/result`) on a `bench_hold` task of
 * `holdMs`, one at a time. Reports the time from the call to its result (p50/p99) and the `tasks/get` reads each
 * task cost, counted on the client's own HTTP requests: the load the suggested interval adds.
 */
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import { CallToolResultSchema } from '@modelcontextprotocol/sdk/types.js';
import { latency, now } from './stats.js';

export interface PollingFigures {
  p50: number;
  p99: number;
  /** `tasks/get` requests per task (mean). */
  readsPerTask: number;
  [key: string]: number;
}

export async function pollingClient(url: string, holdMs: number, tasks: number): Promise<PollingFigures> {
  let reads = 0;
  const counting: typeof fetch = async (input, init) => {
    if (typeof init?.body === 'string' && init.body.includes('"method":"tasks/get"')) reads++;
    return fetch(input, init);
  };
  const client = new Client({ name: 'bench-polling', version: '1.0.0' });
  await client.connect(new StreamableHTTPClientTransport(new URL(url), { fetch: counting }));
  try {
    const samples: number[] = [];
    for (let i = 0; i < tasks; i++) {
      const started = now();
      const stream = client.experimental.tasks.callToolStream(
        { name: 'bench_hold', arguments: { ms: holdMs } },
        CallToolResultSchema,
        { task: { ttl: 60_000 } },
      );
      let done = false;
      for await (const message of stream) {
        if (message.type === 'error') throw message.error;
        if (message.type === 'result') done = true;
      }
      if (!done) throw new Error('the stream ended without a result');
      samples.push(now() - started);
    }
    const { p50, p99 } = latency(samples);
    return { p50, p99, readsPerTask: reads / tasks };
  } finally {
    await client.close();
  }
}
