/**
 * Issue 33 item 6: the Python worker's image (packages/worker-python/Dockerfile, compose's `python-worker`), checked
 * without a container engine: its Dockerfile is replayed (test/helpers/dockerfile-replay.ts, the host's Python standing
 * for the image's), and the replayed image's own command serves its example `train` tool to a gateway: epochs as
 * progress, and a cancel that stops the run.
 */
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import { ProgressNotificationSchema, type ProgressNotification } from '@modelcontextprotocol/sdk/types.js';
import { replayDockerfile, type ReplayedImage } from './helpers/dockerfile-replay.js';
import { PYTHON, ROOT, startGatewayProcess, stopAll, type GatewayProcess } from './helpers/processes.js';
import { startRedis, uniquePrefix, type TestRedis } from './helpers/redis.js';
import { startTask, taskResult } from './helpers/tasks.js';
import { waitFor } from './helpers/wait-for.js';

const DOCKERFILE = 'packages/worker-python/Dockerfile';

describe('the Python worker’s Dockerfile', () => {
  const text = readFileSync(resolve(ROOT, DOCKERFILE), 'utf8');
  it('builds in stages, installs the wheel only, and runs as a non-root user', () => {
    // scripts (the Node build writes the generated scripts; they are not committed), build (the wheel), runtime.
    expect(text.match(/^FROM /gm)).toHaveLength(3);
    expect(text).toMatch(/^COPY --from=scripts \S+\/_generated /m);
    const runtime = text.slice(text.lastIndexOf('\nFROM '));
    expect(runtime).toMatch(/^COPY --from=build \/wheels/m);
    expect(runtime).not.toMatch(/COPY packages\/worker-python\/src/);
    expect(runtime).toMatch(/^USER (?!root)\w+$/m);
  });
});

describe.skipIf(PYTHON === undefined)('a replay of the Python worker’s Dockerfile', () => {
  let scratch: string;
  let image: ReplayedImage;
  let redis: TestRedis;
  let gateway: GatewayProcess;
  let worker: { child: ChildProcess; output: () => string };
  let workerPrefix: string;

  beforeAll(async () => {
    scratch = mkdtempSync(join(tmpdir(), 'taskrelay-python-image-'));
    image = replayDockerfile({ context: ROOT, dockerfile: DOCKERFILE, scratch });
    redis = await startRedis();
    workerPrefix = uniquePrefix('pyimage');
    const env = { REDIS_URL: redis.url, TASKRELAY_PREFIX: workerPrefix };
    gateway = await startGatewayProcess(env);
    // The image's own command and environment; its absolute paths are inside the replayed root.
    const [command = '', ...args] = image.cmd;
    const tools = image.env['TASKRELAY_TOOLS'] ?? '';
    const child = spawn(join(image.root, command), args, {
      cwd: image.workdir,
      env: { PATH: '/usr/bin:/bin', ...image.env, ...env, TASKRELAY_TOOLS: join(image.root, tools) },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let out = '';
    child.stdout?.on('data', (d: Buffer) => (out += d.toString()));
    child.stderr?.on('data', (d: Buffer) => (out += d.toString()));
    worker = { child, output: () => out };
    await waitFor(
      () => {
        if (child.exitCode !== null) throw new Error(`the image's worker exited:\n${out}`);
        return out.includes('"worker ready"');
      },
      { timeoutMs: 30_000, message: "the image's Python worker did not start" },
    );
  }, 600_000);

  afterAll(async () => {
    if (worker?.child.exitCode === null) worker.child.kill('SIGKILL');
    await stopAll();
    await redis?.stop();
    if (scratch) rmSync(scratch, { recursive: true, force: true });
  });

  it('serves the example train tool: epochs as progress, a result, and a cancel that stops it', async () => {
    const client = new Client({ name: 'py-image', version: '0' }, { capabilities: { tasks: {} } });
    const progress: ProgressNotification['params'][] = [];
    client.setNotificationHandler(ProgressNotificationSchema, (n) => {
      progress.push(n.params);
      return Promise.resolve();
    });
    await client.connect(new StreamableHTTPClientTransport(new URL(gateway.url)));
    try {
      const { tools } = await client.listTools();
      expect(tools.find((t) => t.name === 'train')?.inputSchema).toMatchObject({
        type: 'object',
        properties: { epochs: { type: 'integer' } },
      });
      const taskId = await startTask(client, 'train', { epochs: 5, samples: 500 }, { progressToken: 'train' });
      const result = await taskResult(client, taskId, 60_000);
      expect(result.structuredContent).toMatchObject({ epochs: 5 });
      expect((result.structuredContent as { accuracy: number }).accuracy).toBeGreaterThan(0.8);
      await waitFor(() => progress.some((p) => p.progressToken === 'train' && p.progress === 5));
      expect(progress.find((p) => p.progress === 5)?.message).toMatch(/^epoch 5\/5: loss \d/);

      const long = await startTask(client, 'train', { epochs: 1000, samples: 20_000 }, { progressToken: 'long' });
      await waitFor(() => progress.some((p) => p.progressToken === 'long'), { timeoutMs: 30_000 });
      expect((await client.experimental.tasks.cancelTask(long)).status).toBe('cancelled');
      await waitFor(
        () =>
          worker.output().includes('"task was not terminal; marked cancelled"') ||
          worker.output().includes('"tool stopped; task already terminal"'),
        {
          timeoutMs: 10_000,
          message: `the cancelled train run did not stop; the worker said:\n${worker.output().slice(-3000)}`,
        },
      );
    } finally {
      await client.close();
    }
  }, 120_000);

  it('has the liveness probe the Kubernetes manifests and the Helm chart run (python -m taskrelay_worker.alive)', () => {
    // The same command as deploy/k8s/python-worker.yaml and the chart's Python pools, inside the replayed image.
    const env = { PATH: '/usr/bin:/bin', ...image.env, REDIS_URL: redis.url };
    const probe = (prefix: string) =>
      spawnSync(join(image.root, '/opt/venv/bin/python'), ['-m', 'taskrelay_worker.alive'], {
        cwd: image.workdir,
        env: { ...env, TASKRELAY_PREFIX: prefix },
        encoding: 'utf8',
        timeout: 30_000,
      });
    const alive = probe(workerPrefix);
    expect(alive.status, alive.stderr).toBe(0);
    const none = probe(uniquePrefix('pyimage-none'));
    expect(none.status).toBe(1);
    expect(none.stderr).toMatch(/no live heartbeat from a worker of/);
  });
});
