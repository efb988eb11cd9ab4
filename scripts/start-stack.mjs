#!/usr/bin/env node
// `pnpm start`: the whole stack in one command. Without REDIS_URL it starts a private redis-server on a free port
// (data in a temp dir), then one gateway and one demo worker as child processes, prints the MCP URL once the gateway
// is ready, and stops everything on Ctrl-C. Children log pino JSON; on a terminal it is shown through pino-pretty
// (a dev dependency; LOG_FORMAT=json keeps the JSON lines, and so does a stdout that is not a terminal).
import { spawn, spawnSync } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { createConnection, createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

const root = dirname(dirname(fileURLToPath(import.meta.url)));
const GATEWAY_MAIN = join(root, 'packages', 'gateway', 'dist', 'main.js');
const WORKER_MAIN = join(root, 'packages', 'worker', 'dist', 'main.js');
const STOP_GRACE_MS = 10_000;
const REDIS_START_TIMEOUT_MS = 10_000;
const READY_TIMEOUT_MS = 30_000;
/** The Inspector the README pins: an unpinned one on Node 20 resolves to 0.15.0, which cannot call task-only tools. */
const INSPECTOR_VERSION = '0.21.2';

const host = process.env['HOST'] ?? '127.0.0.1';
/** One pino-pretty stream shared by the children, so their lines never interleave mid-line. */
const prettyLogs = await prettyStream();

async function prettyStream() {
  if (!process.stdout.isTTY || process.env['LOG_FORMAT'] === 'json') return undefined;
  try {
    const { default: pretty } = await import('pino-pretty');
    return pretty({ colorize: true, singleLine: true, translateTime: 'SYS:HH:MM:ss.l', ignore: 'pid,hostname' });
  } catch {
    return undefined; // not installed: plain JSON lines
  }
}
const port = process.env['PORT'] ?? '3000';

/** @type {{ name: string, child: import('node:child_process').ChildProcess }[]} */
const children = [];
let tempDir;
let stopping = false;

function say(message) {
  process.stderr.write(`taskrelay: ${message}\n`);
}

// ---------------------------------------------------------------------------------------------------------------
// Shutdown: app processes first (they drain while Redis is still up), then Redis, then the temp dir.

function waitForExit(child, timeoutMs) {
  if (child.exitCode !== null || child.signalCode !== null) return Promise.resolve();
  return new Promise((resolve) => {
    const timer = setTimeout(() => {
      child.kill('SIGKILL');
    }, timeoutMs);
    child.once('exit', () => {
      clearTimeout(timer);
      resolve();
    });
  });
}

async function stopChildren(names) {
  const targets = children.filter((c) => names.includes(c.name));
  for (const { child } of targets) {
    if (child.exitCode === null && child.signalCode === null) child.kill('SIGTERM');
  }
  await Promise.all(targets.map(({ child }) => waitForExit(child, STOP_GRACE_MS)));
}

function removeTempDir() {
  if (tempDir === undefined) return;
  rmSync(tempDir, { recursive: true, force: true });
  tempDir = undefined;
}

async function shutdown(exitCode) {
  if (stopping) return;
  stopping = true;
  await stopChildren(['gateway', 'worker']);
  await stopChildren(['redis-server']);
  removeTempDir();
  process.exit(exitCode);
}

process.on('SIGINT', () => {
  if (stopping) {
    // A second Ctrl-C: do not wait for drains.
    for (const { child } of children) child.kill('SIGKILL');
    return;
  }
  say('stopping…');
  void shutdown(0);
});
process.on('SIGTERM', () => void shutdown(0));
process.on('SIGHUP', () => void shutdown(0));
// Last resort (an unexpected exception): never leave a child behind.
process.on('exit', () => {
  for (const { child } of children) {
    if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL');
  }
  removeTempDir();
});

/** Fails the stack: one line saying why, everything stopped, exit 1. */
function fail(message) {
  if (stopping) return;
  say(message);
  void shutdown(1);
}

// ---------------------------------------------------------------------------------------------------------------
// Children

/** Whole lines only into the shared pretty stream, so two children's output never mixes within a line. */
function pipeLines(from, to) {
  let rest = '';
  from.setEncoding('utf8');
  from.on('data', (chunk) => {
    const lines = (rest + chunk).split('\n');
    rest = lines.pop() ?? '';
    for (const line of lines) to.write(`${line}\n`);
  });
  from.on('end', () => {
    if (rest) to.write(`${rest}\n`);
  });
}

function start(name, command, args, env) {
  // Own process group: a terminal Ctrl-C reaches only us, and we stop the children in order (apps, then Redis).
  const stdout = prettyLogs && name !== 'redis-server' ? 'pipe' : 'inherit';
  const child = spawn(command, args, { cwd: root, env, stdio: ['ignore', stdout, 'inherit'], detached: true });
  if (stdout === 'pipe') pipeLines(child.stdout, prettyLogs);
  children.push({ name, child });
  child.on('error', (error) => fail(`could not start ${name}: ${error.message}`));
  child.on('exit', (code, signal) => {
    if (stopping) return;
    if (name === 'redis-server') printRedisLogTail();
    fail(`${name} exited unexpectedly (${signal ?? `exit code ${code}`}); stopping the stack`);
  });
  return child;
}

function printRedisLogTail() {
  try {
    const lines = readFileSync(join(tempDir, 'redis.log'), 'utf8').trimEnd().split('\n').slice(-5);
    process.stderr.write(lines.map((line) => `  redis-server: ${line}\n`).join(''));
  } catch {
    // No log: the exit line says enough.
  }
}

function freePort() {
  return new Promise((resolve, reject) => {
    const server = createServer();
    server.unref();
    server.once('error', reject);
    server.listen(0, '127.0.0.1', () => {
      const address = server.address();
      server.close(() => resolve(address.port));
    });
  });
}

/** Resolves when host:port can be listened on; rejects with the listen error (EADDRINUSE, EACCES…) otherwise. */
function checkPortFree(listenHost, listenPort) {
  return new Promise((resolve, reject) => {
    const server = createServer();
    server.unref();
    server.once('error', reject);
    server.listen(Number(listenPort), listenHost, () => server.close(() => resolve()));
  });
}

/** One raw RESP `PING` over TCP: true on `+PONG`. */
function redisPing(redisPort) {
  return new Promise((resolve) => {
    const socket = createConnection({ host: '127.0.0.1', port: redisPort });
    const done = (ok) => {
      socket.destroy();
      resolve(ok);
    };
    socket.setTimeout(1000, () => done(false));
    socket.once('error', () => done(false));
    socket.once('connect', () => socket.write('PING\r\n'));
    socket.once('data', (data) => done(data.toString().startsWith('+PONG')));
  });
}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

async function waitUntil(check, timeoutMs) {
  const deadline = Date.now() + timeoutMs;
  while (!stopping) {
    if (await check()) return true;
    if (Date.now() > deadline) return false;
    await sleep(100);
  }
  return false;
}

function hasRedisServer() {
  return spawnSync('redis-server', ['--version'], { stdio: 'ignore' }).status === 0;
}

async function startPrivateRedis() {
  const redisPort = await freePort();
  tempDir = mkdtempSync(join(tmpdir(), 'taskrelay-redis-'));
  start(
    'redis-server',
    'redis-server',
    [
      '--port',
      String(redisPort),
      '--bind',
      '127.0.0.1',
      '--dir',
      tempDir,
      '--save',
      '',
      '--appendonly',
      'no',
      '--loglevel',
      'warning',
      // Its log goes to a file so that our stdout stays pino JSON lines; its tail is shown if it dies.
      '--logfile',
      join(tempDir, 'redis.log'),
    ],
    process.env,
  );
  if (!(await waitUntil(() => redisPing(redisPort), REDIS_START_TIMEOUT_MS))) {
    fail(`redis-server did not answer on 127.0.0.1:${redisPort} within ${REDIS_START_TIMEOUT_MS / 1000} s`);
    return undefined;
  }
  return `redis://127.0.0.1:${redisPort}`;
}

async function gatewayReady(url) {
  try {
    const response = await fetch(url, { signal: AbortSignal.timeout(2000) });
    return response.status === 200;
  } catch {
    return false;
  }
}

/** The address a client on this machine dials: wildcard listen addresses become loopback, IPv6 gets brackets. */
function dialHost(listenHost) {
  if (listenHost === '0.0.0.0' || listenHost === '') return '127.0.0.1';
  if (listenHost === '::') return '[::1]';
  return listenHost.includes(':') && !listenHost.startsWith('[') ? `[${listenHost}]` : listenHost;
}

function banner(mcpUrl, redisUrl, privateRedis) {
  const auth = process.env['TASKRELAY_AUTH_TOKENS']
    ? '\n  Authentication is on (TASKRELAY_AUTH_TOKENS): send "Authorization: Bearer <token>".'
    : '';
  const lines = [
    '',
    'taskrelay is running: 1 gateway, 1 demo worker' +
      (privateRedis ? `, private Redis at ${redisUrl} (temporary)` : `, Redis at ${redactUrl(redisUrl)}`),
    '',
    `  MCP endpoint: ${mcpUrl}`,
    '',
    '  Try it:',
    `    node examples/call-build-report.mjs ${mcpUrl}`,
    `    npx taskrelay --url ${mcpUrl} call build_report report=q3 items=20 --task`,
    `    npx @modelcontextprotocol/inspector@${INSPECTOR_VERSION}   (Node 22.7.5+; UI: transport "Streamable HTTP", URL ${mcpUrl})` +
      auth,
    '',
    ...pythonWorkerLines(redisUrl),
    '',
    '  Ctrl-C stops everything.',
    '',
  ];
  process.stdout.write(lines.join('\n') + '\n');
}

/**
 * What to paste into another shell, in this folder, to add a Python worker to this stack (docs/PYTHON.md): the Redis
 * it must use (a private one is on a random port) and the prefix, serving the example tool. The venv line only while
 * there is no `.venv` with the worker yet (npm test's bootstrap makes one).
 */
function pythonWorkerLines(redisUrl) {
  const venv = join(root, '.venv', 'bin', 'taskrelay-worker');
  const prefix = process.env['TASKRELAY_PREFIX'] ? ` TASKRELAY_PREFIX=${process.env['TASKRELAY_PREFIX']}` : '';
  return [
    '  A Python worker on this stack (paste into another shell, in this folder):',
    ...(existsSync(venv) ? [] : ['    python3 -m venv .venv && .venv/bin/pip install -e packages/worker-python']),
    `    REDIS_URL=${redisUrl}${prefix} TASKRELAY_TOOLS=examples/python-worker/train.py .venv/bin/taskrelay-worker`,
  ];
}

function redactUrl(url) {
  try {
    const parsed = new URL(url);
    if (parsed.password) parsed.password = '***';
    return parsed.toString();
  } catch {
    return url;
  }
}

// ---------------------------------------------------------------------------------------------------------------

async function main() {
  for (const [name, file] of [
    ['gateway', GATEWAY_MAIN],
    ['worker', WORKER_MAIN],
  ]) {
    if (!existsSync(file)) {
      say(`${name} is not built (${file} is missing): run \`pnpm build\` (or \`pnpm start\`, which builds first)`);
      process.exit(1);
    }
  }

  // Whatever else answers on the port would pass the readiness check below and be announced as taskrelay.
  try {
    await checkPortFree(host, port);
  } catch (error) {
    const why = error && error.code === 'EADDRINUSE' ? 'is already in use' : `cannot be listened on (${error.message})`;
    say(`${host}:${port} ${why}: stop whatever listens there, or start with another PORT (PORT=3100 pnpm start)`);
    process.exit(1);
  }

  let redisUrl = process.env['REDIS_URL'];
  const privateRedis = !redisUrl;
  if (!redisUrl) {
    if (!hasRedisServer()) {
      say(
        'no REDIS_URL and no redis-server on PATH: install one (`apt-get install redis-server`, `brew install redis`) ' +
          'or run `docker compose up -d redis` and start with REDIS_URL=redis://127.0.0.1:6379',
      );
      process.exit(1);
    }
    redisUrl = await startPrivateRedis();
    if (redisUrl === undefined) return;
  }

  const env = { ...process.env, REDIS_URL: redisUrl, HOST: host, PORT: port };
  start('gateway', process.execPath, [GATEWAY_MAIN], env);
  start('worker', process.execPath, [WORKER_MAIN], env);

  const base = `http://${dialHost(host)}:${port}`;
  if (!(await waitUntil(() => gatewayReady(`${base}/readyz`), READY_TIMEOUT_MS))) {
    fail(`the gateway did not report ready at ${base}/readyz within ${READY_TIMEOUT_MS / 1000} s`);
    return;
  }
  // Ready, and still ours: a gateway that lost a race for the port has exited (and failed the stack) by now.
  const gateway = children.find((c) => c.name === 'gateway')?.child;
  if (!stopping && gateway && gateway.exitCode === null) banner(`${base}/mcp`, redisUrl, privateRedis);
}

main().catch((error) => fail(`failed to start: ${error instanceof Error ? error.message : String(error)}`));
