/**
 * Redis MONITOR on a plain socket: every command the server runs, as the line it prints, for tests that count round
 * trips. ioredis's own `monitor()` can take a monitor line for a command's reply while it switches modes on a busy
 * server ("Command queue state error", an uncaught exception), so this reads the lines itself.
 */
import { randomUUID } from 'node:crypto';
import { once } from 'node:events';
import { connect } from 'node:net';
import { waitFor } from './wait-for.js';

export interface MonitoredCommand {
  /** The command's name, lower case. */
  name: string;
  args: string[];
  /** Run by a Lua script (`[0 lua]`) rather than sent by a client. */
  fromLua: boolean;
  /** Who ran it: the client's `address:port`, or `lua`. */
  source: string;
}

export interface RedisMonitor {
  /** Every command seen so far, in the server's order. */
  readonly commands: MonitoredCommand[];
  /** Resolves once the monitor sees the commands `probe` sends from then on. */
  ready(probe: (marker: string) => Promise<unknown>): Promise<void>;
  close(): void;
}

export async function monitorRedis(url: string): Promise<RedisMonitor> {
  const { hostname, port } = new URL(url);
  const socket = connect(Number(port || 6379), hostname);
  await once(socket, 'connect');
  socket.setEncoding('utf8');
  const commands: MonitoredCommand[] = [];
  let buffer = '';
  socket.on('data', (chunk: string) => {
    buffer += chunk;
    for (let end = buffer.indexOf('\r\n'); end >= 0; end = buffer.indexOf('\r\n')) {
      const line = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      const parsed = parseLine(line);
      if (parsed) commands.push(parsed);
    }
  });
  socket.on('error', () => undefined);
  socket.write('MONITOR\r\n');
  return {
    commands,
    ready: async (probe) => {
      const marker = `monitor-ready-${randomUUID()}`;
      await waitFor(async () => {
        await probe(marker);
        return commands.some((c) => c.args.includes(marker));
      });
    },
    close: () => socket.destroy(),
  };
}

/** `+1700000000.123456 [0 127.0.0.1:5000] "evalsha" "abc" "1" "key"` → its command; undefined for other lines. */
function parseLine(line: string): MonitoredCommand | undefined {
  const source = /^\+\d+\.\d+ \[\d+ ([^\]]+)\] /.exec(line);
  if (!source) return undefined;
  const args = [...line.slice(source[0].length).matchAll(/"((?:[^"\\]|\\.)*)"/g)].map((m) =>
    (m[1] ?? '').replace(/\\(.)/g, '$1'),
  );
  const [name = '', ...rest] = args;
  return { name: name.toLowerCase(), args: rest, fromLua: source[1] === 'lua', source: source[1] ?? '' };
}
