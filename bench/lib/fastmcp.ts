/**
 * FastMCP + Docket, the second peer of `pnpm bench --sdk --fastmcp` (issue 37): its virtualenv and its process.
 *
 * The virtualenv is `.venv-bench` at the repository root, made here on the first `--fastmcp` run (`python3 -m venv`,
 * then `pip install -r bench/fastmcp-requirements.txt`, about 20 s from PyPI) and reinstalled when that file changes.
 * Nothing else makes it: not `npm test`, not CI, not bootstrap; it stays apart from the Python worker's `.venv`
 * because FastMCP pins its own `mcp`, `pydantic` and `redis`.
 */
import { spawnSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import { existsSync, readFileSync, writeFileSync } from 'node:fs';
import { resolve } from 'node:path';
import getPort from 'get-port';
import { ROOT, spawnProcess, type GatewayProcess } from '../../test/helpers/processes.js';
import { waitFor } from '../../test/helpers/wait-for.js';
import { BENCH_DIR } from './procs.js';

const VENV = resolve(ROOT, '.venv-bench');
const VENV_PYTHON = resolve(VENV, 'bin/python');
const REQUIREMENTS = resolve(BENCH_DIR, 'fastmcp-requirements.txt');
const STAMP = resolve(VENV, '.taskrelay-bench-installed');
const PEER = resolve(BENCH_DIR, 'fastmcp_peer.py');
const STARTUP_TIMEOUT_MS = 90_000;

function run(command: string, args: string[]): void {
  const result = spawnSync(command, args, { cwd: ROOT, stdio: ['ignore', 'inherit', 'inherit'] });
  if (result.error) throw new Error(`could not run ${command}: ${result.error.message}`);
  if (result.status !== 0) throw new Error(`\`${[command, ...args].join(' ')}\` failed (exit ${result.status})`);
}

/** `.venv-bench` with FastMCP installed (made or updated when needed); the interpreter's path. */
export function ensureFastmcpVenv(log: (message: string) => void): string {
  const digest = createHash('sha256').update(readFileSync(REQUIREMENTS)).digest('hex');
  if (existsSync(STAMP) && readFileSync(STAMP, 'utf8') === digest) return VENV_PYTHON;
  const started = Date.now();
  if (!existsSync(VENV_PYTHON)) {
    // FastMCP 4 needs Python 3.10+.
    const python = ['python3', 'python'].find(
      (bin) => spawnSync(bin, ['-c', 'import sys; sys.exit(0 if sys.version_info >= (3, 10) else 1)']).status === 0,
    );
    if (!python) throw new Error('--fastmcp needs Python 3.10+ on PATH (FastMCP 4)');
    log(`making .venv-bench (${python} -m venv) for the FastMCP peer`);
    run(python, ['-m', 'venv', VENV]);
  }
  log('installing FastMCP and Docket into .venv-bench (pip install -r bench/fastmcp-requirements.txt)');
  run(VENV_PYTHON, ['-m', 'pip', 'install', '--quiet', '--disable-pip-version-check', '-r', REQUIREMENTS]);
  writeFileSync(STAMP, digest);
  log(`.venv-bench ready in ${((Date.now() - started) / 1000).toFixed(1)} s`);
  return VENV_PYTHON;
}

export interface FastmcpPeerOptions {
  python: string;
  /** The bench's Redis; Docket gets a db of its own on it (`db`) and its keys under `name`. */
  redisUrl: string;
  db: number;
  name: string;
  /** `pollIntervalMs` suggested for a task (FastMCP's default is 5000). */
  pollIntervalMs: number;
  /** Docket's worker slots. */
  concurrency: number;
}

/** bench/fastmcp_peer.py on a free loopback port, Docket's worker inside it; ready when /healthz answers. */
export async function startFastmcpPeer(o: FastmcpPeerOptions): Promise<GatewayProcess> {
  const port = await getPort({ host: '127.0.0.1' });
  const docketUrl = new URL(o.redisUrl);
  docketUrl.pathname = `/${o.db}`;
  const proc = spawnProcess(o.python, [PEER], {
    PORT: String(port),
    BENCH_DOCKET_URL: docketUrl.href,
    BENCH_DOCKET_NAME: o.name,
    BENCH_POLL_INTERVAL_MS: String(o.pollIntervalMs),
    BENCH_DOCKET_CONCURRENCY: String(o.concurrency),
    // FastMCP reads a `.env` of the working directory (the repository root) for its settings: none here.
    FASTMCP_ENV_FILE: '/dev/null',
    PYTHONUNBUFFERED: '1',
  });
  const base = `http://127.0.0.1:${port}`;
  await waitFor(
    async () => {
      if (proc.child.exitCode !== null) throw new Error(`FastMCP peer exited: ${proc.output().slice(-1_000)}`);
      const res = await fetch(`${base}/healthz`).catch(() => undefined);
      return res?.status === 200;
    },
    { timeoutMs: STARTUP_TIMEOUT_MS, message: 'FastMCP peer did not become ready' },
  );
  return Object.assign(proc, { url: `${base}/mcp`, port });
}
