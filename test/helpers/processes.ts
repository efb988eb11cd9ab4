/**
 * Spawns the built entry points as real processes (docs/CONFIGURATION.md) for the cross-process suites, and ends only the
 * processes it started, by PID.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { existsSync, readFileSync, readdirSync, readlinkSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { resolve } from 'node:path';
import getPort from 'get-port';
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import {
  LoggingMessageNotificationSchema,
  ProgressNotificationSchema,
  type ClientCapabilities,
  type ProgressNotification,
} from '@modelcontextprotocol/sdk/types.js';
import { StopWaiting, waitFor } from './wait-for.js';

export const ROOT = resolve(fileURLToPath(new URL('.', import.meta.url)), '../..');
export const GATEWAY_MAIN = resolve(ROOT, 'packages/gateway/dist/main.js');
export const WORKER_MAIN = resolve(ROOT, 'packages/worker/dist/main.js');
export const FIXTURE_TOOLS = resolve(ROOT, 'test/fixtures/tools.mjs');

export interface ManagedProcess {
  readonly child: ChildProcess;
  readonly pid: number;
  /** Everything the process printed so far (stdout + stderr). */
  output(): string;
  /** Parsed pino JSON lines printed so far. */
  logs(): Array<Record<string, unknown>>;
  kill(signal?: NodeJS.Signals): Promise<number | null>;
  exited: Promise<number | null>;
}

const running = new Set<ManagedProcess>();

export function spawnNode(script: string, env: Record<string, string | undefined>): ManagedProcess {
  return spawnProcess(process.execPath, [script], env);
}

/** Any command, tracked like `spawnNode`'s (the Python worker: `spawnProcess(PYTHON, ['-m', 'taskrelay_worker'], env)`). */
export function spawnProcess(command: string, args: string[], env: Record<string, string | undefined>): ManagedProcess {
  const child = spawn(command, args, {
    cwd: ROOT,
    env: { ...process.env, LOG_LEVEL: 'info', ...env },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let out = '';
  // Each stream apart as well, for its lines: a chunk of one stream can land inside a line of the other in `out`.
  const streams = { stdout: '', stderr: '' };
  child.stdout?.on('data', (d: Buffer) => {
    out += d.toString();
    streams.stdout += d.toString();
  });
  child.stderr?.on('data', (d: Buffer) => {
    out += d.toString();
    streams.stderr += d.toString();
  });
  const exited = new Promise<number | null>((res) => child.once('exit', (code) => res(code)));
  const proc: ManagedProcess = {
    child,
    pid: child.pid ?? -1,
    output: () => out,
    logs: () =>
      [...streams.stdout.split('\n'), ...streams.stderr.split('\n')]
        .filter((l) => l.startsWith('{'))
        .flatMap((l) => {
          try {
            return [JSON.parse(l) as Record<string, unknown>];
          } catch {
            return [];
          }
        }),
    kill: async (signal = 'SIGTERM') => {
      if (child.exitCode === null && child.signalCode === null) child.kill(signal);
      return exited;
    },
    exited,
  };
  running.add(proc);
  void exited.then(() => running.delete(proc));
  return proc;
}

/** The pids of the processes this helper started that are still running. */
export function runningProcesses(): number[] {
  return [...running].map((p) => p.pid);
}

/** Stops every process this helper started (for afterAll). */
export async function stopAll(): Promise<void> {
  await Promise.all([...running].map((p) => p.kill('SIGKILL')));
}

export interface GatewayProcess extends ManagedProcess {
  url: string;
  port: number;
}

export interface StartOptions {
  /**
   * How long the process may take to become ready on a quiet machine. Default 20 s, stretched by the machine's load
   * while it waits (`waitFor`, test/helpers/load.ts): on a loaded 2-core machine, importing the gateway alone has
   * taken 17 s of wall time. A process that exits fails the wait at once, with its output.
   */
  readyTimeoutMs?: number;
}

/** Starts a gateway on a free port, or on `env.PORT` when given (a restart behind the same address). */
export async function startGatewayProcess(
  env: Record<string, string | undefined>,
  options: StartOptions = {},
): Promise<GatewayProcess> {
  for (let attempt = 1; ; attempt++) {
    try {
      return await startGatewayOnce(env, options);
    } catch (error) {
      // The free port get-port found can be taken by another process before the gateway binds it (other suites
      // start processes too): then another free port, twice at most. A port the caller chose is its own business.
      if (env['PORT'] || attempt >= 3 || !/EADDRINUSE/.test(String(error))) throw error;
    }
  }
}

/**
 * Whether process `pid` holds the listening TCP socket on `port`, from Linux's /proc (the socket tables, then the
 * process's descriptors); undefined where /proc cannot tell (another OS), so the caller goes by the answer alone.
 */
export function listensOn(pid: number, port: number): boolean | undefined {
  const tables = ['/proc/net/tcp', '/proc/net/tcp6'].filter((table) => existsSync(table));
  if (tables.length === 0) return undefined;
  // A process that is gone listens on nothing. (Undefined here once took a gateway that had just exited with
  // EADDRINUSE, behind another process's answer on its port, for ready.)
  if (!existsSync(`/proc/${pid}/fd`)) return false;
  const hexPort = port.toString(16).toUpperCase().padStart(4, '0');
  const inodes = new Set<string>();
  for (const table of tables) {
    // sl local_address rem_address st ... inode: a listener is state 0A.
    for (const line of readFileSync(table, 'utf8').split('\n').slice(1)) {
      const cols = line.trim().split(/\s+/);
      if (cols[1]?.endsWith(`:${hexPort}`) && cols[3] === '0A' && cols[9] !== undefined) inodes.add(cols[9]);
    }
  }
  if (inodes.size === 0) return false;
  let fds: string[];
  try {
    fds = readdirSync(`/proc/${pid}/fd`);
  } catch {
    return false; // the process is gone
  }
  return fds.some((fd) => {
    try {
      return inodes.has(/^socket:\[(\d+)\]$/.exec(readlinkSync(`/proc/${pid}/fd/${fd}`))?.[1] ?? '');
    } catch {
      return false; // closed meanwhile
    }
  });
}

async function startGatewayOnce(
  env: Record<string, string | undefined>,
  options: StartOptions,
): Promise<GatewayProcess> {
  const port = env['PORT'] ? Number(env['PORT']) : await getPort({ host: '127.0.0.1' });
  const proc = spawnNode(GATEWAY_MAIN, { HOST: '127.0.0.1', PORT: String(port), ...env });
  const base = `http://127.0.0.1:${port}`;
  await waitFor(
    async () => {
      if (proc.child.exitCode !== null) throw new StopWaiting(`gateway exited: ${proc.output()}`);
      const res = await fetch(`${base}/readyz`).catch(() => undefined);
      if (proc.child.exitCode !== null) throw new StopWaiting(`gateway exited: ${proc.output()}`);
      // Another suite's process that took the port first answers /readyz too, while this gateway is about to exit
      // with EADDRINUSE: only its own listener counts (then the port is retried above).
      return res?.status === 200 && listensOn(proc.pid, port) !== false;
    },
    { timeoutMs: options.readyTimeoutMs ?? 20_000, message: 'gateway did not become ready' },
  ).catch((error: unknown) => {
    // What the gateway said is what tells a slow start from a stuck one.
    throw new Error(
      `${error instanceof Error ? error.message : String(error)}; its output:\n${proc.output().slice(-3_000)}`,
    );
  });
  return Object.assign(proc, { url: `${base}/mcp`, port });
}

export async function startWorkerProcess(
  env: Record<string, string | undefined>,
  options: StartOptions = {},
): Promise<ManagedProcess> {
  const proc = spawnNode(WORKER_MAIN, env);
  await waitFor(
    () => {
      if (proc.child.exitCode !== null) throw new StopWaiting(`worker exited: ${proc.output()}`);
      return proc.logs().some((l) => l['msg'] === 'worker ready');
    },
    { timeoutMs: options.readyTimeoutMs ?? 20_000, message: 'worker did not become ready' },
  );
  return proc;
}

/**
 * The Python interpreter with taskrelay-worker installed: `TASKRELAY_PYTHON`, else the repository's `.venv` (made by
 * `npm test`'s bootstrap and `.ci/run` when Python 3.11+ is present). Undefined when neither exists.
 */
export const PYTHON: string | undefined = (() => {
  const candidate = process.env['TASKRELAY_PYTHON'] ?? resolve(ROOT, '.venv/bin/python');
  if (existsSync(candidate)) return candidate;
  // CI sets it: there the Python suites must run, never skip.
  if (process.env['TASKRELAY_REQUIRE_PYTHON'])
    throw new Error(`TASKRELAY_REQUIRE_PYTHON is set but ${candidate} is missing`);
  return undefined;
})();

/** A Python worker (`python -m taskrelay_worker`), ready once it logs `worker ready`. */
export async function startPythonWorkerProcess(
  env: Record<string, string | undefined>,
  options: StartOptions = {},
): Promise<ManagedProcess> {
  if (PYTHON === undefined) throw new Error('no Python with taskrelay-worker installed (.venv/bin/python)');
  const proc = spawnProcess(PYTHON, ['-m', 'taskrelay_worker'], env);
  await waitFor(
    () => {
      if (proc.child.exitCode !== null) throw new StopWaiting(`python worker exited: ${proc.output()}`);
      return proc.logs().some((l) => l['msg'] === 'worker ready');
    },
    { timeoutMs: options.readyTimeoutMs ?? 20_000, message: 'python worker did not become ready' },
  );
  return proc;
}

/** What a test client is, beyond its URL and headers. */
export interface ClientShape {
  /** Capabilities besides tasks (list, cancel, requests), which every test client declares. */
  capabilities?: ClientCapabilities;
  /** Where the client appends the params of every `notifications/progress` it gets. */
  progress?: ProgressNotification['params'][];
  /** Handlers set on the client before it connects (roots, elicitation…). */
  before?: (client: Client) => void;
}

export async function connectClient(
  url: string,
  headers: Record<string, string> = {},
  shape: ClientShape = {},
): Promise<Client> {
  const client = new Client(
    { name: 'taskrelay-test', version: '0.0.0' },
    { capabilities: { tasks: { list: {}, cancel: {}, requests: {} }, ...shape.capabilities } },
  );
  const { progress } = shape;
  if (progress) {
    client.setNotificationHandler(ProgressNotificationSchema, (n) => {
      progress.push(n.params);
      return Promise.resolve();
    });
  }
  shape.before?.(client);
  await client.connect(new StreamableHTTPClientTransport(new URL(url), { requestInit: { headers } }));
  return client;
}

/**
 * A client shape that files every progress notification's value under its token, and every log message's data, into
 * `progress` and `logs` (for the suites that read both of a call).
 */
export function recordingShape(progress: Map<string, number[]>, logs: unknown[]): ClientShape {
  return {
    before: (client) => {
      client.setNotificationHandler(ProgressNotificationSchema, (n) => {
        const token = String(n.params.progressToken);
        progress.set(token, [...(progress.get(token) ?? []), n.params.progress]);
        return Promise.resolve();
      });
      client.setNotificationHandler(LoggingMessageNotificationSchema, (n) => void logs.push(n.params.data));
    },
  };
}

/** One sample of a gateway's Prometheus metric (0 when absent), e.g. `metric(url, 'x_total', { trigger: 'a' })`. */
export async function readMetric(
  mcpUrl: string,
  name: string,
  labels: Record<string, string> = {},
  headers: Record<string, string> = {},
): Promise<number> {
  const text = await (await fetch(mcpUrl.replace(/\/mcp$/, '/metrics'), { headers })).text();
  const labelText = Object.entries(labels)
    .map(([k, v]) => `${k}="${v}"`)
    .join(',');
  const series = labelText ? `${name}{${labelText}}` : name;
  const line = text.split('\n').find((l) => l.startsWith(`${series} `));
  return line ? Number(line.slice(series.length + 1)) : 0;
}
