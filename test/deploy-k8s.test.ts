/**
 * deploy/k8s, offline: every manifest (the default kustomization's and the custom-worker overlay's) loads into its
 * kubernetes-models (or KEDA) model and passes `validate()` (the API's own OpenAPI schemas, no cluster, nothing
 * downloaded); then the contract: the default runs only the project's images (nothing to build by hand), each
 * container runs a built entry point with the environment that process reads (docs/CONFIGURATION.md, config loaders),
 * gateways are probed on /readyz and /healthz, grace periods cover the drains, PodDisruptionBudgets select their pods,
 * and each KEDA ScaledObject watches the BullMQ lists of the tools its Deployment's workers (Node or Python) really
 * serve (checked on a real Redis with BullMQ). The worker liveness probes (`dist/alive.js`, Python's
 * `taskrelay_worker.alive`) are run for real.
 */
import { spawnSync } from 'node:child_process';
import { readFileSync, readdirSync } from 'node:fs';
import { resolve } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { parseAllDocuments } from 'yaml';
import { Queue, Worker } from 'bullmq';
import { Redis } from 'ioredis';
import { ConfigMap, Service } from 'kubernetes-models/v1';
import { Deployment, StatefulSet } from 'kubernetes-models/apps/v1';
import { PodDisruptionBudget } from 'kubernetes-models/policy/v1';
import { ScaledObject } from '@kubernetes-models/keda/keda.sh/v1alpha1';
import { createKeys, toolQueue } from '@taskrelay/shared';
import { demoTools } from '@taskrelay/worker';
import { envProblems, processOf } from './helpers/deploy-contract.js';
import { strictSchemaProblems } from './helpers/kubernetes-validate.js';
import { PYTHON, ROOT, startPythonWorkerProcess, startWorkerProcess, stopAll } from './helpers/processes.js';
import { startRedis, uniquePrefix, type TestRedis } from './helpers/redis.js';
import { waitFor } from './helpers/wait-for.js';

const DIR = resolve(ROOT, 'deploy/k8s');
const OVERLAY = resolve(DIR, 'overlays/custom-worker');
const MODELS: Record<string, new (data: never) => { validate(): void }> = {
  'v1/ConfigMap': ConfigMap,
  'v1/Service': Service,
  'apps/v1/Deployment': Deployment,
  'apps/v1/StatefulSet': StatefulSet,
  'policy/v1/PodDisruptionBudget': PodDisruptionBudget,
  'keda.sh/v1alpha1/ScaledObject': ScaledObject,
};

interface Manifest {
  file: string;
  apiVersion: string;
  kind: string;
  metadata: { name: string; labels?: Record<string, string> };
  /** Read after validate() has checked it against the API schema. */
  spec?: any;
  data?: Record<string, string>;
}

const yamlIn = (dir: string) => readdirSync(dir).filter((f) => f.endsWith('.yaml') && f !== 'kustomization.yaml');
const load = (dir: string, file: string): Manifest[] =>
  parseAllDocuments(readFileSync(resolve(dir, file), 'utf8')).map((doc) => ({
    ...(doc.toJSON() as Omit<Manifest, 'file'>),
    file,
  }));
const kustomization = (dir: string) =>
  parseAllDocuments(readFileSync(resolve(dir, 'kustomization.yaml'), 'utf8'))[0]?.toJSON() as { resources: string[] };
const files = yamlIn(DIR);
/** The default kustomization's objects. */
const defaults: Manifest[] = files.flatMap((file) => load(DIR, file));
/** Those plus the custom-worker overlay's own. */
const manifests: Manifest[] = [...defaults, ...yamlIn(OVERLAY).flatMap((file) => load(OVERLAY, file))];
const byKind = (kind: string) => manifests.filter((m) => m.kind === kind);
const config = byKind('ConfigMap').find((m) => m.metadata.name === 'taskrelay')?.data ?? {};
const workloads = [...byKind('Deployment'), ...byKind('StatefulSet')];

/** The command a container runs: its own, or (the example image) its Dockerfile's CMD. */
function commandOf(container: { command?: string[]; image: string }): string[] {
  if (container.command) return container.command;
  if (container.image.startsWith('taskrelay-custom-worker:')) {
    const dockerfile = readFileSync(resolve(ROOT, 'examples/custom-worker/Dockerfile'), 'utf8');
    return JSON.parse(/^CMD (\[.*\])$/m.exec(dockerfile)?.[1] ?? '[]') as string[];
  }
  return [];
}

/** The tools a worker serves, from its TASKRELAY_TOOLS: the demo tools, or the Python image's example module. */
function toolsServed(module: string | undefined): string[] {
  if (module === undefined) return demoTools.map((t) => t.name);
  expect(module).toBe('/app/tools/train.py');
  // packages/worker-python/Dockerfile copies examples/python-worker/train.py there.
  expect(readFileSync(resolve(ROOT, 'packages/worker-python/Dockerfile'), 'utf8')).toMatch(
    /^COPY examples\/python-worker\/train\.py \.\/tools\/train\.py$/m,
  );
  const source = readFileSync(resolve(ROOT, 'examples/python-worker/train.py'), 'utf8');
  return [...source.matchAll(/@tool\(\s*name="([^"]+)"/g)].map((m) => m[1] ?? '');
}

function envOf(container: { env?: Array<{ name: string; value: string }>; envFrom?: unknown[] }) {
  const env: Record<string, string> = container.envFrom ? { ...config } : {};
  for (const { name, value } of container.env ?? []) env[name] = value;
  return env;
}

describe('deploy/k8s manifests', () => {
  it('are all listed in kustomization.yaml; the overlay adds the custom worker to the default', () => {
    expect([...kustomization(DIR).resources].sort()).toEqual([...files].sort());
    expect(kustomization(OVERLAY).resources).toEqual(['../..', ...yamlIn(OVERLAY)]);
  });

  it('the default runs the project images only: nothing built by hand first', () => {
    const images = defaults
      .filter((m) => m.kind === 'Deployment' || m.kind === 'StatefulSet')
      .flatMap((m) => (m.spec.template.spec.containers as Array<{ image: string }>).map((c) => c.image));
    // The repository's Dockerfile, packages/worker-python/Dockerfile, and Redis.
    for (const image of images) expect(image).toMatch(/^(taskrelay|taskrelay-python-worker):\d+\.\d+\.\d+$|^redis:/);
    expect(images.some((i) => i.startsWith('taskrelay-python-worker:'))).toBe(true);
  });

  it('each validate against the Kubernetes (and KEDA) API schemas', () => {
    expect(manifests.length).toBeGreaterThanOrEqual(10);
    for (const manifest of manifests) {
      const { file, ...doc } = manifest;
      const Model = MODELS[`${doc.apiVersion}/${doc.kind}`];
      expect(Model, `${file}: no model for ${doc.apiVersion} ${doc.kind}`).toBeDefined();
      expect(() => new Model!(doc as never).validate(), `${file}: ${doc.kind} ${doc.metadata.name}`).not.toThrow();
    }
    // Strictly too: a property the API does not know is refused (kubernetes-models lets it through).
    for (const [dir, names] of [[DIR, files] as const, [OVERLAY, yamlIn(OVERLAY)] as const])
      for (const file of names)
        expect(strictSchemaProblems(readFileSync(resolve(dir, file), 'utf8')), file).toEqual([]);
  });

  it("run built entry points with the contract's environment, non-root", () => {
    const problems: string[] = [];
    const kinds = new Set<string>();
    for (const workload of workloads) {
      const pod = workload.spec.template.spec;
      for (const container of pod.containers) {
        if (container.image.startsWith('redis:')) continue;
        const kind = processOf(commandOf(container));
        if (!kind) {
          problems.push(`${workload.metadata.name}: runs no taskrelay entry point`);
          continue;
        }
        kinds.add(kind);
        for (const p of envProblems(kind, envOf(container))) problems.push(`${workload.metadata.name}: ${p}`);
        expect(pod.securityContext?.runAsNonRoot, workload.metadata.name).toBe(true);
      }
    }
    expect(problems).toEqual([]);
    expect([...kinds].sort()).toEqual(['gateway', 'worker']);
  });

  it('probe gateways on /readyz and /healthz at the port they listen on, and give every drain its time', () => {
    for (const workload of byKind('Deployment')) {
      const pod = workload.spec.template.spec;
      const container = pod.containers[0];
      const env = envOf(container);
      const kind = processOf(commandOf(container));
      const grace = pod.terminationGracePeriodSeconds as number;
      if (kind === 'gateway') {
        const port = container.ports.find((p: { name: string }) => p.name === container.readinessProbe.httpGet.port);
        expect(String(port.containerPort)).toBe(env['PORT']);
        expect(container.readinessProbe.httpGet.path).toBe('/readyz');
        expect(container.livenessProbe.httpGet.path).toBe('/healthz');
        expect(grace).toBeGreaterThan(Number(env['GATEWAY_SHUTDOWN_GRACE_MS'] ?? 10_000) / 1000);
      } else {
        expect(container.livenessProbe.exec.command.join(' '), workload.metadata.name).toMatch(
          /(dist\/alive\.js|-m taskrelay_worker\.alive)$/,
        );
        const drainS =
          (Number(env['WORKER_SHUTDOWN_GRACE_MS'] ?? 30_000) + Number(env['WORKER_ABORT_GRACE_MS'] ?? 5_000)) / 1000;
        expect(grace, workload.metadata.name).toBeGreaterThan(drainS);
      }
    }
  });

  it('cover every Deployment with a PodDisruptionBudget that selects its pods', () => {
    for (const deployment of byKind('Deployment')) {
      const labels = deployment.spec.template.metadata.labels as Record<string, string>;
      const budget = byKind('PodDisruptionBudget').find((b) =>
        Object.entries(b.spec.selector.matchLabels as Record<string, string>).every(([k, v]) => labels[k] === v),
      );
      expect(budget, deployment.metadata.name).toBeDefined();
    }
  });
});

describe('worker autoscaling (KEDA)', () => {
  let redis: TestRedis;
  beforeAll(async () => {
    redis = await startRedis();
  });
  afterAll(async () => {
    await stopAll();
    await redis?.stop();
  });

  it('scales each worker Deployment from zero on the prioritized, wait and active lists of each tool it serves', async () => {
    const scaledObjects = byKind('ScaledObject');
    expect(scaledObjects.map((s) => s.spec.scaleTargetRef.name)).toEqual([
      'taskrelay-worker',
      'taskrelay-python-worker',
    ]);
    const keys = createKeys(config['TASKRELAY_PREFIX']);
    for (const scaled of scaledObjects) {
      const target = byKind('Deployment').find((d) => d.metadata.name === scaled.spec.scaleTargetRef.name);
      const env = envOf(target?.spec.template.spec.containers[0]);
      const tools = toolsServed(env['TASKRELAY_TOOLS']);
      const queue = env['TASKRELAY_QUEUE'] ?? 'default';
      const triggers = scaled.spec.triggers as Array<{ type: string; metadata: Record<string, string> }>;
      // Work queues per tool (PROTOCOL.md §3.2); fair share (§25): jobs wait in the prioritized set, the wait list
      // holds only ones put back, the active list the running ones. Three triggers per tool, in that order.
      expect(triggers, scaled.metadata.name).toHaveLength(tools.length * 3);
      tools.forEach((tool, i) => {
        const queueKey = `${keys.bullQueueKeyPrefix}${toolQueue(queue, tool)}`;
        const [waiting, back, running] = triggers.slice(i * 3, i * 3 + 3);
        for (const t of [waiting, back, running]) {
          expect(t?.type).toBe('redis');
          expect(config['REDIS_URL']).toBe(`redis://${t?.metadata['address']}`);
          // From zero (PROTOCOL.md §24): one waiting job activates the workers; the running ones keep them up.
          expect(t?.metadata['activationListLength']).toBe('0');
        }
        expect(waiting?.metadata['listName']).toBe(`${queueKey}:prioritized`);
        expect(back?.metadata['listName']).toBe(`${queueKey}:wait`);
        expect(running?.metadata['listName']).toBe(`${queueKey}:active`);
        expect(running?.metadata['listLength']).toBe(env['WORKER_CONCURRENCY']);
      });
      expect(scaled.spec.minReplicaCount).toBe(0);
    }
    const scaled = scaledObjects[0];
    const triggers = scaled?.spec.triggers ?? [];
    const [trigger] = triggers;
    const active = triggers[2];
    const pool = toolQueue('default', demoTools[0]?.name ?? '');

    // Those keys are BullMQ's wait and active lists: a waiting job of that queue shows in the first's LLEN, a running
    // one in the second's.
    const prefix = uniquePrefix('keda');
    const testKeys = createKeys(prefix);
    const connection = new Redis(redis.url, { maxRetriesPerRequest: null });
    const queue = new Queue(testKeys.queueName(pool), { connection, prefix: testKeys.bullPrefix });
    const inTest = (name: string) => name.replace(`${keys.prefix}:`, `${prefix}:`);
    let release = () => {};
    const workerConnection = connection.duplicate();
    const worker = new Worker(
      testKeys.queueName(pool),
      () => new Promise<void>((resolveJob) => (release = resolveJob)),
      { connection: workerConnection, prefix: testKeys.bullPrefix, autorun: false },
    );
    try {
      // Added as the gateway adds it, with a priority: it shows in the prioritized set's ZCARD.
      await queue.add('build_report', {}, { jobId: 'j1', priority: 1 });
      expect(await connection.zcard(inTest(trigger?.metadata.listName ?? ''))).toBe(1);
      void worker.run();
      await waitFor(async () => (await connection.llen(inTest(active?.metadata.listName ?? ''))) === 1);
      expect(await connection.zcard(inTest(trigger?.metadata.listName ?? ''))).toBe(0);
    } finally {
      release();
      await worker.close();
      await queue.close();
      workerConnection.disconnect();
      connection.disconnect();
    }
  });

  it("the worker liveness probe passes while this host's worker heartbeats, and fails when none does", async () => {
    const alive = (env: Record<string, string>) =>
      spawnSync(process.execPath, ['packages/worker/dist/alive.js'], {
        cwd: ROOT,
        env: { ...process.env, ...env },
        encoding: 'utf8',
        timeout: 20_000,
      });
    const env = { REDIS_URL: redis.url, TASKRELAY_PREFIX: uniquePrefix('alive') };
    const none = alive(env);
    expect(none.stderr).toMatch(/no live heartbeat from a worker of/);
    expect(none.status).toBe(1);
    const worker = await startWorkerProcess(env);
    expect(alive(env).status).toBe(0);
    await worker.kill('SIGTERM');
    expect(alive(env).status).toBe(1);
    // Redis away: not this pod's fault.
    expect(alive({ ...env, REDIS_URL: 'redis://127.0.0.1:1' }).status).toBe(0);
  });

  it.skipIf(PYTHON === undefined)(
    'the Python worker liveness probe does the same (python -m taskrelay_worker.alive)',
    async () => {
      const alive = (env: Record<string, string>) =>
        spawnSync(PYTHON ?? 'python3', ['-m', 'taskrelay_worker.alive'], {
          cwd: ROOT,
          env: { ...process.env, ...env },
          encoding: 'utf8',
          timeout: 20_000,
        });
      const env = { REDIS_URL: redis.url, TASKRELAY_PREFIX: uniquePrefix('alive-py') };
      const none = alive(env);
      expect(none.stderr).toMatch(/no live heartbeat from a worker of/);
      expect(none.status).toBe(1);
      const worker = await startPythonWorkerProcess({
        ...env,
        TASKRELAY_TOOLS: resolve(ROOT, 'examples/python-worker/train.py'),
      });
      const up = alive(env);
      expect(up.status, up.stderr).toBe(0);
      await worker.kill('SIGTERM');
      expect(alive(env).status).toBe(1);
      expect(alive({ ...env, REDIS_URL: 'redis://127.0.0.1:1' }).status).toBe(0);
      // A bad configuration is one line and exit 1, as the worker's own start.
      const bad = alive({ ...env, REDIS_URL: 'http://nowhere' });
      expect(bad.status).toBe(1);
      expect(bad.stderr.trim().split('\n')).toHaveLength(1);
    },
  );
});
