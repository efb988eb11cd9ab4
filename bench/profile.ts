/**
 * `pnpm bench:profile` — CPU profiles of a gateway, a worker and the SDK peer under the benchmark's closed loop, and
 * a summary of where the time goes (issue 14: "guided by --cpu-prof of gateway and worker under load").
 *
 *   pnpm bench:profile [--kind task|plain] [--concurrency 32] [--seconds 8] [--warmup-ops 4000] [--out DIR]
 *                      [--root DIR]   (profile another built checkout's gateway and worker: a "before")
 *                      [--client raw|sdk]   (sdk: the cycle as SDK clients run it, `pnpm bench --sdk`'s: `Client`
 *                                           with its GET stream, `callToolStream`'s tasks/get polling, `callTool`)
 *
 * Starts its own redis-server, one gateway + one worker (the `tr` stack of `pnpm bench`) and the peer; warms both up,
 * then profiles only the measured window (the probe starts the inspector's profiler on SIGWINCH and writes
 * `<pid>.cpuprofile` on the next one). Prints, per process: operations/s and CPU-ms per operation in the window, the
 * share of samples by origin (GC, node internals, each dependency, each taskrelay package) and the top functions by
 * self time. The .cpuprofile files are kept in --out (default: a temp dir) for Chrome DevTools or speedscope.
 */
import { existsSync, mkdirSync, mkdtempSync, readFileSync, renameSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { parseArgs } from 'node:util';
import { startRedis, uniquePrefix } from '../test/helpers/redis.js';
import { stopAll, type ManagedProcess } from '../test/helpers/processes.js';
import { waitFor } from '../test/helpers/wait-for.js';
import { openSessions, type McpSession } from './lib/mcp-http.js';
import { RedisAdmin, probeDir, removeProbeDir, startPeer, startStack } from './lib/procs.js';
import { cycles, type CpuRoles } from './lib/scenarios.js';
import { openClients, sdkWindow } from './lib/sdk-cycle.js';
import type { Client } from '@modelcontextprotocol/sdk/client/index.js';

const { values: args } = parseArgs({
  args: process.argv.slice(2).filter((a) => a !== '--'),
  options: {
    kind: { type: 'string', default: 'task' },
    concurrency: { type: 'string', default: '32' },
    seconds: { type: 'string', default: '8' },
    'warmup-ops': { type: 'string', default: '4000' },
    top: { type: 'string', default: '25' },
    out: { type: 'string' },
    root: { type: 'string' },
    client: { type: 'string', default: 'raw' },
  },
});
const SDK = args.client === 'sdk';
const KIND = args.kind === 'plain' ? 'plain' : 'task';
const C = Number(args.concurrency);
const WINDOW_MS = Number(args.seconds) * 1000;
const WARMUP_OPS = Number(args['warmup-ops']);
const TOP = Number(args.top);
const OUT = resolve(args.out ?? mkdtempSync(join(tmpdir(), 'taskrelay-profile-')));

interface ProfileNode {
  id: number;
  callFrame: { functionName: string; url: string; lineNumber: number };
  children?: number[];
}
interface CpuProfile {
  nodes: ProfileNode[];
  samples: number[];
  timeDeltas: number[];
}

/** Where a frame's code comes from: a dependency, a taskrelay package, node itself, or a VM pseudo-frame. */
function originOf(url: string, name: string): string {
  if (!url) return name.startsWith('(') ? name : `(native) ${name}`;
  if (url.startsWith('node:')) return 'node internals';
  const pkg = /node_modules\/(?:\.pnpm\/[^/]+\/node_modules\/)?((?:@[^/]+\/)?[^/]+)/.exec(url);
  if (pkg) return pkg[1]!;
  const own = /packages\/([^/]+)\//.exec(url);
  if (own) return `taskrelay ${own[1]}`;
  return url.replace(/^file:\/\//, '').replace(`${process.cwd()}/`, '');
}

function summarize(title: string, profile: CpuProfile): string {
  const byId = new Map(profile.nodes.map((n) => [n.id, n]));
  const selfUs = new Map<number, number>();
  let total = 0;
  profile.samples.forEach((id, i) => {
    const dt = profile.timeDeltas[i] ?? 0;
    selfUs.set(id, (selfUs.get(id) ?? 0) + dt);
    total += dt;
  });
  const idle = [...selfUs].filter(([id]) => byId.get(id)?.callFrame.functionName === '(idle)');
  const idleUs = idle.reduce((a, [, us]) => a + us, 0);
  const busy = total - idleUs;
  const origins = new Map<string, number>();
  const functions = new Map<string, number>();
  for (const [id, us] of selfUs) {
    const frame = byId.get(id)!.callFrame;
    if (frame.functionName === '(idle)') continue;
    const origin = originOf(frame.url, frame.functionName);
    origins.set(origin, (origins.get(origin) ?? 0) + us);
    const where = frame.url ? `${origin}:${frame.url.split('/').pop()}:${frame.lineNumber + 1}` : origin;
    const key = `${frame.functionName || '(anonymous)'}  ${where}`;
    functions.set(key, (functions.get(key) ?? 0) + us);
  }
  const pct = (us: number) => `${((100 * us) / busy).toFixed(1).padStart(5)}%`;
  const lines = [
    `${title}: ${(total / 1000).toFixed(0)} ms profiled, ${((100 * idleUs) / total).toFixed(0)}% idle; shares of busy time`,
    '  by origin:',
    ...[...origins]
      .sort((a, b) => b[1] - a[1])
      .slice(0, 14)
      .map(([k, us]) => `    ${pct(us)}  ${k}`),
    `  top ${TOP} functions by self time:`,
    ...[...functions]
      .sort((a, b) => b[1] - a[1])
      .slice(0, TOP)
      .map(([k, us]) => `    ${pct(us)}  ${k}`),
  ];
  return lines.join('\n');
}

async function collect(proc: ManagedProcess, name: string): Promise<CpuProfile> {
  const file = join(probeDir, `${proc.pid}.cpuprofile`);
  await waitFor(() => existsSync(file), { timeoutMs: 20_000, message: `no profile from ${name}` });
  const kept = join(OUT, `${name}.cpuprofile`);
  renameSync(file, kept);
  return JSON.parse(readFileSync(kept, 'utf8')) as CpuProfile;
}

async function main(): Promise<void> {
  mkdirSync(OUT, { recursive: true });
  const redis = await startRedis({ owned: true });
  const admin = new RedisAdmin(redis.url);
  await admin.init();
  const sessions: McpSession[] = [];
  try {
    const [peer, tr] = await Promise.all([
      startPeer(),
      startStack({
        name: 'tr',
        prefix: uniquePrefix('prof'),
        redisUrl: redis.url,
        gateways: 1,
        workers: 1,
        workerConcurrency: 64,
        ...(args.root === undefined ? {} : { root: resolve(args.root) }),
      }),
    ]);
    const gateway = tr.gateways[0]!;
    const worker = tr.workers[0]!;
    const redisPids = admin.pid > 0 ? [admin.pid] : [];
    const targets = [
      {
        name: 'taskrelay',
        url: gateway.url,
        sessions: SDK ? [] : await openSessions(gateway.url, C),
        cpu: { gateway: [gateway.pid], worker: [worker.pid], redis: redisPids } as CpuRoles,
        totalRoles: ['gateway', 'worker', 'redis'],
        profiled: [
          { proc: gateway, name: 'gateway' },
          { proc: worker, name: 'worker' },
        ],
      },
      {
        name: 'peer',
        url: peer.url,
        sessions: SDK ? [] : await openSessions(peer.url, C),
        cpu: { server: [peer.pid] } as CpuRoles,
        totalRoles: ['server'],
        profiled: [{ proc: peer, name: 'peer' }],
      },
    ];
    for (const t of targets) sessions.push(...t.sessions);
    const clients = new Map<string, Client[]>();
    if (SDK) for (const t of targets) clients.set(t.name, await openClients(t.url, C));
    const run = (t: (typeof targets)[number], durationMs: number, maxOps?: number) =>
      SDK
        ? // The SDK loop has no op bound: its warm-up is a fixed 6 s.
          sdkWindow(clients.get(t.name) ?? [], KIND, C, maxOps === undefined ? durationMs : 6_000, t.cpu, t.totalRoles)
        : cycles({
            sessions: t.sessions,
            kind: KIND,
            concurrency: C,
            durationMs,
            cpu: t.cpu,
            totalRoles: t.totalRoles,
            ttlMs: 1_000,
            ...(maxOps === undefined ? {} : { maxOps }),
          });
    const report: string[] = [];
    for (const t of targets) {
      await run(t, 30_000, WARMUP_OPS);
      for (const p of t.profiled) p.proc.child.kill('SIGWINCH');
      // Let the profilers start (an inspector round trip) before the window opens.
      await new Promise((r) => setTimeout(r, 300));
      const m = await run(t, WINDOW_MS);
      for (const p of t.profiled) p.proc.child.kill('SIGWINCH');
      const cpu = Object.entries(m)
        .filter(([k]) => k.startsWith('cpu.'))
        .map(([k, v]) => `${k.slice(4)} ${v.toFixed(3)}`)
        .join(', ');
      report.push(
        `== ${t.name}: ${SDK ? 'SDK client ' : ''}${KIND} C=${C}: ${m['opsPerS']!.toFixed(0)} ops/s, p50 ${m['p50']!.toFixed(2)} ms; CPU-ms/op: ${cpu}`,
      );
      for (const p of t.profiled) report.push(summarize(p.name, await collect(p.proc, p.name)));
    }
    console.log(report.join('\n\n'));
    console.log(`\nprofiles: ${OUT}`);
  } finally {
    // Processes first: a session's close waits for its server, and nothing here needs a graceful end.
    await stopAll();
    for (const s of sessions) s.abortInflight();
    await Promise.resolve(admin.close()).catch(() => undefined);
    await redis.stop();
    removeProbeDir();
  }
}

main().then(
  () => process.exit(0),
  (error: unknown) => {
    console.error(error);
    process.exit(1);
  },
);
