#!/usr/bin/env node
// CI's newcomer check (`.ci/run`, after the tests): does a fresh clone start the way the README says?
//   1. clones this repository (its committed HEAD) into a temp folder;
//   2. runs the README's start command there exactly as written (read from README.md's "Set up" block), on a free
//      PORT, in a process group of its own, as a terminal would;
//   3. once it says it is running, calls the demo tool `build_report` through the official SDK client, as a task
//      and as a plain call;
//   4. sends SIGINT to the whole group (a terminal's Ctrl-C), waits for it to exit, and checks that no new TCP
//      listener is left on this machine and that no process still runs from the clone;
//   5. edits one Lua command in the clone and runs bootstrap again: the edit must reach dist/, once (a second run
//      builds nothing).
// Exits 0 with one line per step, or 1 with the reason and the tail of what the stack printed.
import { spawn, spawnSync } from 'node:child_process';
import {
  appendFileSync,
  mkdirSync,
  mkdtempSync,
  readFileSync,
  readdirSync,
  readlinkSync,
  rmSync,
  writeFileSync,
} from 'node:fs';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';

const root = dirname(dirname(fileURLToPath(import.meta.url)));
/** A fresh clone installs and builds before it serves: minutes on a loaded 2-core machine, seconds on a warm one. */
const START_TIMEOUT_MS = Number(process.env['NEWCOMER_START_TIMEOUT_MS'] ?? 600_000);
const STOP_TIMEOUT_MS = 60_000;

const say = (message) => process.stdout.write(`newcomer: ${message}\n`);
let output = '';
let dir;

function fail(message) {
  process.stderr.write(`newcomer: FAILED: ${message}\n`);
  if (output)
    process.stderr.write(`--- what the start command printed (last 4000 characters) ---\n${output.slice(-4000)}\n`);
  if (dir) rmSync(dir, { recursive: true, force: true });
  process.exit(1);
}

/** The README's command for a step of its "Set up" block: the line that starts with `npm start`, without its comment. */
export function readmeCommand(readme, verb) {
  const setUp = readme.split(/^## /m).find((section) => section.startsWith('Set up'));
  const block = setUp && /```sh\n([\s\S]*?)```/.exec(setUp);
  const line = block?.[1]
    .split('\n')
    .find((l) => l.trim().startsWith(`npm ${verb}`) || l.trim().startsWith(`pnpm ${verb}`));
  if (!line) fail(`README.md's "Set up" block has no \`npm ${verb}\` line`);
  return line.replace(/#.*$/, '').trim();
}

/** Whether `port` (0: any) can be listened on at 127.0.0.1 now: the port, or undefined. */
function listenable(port) {
  return new Promise((resolve) => {
    const server = createServer();
    server.once('error', () => resolve(undefined));
    server.listen(port, '127.0.0.1', () => {
      const bound = server.address().port;
      server.close(() => resolve(bound));
    });
  });
}

/**
 * A free port for the stack's gateway, below the kernel's ephemeral range. The gateway binds it some 20 s later (after
 * install and build), and a port from that range (what `listen(0)` picks) may meanwhile become the local end of any
 * outgoing connection on the machine, the stack's own Redis clients included: CI saw the gateway refused with
 * EADDRINUSE once. Nothing hands out ports below the range by itself.
 */
async function freePort() {
  let low = 32768;
  try {
    low = Number(readFileSync('/proc/sys/net/ipv4/ip_local_port_range', 'utf8').trim().split(/\s+/)[0]) || low;
  } catch {
    // Not Linux: the default range's start.
  }
  const from = Math.min(20_000, low - 1_000);
  for (let tries = 0; tries < 50 && low - from > 1; tries++) {
    const port = await listenable(from + Math.floor(Math.random() * (low - from)));
    if (port !== undefined) return port;
  }
  const any = await listenable(0);
  if (any === undefined) fail('no free port to start the stack on');
  return any;
}

/** Local ports in LISTEN state, IPv4 and IPv6 (/proc/net/tcp{,6}: state 0A), each with its socket's inode. */
function listeners() {
  const ports = new Map();
  for (const file of ['/proc/net/tcp', '/proc/net/tcp6']) {
    let text;
    try {
      text = readFileSync(file, 'utf8');
    } catch {
      continue;
    }
    for (const line of text.split('\n').slice(1)) {
      const fields = line.trim().split(/\s+/);
      if (fields[3] === '0A') {
        ports.set(`${file.endsWith('6') ? 'v6' : 'v4'}:${parseInt(fields[1].split(':')[1], 16)}`, fields[9]);
      }
    }
  }
  return ports;
}

/** The processes holding socket `inode`, each with whether its environment carries `marker` (the stack's own). */
function holdersOf(inode, marker) {
  const found = [];
  for (const pid of readdirSync('/proc').filter((name) => /^\d+$/.test(name))) {
    try {
      const fds = readdirSync(`/proc/${pid}/fd`);
      if (!fds.some((fd) => readlinkSync(`/proc/${pid}/fd/${fd}`) === `socket:[${inode}]`)) continue;
      const ours = readFileSync(`/proc/${pid}/environ`, 'utf8').split('\0').includes(marker);
      found.push({ pid, ours, cmdline: readFileSync(`/proc/${pid}/cmdline`, 'utf8').replace(/\0/g, ' ').trim() });
    } catch {
      // gone meanwhile, or not ours to read
    }
  }
  return found;
}

/** PIDs of processes whose working directory or command line is inside `folder`. */
function processesIn(folder) {
  const found = [];
  for (const pid of readdirSync('/proc').filter((name) => /^\d+$/.test(name))) {
    try {
      const cwd = readlinkSync(`/proc/${pid}/cwd`);
      const cmdline = readFileSync(`/proc/${pid}/cmdline`, 'utf8').replace(/\0/g, ' ');
      if (cwd.startsWith(folder) || cmdline.includes(folder)) found.push(`${pid} ${cmdline.trim()}`);
    } catch {
      // gone meanwhile, or not ours to read
    }
  }
  return found;
}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

async function callTool(url) {
  const client = new Client(
    { name: 'taskrelay-newcomer', version: '0.0.0' },
    { capabilities: { tasks: { list: {}, cancel: {}, requests: {} } } },
  );
  await client.connect(new StreamableHTTPClientTransport(new URL(url)));
  try {
    const tools = await client.listTools();
    if (!tools.tools.some((tool) => tool.name === 'build_report')) {
      fail(`tools/list has no build_report: ${tools.tools.map((t) => t.name).join(', ')}`);
    }
    const plain = await client.callTool({ name: 'build_report', arguments: { report: 'newcomer', items: 3 } });
    if (plain.isError) fail(`the plain call failed: ${JSON.stringify(plain.content)}`);
    let last;
    for await (const message of client.experimental.tasks.callToolStream(
      { name: 'build_report', arguments: { report: 'newcomer-task', items: 3 } },
      undefined,
      { task: { ttl: 60_000 } },
    )) {
      last = message;
      if (message.type === 'error') fail(`the task call failed: ${message.error.message}`);
    }
    if (last?.type !== 'result' || last.result.isError) fail(`the task call ended with ${JSON.stringify(last)}`);
    return JSON.stringify(last.result.content).slice(0, 120);
  } finally {
    await client.close();
  }
}

async function main() {
  const readme = readFileSync(join(root, 'README.md'), 'utf8');
  const command = readmeCommand(readme, 'start');
  dir = mkdtempSync(join(tmpdir(), 'taskrelay-newcomer-'));
  const clone = spawnSync('git', ['clone', '--quiet', root, dir], { encoding: 'utf8' });
  if (clone.status !== 0) fail(`git clone failed: ${clone.stderr}`);
  say(`cloned ${root} into ${dir}`);

  // As on a machine with only Node: a `pnpm` that is not there (a stub that fails) comes first on PATH, so bootstrap
  // must fetch the pinned pnpm itself. (Redis cannot be hidden the same way: CI installed it before the tests.)
  const stubs = join(dir, '.newcomer-bin');
  mkdirSync(stubs);
  writeFileSync(join(stubs, 'pnpm'), '#!/bin/sh\necho "pnpm: not installed" >&2\nexit 127\n', { mode: 0o755 });
  const port = await freePort();
  const before = listeners();
  // Every process of the stack inherits this: a listener left after SIGINT is the stack's only when its holder has it
  // (a machine running other tests meanwhile has listeners of its own, which are not the stack's).
  const stackMarker = `TASKRELAY_NEWCOMER_CHECK=${process.pid}-${Date.now()}`;
  const started = Date.now();
  say(`running \`${command}\` there (PORT=${port})`);
  const child = spawn('sh', ['-c', command], {
    cwd: dir,
    env: {
      ...process.env,
      PATH: `${stubs}:${process.env['PATH'] ?? ''}`,
      PORT: String(port),
      HOST: '127.0.0.1',
      LOG_FORMAT: 'json',
      TASKRELAY_NEWCOMER_CHECK: stackMarker.split('=')[1],
    },
    stdio: ['ignore', 'pipe', 'pipe'],
    detached: true, // its own process group, as a terminal's foreground job: SIGINT goes to the whole group
  });
  const exited = new Promise((resolve) => child.once('exit', (code, signal) => resolve({ code, signal })));
  child.stdout.on('data', (d) => (output += d.toString()));
  child.stderr.on('data', (d) => (output += d.toString()));

  const url = `http://127.0.0.1:${port}/mcp`;
  const deadline = Date.now() + START_TIMEOUT_MS;
  let ended;
  void exited.then((how) => (ended = how));
  while (!/taskrelay is running/.test(output)) {
    if (ended) fail(`\`${command}\` exited before it was running (${ended.signal ?? `exit code ${ended.code}`})`);
    if (Date.now() > deadline) {
      process.kill(-child.pid, 'SIGKILL');
      fail(`\`${command}\` did not say it was running within ${START_TIMEOUT_MS / 1000} s`);
    }
    await sleep(200);
  }
  if (!output.includes('npx pnpm@'))
    fail('bootstrap did not install with the pinned pnpm through npx (no pnpm on PATH)');
  say(`running after ${((Date.now() - started) / 1000).toFixed(1)} s (install, build, Redis, gateway, worker)`);

  try {
    const result = await callTool(url);
    say(`tools/list, a plain call and a task call of build_report through the SDK client: ok (${result})`);
  } catch (error) {
    process.kill(-child.pid, 'SIGINT');
    fail(`calling the tool failed: ${error instanceof Error ? error.message : String(error)}`);
  }

  process.kill(-child.pid, 'SIGINT');
  const stopped = await Promise.race([exited, sleep(STOP_TIMEOUT_MS).then(() => undefined)]);
  if (!stopped) {
    process.kill(-child.pid, 'SIGKILL');
    fail(`still running ${STOP_TIMEOUT_MS / 1000} s after SIGINT`);
  }
  say(`stopped by SIGINT (${stopped.signal ?? `exit code ${stopped.code}`})`);
  // The shell ends at once; the stack stops its children in order (apps drain, then Redis): wait for all of them.
  let left = processesIn(dir);
  for (let waited = 0; waited < STOP_TIMEOUT_MS && left.length > 0; waited += 100) {
    await sleep(100);
    left = processesIn(dir);
  }
  if (left.length > 0) fail(`processes still running from the clone after SIGINT:\n${left.join('\n')}`);
  const fresh = [...listeners()].filter(([p]) => !before.has(p));
  const leftListening = fresh.flatMap(([p, inode]) => {
    const holders = holdersOf(inode, stackMarker);
    // A holder we may not read is counted as the stack's: the check must not pass by not looking.
    return holders.length === 0 || holders.some((h) => h.ours)
      ? [`${p} (${holders.map((h) => `${h.pid} ${h.cmdline}`).join('; ') || 'holder unknown'})`]
      : [];
  });
  if (leftListening.length > 0) fail(`new listeners left after SIGINT: ${leftListening.join(', ')}`);
  say(
    fresh.length > 0
      ? `nothing left running from the clone; ${fresh.length} new listener(s) on this machine, none the stack's`
      : 'nothing left running from the clone, no new listener on this machine',
  );

  // A changed .lua file reaches dist/ like a changed .ts file, and only once.
  // Whatever its key count is now (`create-<n>.lua`): the name changes when the script gains a key.
  const commands = 'packages/shared/src/protocol/commands';
  const createFile = readdirSync(join(dir, commands)).find((f) => /^create-\d+\.lua$/.test(f));
  if (!createFile) fail(`no create-<n>.lua in ${commands}`);
  const lua = `${commands}/${createFile}`;
  const marker = `-- newcomer-check ${Date.now()}\n`;
  appendFileSync(join(dir, lua), marker);
  const rebuilt = spawnSync(process.execPath, ['scripts/bootstrap.mjs'], { cwd: dir, encoding: 'utf8' });
  if (rebuilt.status !== 0) fail(`bootstrap after a .lua edit failed: ${rebuilt.stderr}`);
  const copied = readFileSync(join(dir, lua.replace('/src/', '/dist/')), 'utf8');
  if (!copied.endsWith(marker))
    fail(`bootstrap did not bring the edited ${lua} into dist/ (it said: ${rebuilt.stderr.trim()})`);
  const again = spawnSync(process.execPath, ['scripts/bootstrap.mjs'], { cwd: dir, encoding: 'utf8' });
  if (again.status !== 0 || again.stderr.includes('building')) {
    fail(`bootstrap rebuilt again with nothing changed: ${again.stderr.trim()}`);
  }
  say('a .lua edit is built once into dist/, and the next run builds nothing');
  rmSync(dir, { recursive: true, force: true });
  say('ok');
  process.exit(0); // the SDK client's and the child's handles would keep the loop alive for a while
}

await main();
