/**
 * The processes a benchmark run starts (by PID, through test/helpers/processes.ts) and what it reads from them:
 * CPU time from /proc/<pid>/stat, the live heap through the SIGUSR2 probe (probe.mjs), Redis INFO.
 */
import { spawnSync } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { pathToFileURL } from 'node:url';
import getPort from 'get-port';
import { Redis } from 'ioredis';
import { createKeys } from '@taskrelay/shared';
import {
  PYTHON,
  ROOT,
  WORKER_MAIN,
  spawnNode,
  spawnProcess,
  type GatewayProcess,
  type ManagedProcess,
} from '../../test/helpers/processes.js';
import { waitFor } from '../../test/helpers/wait-for.js';
import { sleep } from './stats.js';

export const BENCH_DIR = resolve(ROOT, 'bench');
export const BENCH_TOOLS = resolve(BENCH_DIR, 'bench-tools.mjs');
/** The Python worker's bench tools (the same `bench_noop`). */
export const BENCH_PY_TOOLS = resolve(BENCH_DIR, 'bench_tools.py');
const PROBE = pathToFileURL(resolve(BENCH_DIR, 'lib/probe.mjs')).href;
export const probeDir = mkdtempSync(join(tmpdir(), 'taskrelay-bench-probe-'));
export const removeProbeDir = () => rmSync(probeDir, { recursive: true, force: true });

/** Environment every spawned Node process gets: the heap probe, GC exposed, quiet logs. */
export function probeEnv(extraNodeOptions = ''): Record<string, string> {
  return {
    NODE_OPTIONS: `--expose-gc ${extraNodeOptions} --import=${PROBE}`.replace(/\s+/g, ' ').trim(),
    BENCH_PROBE_DIR: probeDir,
    LOG_LEVEL: 'warn',
  };
}

/**
 * How long a spawned process may take to become ready: on a busy 2-core machine (load average 20) a gateway took 9 s
 * alone and over 20 s beside a benchmark, so the test helpers' 20 s failed whole runs before anything was measured.
 */
const STARTUP_TIMEOUT_MS = 90_000;

const CLK_TCK = (() => {
  const out = spawnSync('getconf', ['CLK_TCK'], { encoding: 'utf8' });
  const n = Number(out.stdout?.trim());
  return Number.isFinite(n) && n > 0 ? n : 100;
})();

/** utime + stime of a process, in ms (resolution 1000 / CLK_TCK ms, usually 10 ms). NaN when it is gone. */
export function cpuMs(pid: number): number {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    // Fields 14 and 15 of proc(5); `fields` starts at field 3 (state).
    return ((Number(fields[11]) + Number(fields[12])) * 1000) / CLK_TCK;
  } catch {
    return Number.NaN;
  }
}

/**
 * Read and write system calls a process has made (`syscr` + `syscw` of /proc/<pid>/io; NaN when gone): each socket
 * send and receive is one, so their count per operation is the hops an operation costs, whatever their CPU.
 */
export function ioSyscalls(pid: number | 'self'): number {
  try {
    const io = readFileSync(`/proc/${pid}/io`, 'utf8');
    const r = /syscr:\s+(\d+)/.exec(io);
    const w = /syscw:\s+(\d+)/.exec(io);
    return r && w ? Number(r[1]) + Number(w[1]) : Number.NaN;
  } catch {
    return Number.NaN;
  }
}

/** Resident set size in bytes from /proc/<pid>/status (NaN when gone). */
export function rssBytes(pid: number): number {
  try {
    const status = readFileSync(`/proc/${pid}/status`, 'utf8');
    const m = /VmRSS:\s+(\d+) kB/.exec(status);
    return m ? Number(m[1]) * 1024 : Number.NaN;
  } catch {
    return Number.NaN;
  }
}

export interface HeapSample {
  rss: number;
  heapUsed: number;
  heapTotal: number;
  external: number;
}

/** Full GC in the process, then its memoryUsage() (through probe.mjs). */
export async function probeHeap(pid: number): Promise<HeapSample> {
  const file = join(probeDir, `${pid}.json`);
  rmSync(file, { force: true });
  process.kill(pid, 'SIGUSR2');
  await waitFor(() => existsSync(file), { timeoutMs: 10_000, intervalMs: 10, message: `heap probe of pid ${pid}` });
  return JSON.parse(readFileSync(file, 'utf8')) as HeapSample;
}

export class RedisAdmin {
  readonly client: Redis;
  pid = -1;
  version = '';
  constructor(readonly url: string) {
    this.client = new Redis(url, { maxRetriesPerRequest: 1 });
  }

  async init(): Promise<void> {
    const info = await this.client.info('server');
    this.pid = Number(/process_id:(\d+)/.exec(info)?.[1] ?? -1);
    this.version = /redis_version:([^\r\n]+)/.exec(info)?.[1] ?? '';
    // The helper spawned it; make sure the pid is that local redis-server (not a container's namespace pid).
    let comm: string;
    try {
      comm = readFileSync(`/proc/${this.pid}/comm`, 'utf8').trim();
    } catch {
      comm = '';
    }
    if (!comm.startsWith('redis')) this.pid = -1;
  }

  async usedMemory(): Promise<number> {
    const info = await this.client.info('memory');
    return Number(/used_memory:(\d+)/.exec(info)?.[1] ?? NaN);
  }

  dbsize(): Promise<number> {
    return this.client.dbsize();
  }

  close(): void {
    this.client.disconnect();
  }
}

/** A gateway-and-workers deployment under one key prefix (its own queue): topologies do not see each other's jobs. */
export interface Stack {
  name: string;
  prefix: string;
  gateways: GatewayProcess[];
  workers: ManagedProcess[];
}

export interface StackOptions {
  name: string;
  prefix: string;
  redisUrl: string;
  gateways: number;
  workers: number;
  workerConcurrency: number;
  env?: Record<string, string>;
  /**
   * Another checkout (built) to run the gateways and workers from, for A/B runs of two versions (`pnpm bench --ab`).
   * Default: this one.
   */
  root?: string;
  /** The workers are Python workers (`python -m taskrelay_worker`, bench/bench_tools.py): needs `.venv`. */
  python?: boolean;
}

/** A gateway from another checkout's dist (as `startGatewayProcess` starts this one's). */
async function startGatewayAt(root: string, env: Record<string, string>): Promise<GatewayProcess> {
  const port = await getPort({ host: '127.0.0.1' });
  const proc = spawnNode(resolve(root, 'packages/gateway/dist/main.js'), {
    HOST: '127.0.0.1',
    PORT: String(port),
    ...env,
  });
  const base = `http://127.0.0.1:${port}`;
  await waitFor(
    async () => {
      if (proc.child.exitCode !== null) throw new Error(`gateway exited: ${proc.output().slice(-1_000)}`);
      const res = await fetch(`${base}/readyz`).catch(() => undefined);
      return res?.status === 200;
    },
    { timeoutMs: STARTUP_TIMEOUT_MS, message: `gateway of ${root} did not become ready` },
  );
  return Object.assign(proc, { url: `${base}/mcp`, port });
}

export async function startStack(options: StackOptions): Promise<Stack> {
  const env = { REDIS_URL: options.redisUrl, TASKRELAY_PREFIX: options.prefix, ...probeEnv(), ...options.env };
  const gateways = await Promise.all(
    Array.from({ length: options.gateways }, async (_, i) =>
      label(
        // A busy machine starts a gateway slowly (STARTUP_TIMEOUT_MS, not the tests' 20 s).
        await startGatewayAt(options.root ?? ROOT, env),
        `${options.name} gateway ${i + 1}`,
      ),
    ),
  );
  const workers = Array.from({ length: options.workers }, (_, i) =>
    label(
      options.python
        ? spawnProcess(PYTHON ?? 'python3', ['-m', 'taskrelay_worker'], {
            ...env,
            TASKRELAY_TOOLS: BENCH_PY_TOOLS,
            WORKER_CONCURRENCY: String(options.workerConcurrency),
          })
        : spawnNode(options.root === undefined ? WORKER_MAIN : resolve(options.root, 'packages/worker/dist/main.js'), {
            ...env,
            TASKRELAY_TOOLS: BENCH_TOOLS,
            WORKER_CONCURRENCY: String(options.workerConcurrency),
          }),
      `${options.name} worker ${i + 1}`,
    ),
  );
  // Ready = every worker has published its catalog (the workers run at LOG_LEVEL=warn, so no "worker ready" line).
  const redis = new Redis(options.redisUrl);
  try {
    const key = createKeys(options.prefix).workers;
    await waitFor(
      async () => {
        const dead = workers.find((w) => w.child.exitCode !== null);
        if (dead) throw new Error(`worker of ${options.name} exited: ${dead.output().slice(-500)}`);
        return (await redis.zcount(key, Date.now(), '+inf')) >= options.workers;
      },
      { timeoutMs: STARTUP_TIMEOUT_MS, message: `workers of ${options.name} did not become ready` },
    );
  } finally {
    redis.disconnect();
  }
  return { name: options.name, prefix: options.prefix, gateways, workers };
}

/** The SDK peer (bench/peer-server.ts, run through tsx's loader) on a free loopback port. */
export async function startPeer(): Promise<GatewayProcess> {
  const port = await getPort({ host: '127.0.0.1' });
  const proc = label(
    spawnNode(resolve(BENCH_DIR, 'peer-server.ts'), { ...probeEnv('--import=tsx'), PORT: String(port) }),
    'SDK peer',
  );
  const base = `http://127.0.0.1:${port}`;
  await waitFor(
    async () => {
      if (proc.child.exitCode !== null) throw new Error(`peer exited: ${proc.output().slice(-500)}`);
      const res = await fetch(`${base}/healthz`).catch(() => undefined);
      return res?.status === 200;
    },
    { timeoutMs: STARTUP_TIMEOUT_MS, message: 'peer server did not become ready' },
  );
  return Object.assign(proc, { url: `${base}/mcp`, port });
}

/** The raw BullMQ floor worker (bench/floor-worker.mjs). */
export async function startFloorWorker(redisUrl: string, queue: string, concurrency: number): Promise<ManagedProcess> {
  const proc = label(
    spawnNode(resolve(BENCH_DIR, 'floor-worker.mjs'), {
      ...probeEnv(),
      REDIS_URL: redisUrl,
      BENCH_QUEUE: queue,
      BENCH_CONCURRENCY: String(concurrency),
    }),
    'raw BullMQ worker',
  );
  await waitFor(
    () => {
      if (proc.child.exitCode !== null) throw new Error(`floor worker exited: ${proc.output().slice(-500)}`);
      return proc.output().includes('floor worker ready');
    },
    { timeoutMs: STARTUP_TIMEOUT_MS, message: 'floor worker did not become ready' },
  );
  return proc;
}

/** What each spawned process is (for error messages), by pid. */
const labels = new Map<number, string>();
function label<T extends ManagedProcess>(proc: T, name: string): T {
  labels.set(proc.pid, name);
  return proc;
}

/** A process that died while the benchmark ran: named in the error of the scenario that needed it. */
export function assertAlive(procs: ManagedProcess[], what: string): void {
  const dead = procs.find((p) => p.child.exitCode !== null || p.child.signalCode !== null);
  if (dead) {
    const output = dead.output().trim().slice(-400);
    throw new Error(
      `${what} skipped: ${labels.get(dead.pid) ?? 'process'} (pid ${dead.pid}) exited ` +
        `(${dead.child.exitCode ?? dead.child.signalCode})${output ? `: ${output}` : ''}`,
    );
  }
}

export { sleep };
