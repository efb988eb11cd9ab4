/**
 * docs/JOB-API.md, PROTOCOL.md §12.10: job-API tools from a `TASKRELAY_JOB_APIS` file, over the example fake batch
 * service, through real gateway and worker processes: progress, the upstream's failure, cancel reaching the upstream
 * once, a worker killed mid-poll resuming without a second submit, a flaky upstream, and bad files refused at start.
 */
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import type { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { CallToolResultSchema, type ProgressNotification } from '@modelcontextprotocol/sdk/types.js';
import { waitFor } from './helpers/wait-for.js';
import { WORKER_MAIN, spawnNode, type ManagedProcess } from './helpers/processes.js';
import { startStack, type TestStack } from './helpers/stack.js';
import { JOB_API_CONFIG, startBatchService, type BatchService, type BatchStats } from './fixtures/job-api-service.js';
import { startTask } from './helpers/tasks.js';
import { absenceWindow } from './helpers/load.js';

const TOKEN = 'e2e-secret';
let service: BatchService;
let stack: TestStack;
let client: Client;
const progress: ProgressNotification['params'][] = [];

beforeAll(async () => {
  // The stack is started once the service is, whose address its processes take; workers start in the tests.
  service = await startBatchService({ BATCH_TOKEN: TOKEN });
  stack = await startStack({
    name: 'jobapi',
    env: {
      TASKRELAY_JOB_APIS: JOB_API_CONFIG,
      BATCH_URL: service.url,
      BATCH_TOKEN: TOKEN,
      WORKER_LOCK_DURATION_MS: '1000',
      WORKER_SHUTDOWN_GRACE_MS: '100',
    },
    workers: [],
  });
  client = await stack.client({}, undefined, { progress });
});

afterAll(async () => {
  await stack?.stop();
  await service?.stop();
});

beforeEach(() => service.control({ reset: true }));

const stats = () => service.stats();
const until = (condition: (s: BatchStats) => boolean, message: string) =>
  waitFor(async () => condition(await stats()), { timeoutMs: 15_000, message });
const tokenProgress = (token: string) => progress.filter((p) => p.progressToken === token);
const status = async (taskId: string) => (await client.experimental.tasks.getTask(taskId)).status;

describe('§12.10 job-API tools through gateway and worker', () => {
  let worker: ManagedProcess;
  beforeAll(async () => {
    worker = await stack.addWorker();
  });
  afterAll(() => worker.kill());

  it('lists the file tools with their input schema', async () => {
    const { tools } = await client.listTools();
    const tool = tools.find((t) => t.name === 'batch_job');
    expect(tool?.inputSchema).toMatchObject({ type: 'object', required: ['label'] });
    expect(tool?.execution?.taskSupport).toBe('optional');
  });

  it('submits, polls and completes, with the upstream progress reaching the caller as it moves', async () => {
    const taskId = await startTask(
      client,
      'batch_job',
      { label: 'p1', steps: 3, manual: true },
      { progressToken: 'batch_job-p1' },
    );
    const token = 'batch_job-p1';
    await waitFor(() => tokenProgress(token).some((p) => p.progress === 0), { message: 'no progress 0/3' });
    await service.advance('latest');
    await waitFor(() => tokenProgress(token).some((p) => p.progress === 1), { message: 'no progress 1/3' });
    expect(await status(taskId)).toBe('working');
    await service.advance('latest', 2);
    const result = await client.experimental.tasks.getTaskResult(taskId, CallToolResultSchema);
    expect(result.isError).not.toBe(true);
    expect(result.structuredContent).toMatchObject({ steps: 3, input: { label: 'p1', steps: 3 } });
    expect(await status(taskId)).toBe('completed');
    const seen = tokenProgress(token);
    expect(seen.map((p) => p.progress)).toEqual([0, 1, 3]);
    expect(seen.at(-1)).toMatchObject({ progress: 3, total: 3, message: 'finished' });
    expect(await stats()).toMatchObject({ submits: 1, jobsCreated: 1, cancels: 0 });
  });

  it('completes a job polled across suspended runs, from the status URL of a 202 + Location', async () => {
    const taskId = await startTask(
      client,
      'batch_job_suspending',
      { label: 's1', steps: 4, manual: true },
      { progressToken: 'batch_job_suspending-s1' },
    );
    const suspended = () => worker.logs().filter((l) => l['taskId'] === taskId && l['msg'] === 'run suspended').length;
    await waitFor(() => suspended() >= 2, { message: 'runs did not suspend' });
    await service.advance('latest', 4);
    const result = await client.experimental.tasks.getTaskResult(taskId, CallToolResultSchema);
    expect(result.structuredContent).toMatchObject({ steps: 4 });
    expect(await stats()).toMatchObject({ submits: 1 });
  });

  it('a plain call (no task) waits for the result across suspended runs', async () => {
    const result = await client.callTool({
      name: 'batch_job_suspending',
      arguments: { label: 'plain', steps: 2, stepMs: 50 },
    });
    expect(result.isError).not.toBe(true);
    expect(result.structuredContent).toMatchObject({ steps: 2, input: { label: 'plain' } });
  });

  it('fails the task with the upstream message when the external job fails', async () => {
    const taskId = await startTask(
      client,
      'batch_job',
      { label: 'f1', steps: 2, stepMs: 50, fail: 'render node on fire' },
      { progressToken: 'batch_job-f1' },
    );
    const result = await client.experimental.tasks.getTaskResult(taskId, CallToolResultSchema);
    expect(result.isError).toBe(true);
    expect(JSON.stringify(result.content)).toContain('render node on fire');
    const task = await client.experimental.tasks.getTask(taskId);
    expect(task.status).toBe('failed');
    expect(task.statusMessage).toContain('render node on fire');
  });

  it('cancel calls the external cancel exactly once and polling stops', async () => {
    const taskId = await startTask(
      client,
      'batch_job',
      { label: 'c1', steps: 10_000, stepMs: 100 },
      { progressToken: 'batch_job-c1' },
    );
    await until((s) => s.polls >= 2, 'never polled');
    await client.experimental.tasks.cancelTask(taskId);
    await until((s) => s.cancels >= 1, 'external cancel never called');
    await waitFor(() => worker.logs().some((l) => l['taskId'] === taskId && l['msg'] === 'external job cancelled'));
    const after = await stats();
    // Polls at 100 ms: a run still polling would show in the next 500 ms.
    await absenceWindow(500);
    expect(await stats()).toMatchObject({ cancels: 1, polls: after.polls });
    expect(await status(taskId)).toBe('cancelled');
  });

  // Needs the worker to call the tool's onCancelled for a cancelled task whose delayed job the gateway promotes instead
  // of removing (PROTOCOL.md §12.10; the two small changes to worker.ts and job-dispatcher.ts are with the integrator).
  // Until then a cancel that lands while the run is suspended does not reach the upstream.
  it('a task cancelled while its run is suspended still cancels the external job, once', async () => {
    const taskId = await startTask(
      client,
      'batch_job_suspending',
      { label: 'c2', steps: 10_000, stepMs: 100 },
      { progressToken: 'batch_job_suspending-c2' },
    );
    await waitFor(() => worker.logs().some((l) => l['taskId'] === taskId && l['msg'] === 'run suspended'));
    await client.experimental.tasks.cancelTask(taskId);
    await until((s) => s.cancels >= 1, 'external cancel never called');
    await absenceWindow(500);
    expect(await stats()).toMatchObject({ cancels: 1 });
    expect(await status(taskId)).toBe('cancelled');
  });

  it('rides out a flaky upstream (5xx, answers that never come, slow answers) without a second job', async () => {
    await service.control({ flaky: ['500', 'ok', 'timeout', 'slow', '500', 'ok', 'slow'], slowMs: 200, hangMs: 3_000 });
    const taskId = await startTask(
      client,
      'batch_job',
      { label: 'x1', steps: 4, stepMs: 60 },
      { progressToken: 'batch_job-x1' },
    );
    const result = await client.experimental.tasks.getTaskResult(taskId, CallToolResultSchema);
    expect(result.isError).not.toBe(true);
    expect(result.structuredContent).toMatchObject({ steps: 4 });
    expect(await stats()).toMatchObject({ jobsCreated: 1 });
    expect(worker.logs().some((l) => l['taskId'] === taskId && l['msg'] === 'upstream request failed; retrying')).toBe(
      true,
    );
  });
});

describe('§12.10 a worker lost mid-poll', () => {
  it('a SIGKILLed worker’s job resumes polling the same external job on another worker, never submitting again', async () => {
    const first = await stack.addWorker();
    const taskId = await startTask(
      client,
      'batch_job',
      { label: 'k1', steps: 25, stepMs: 100 },
      { progressToken: 'batch_job-k1' },
    );
    await until((s) => s.polls >= 3, 'never polled');
    await first.kill('SIGKILL');
    const second = await stack.addWorker();
    const result = await client.experimental.tasks.getTaskResult(taskId, CallToolResultSchema);
    expect(result.structuredContent).toMatchObject({ steps: 25 });
    expect(second.logs().some((l) => l['taskId'] === taskId && l['msg'] === 'tool started')).toBe(true);
    expect(await stats()).toMatchObject({ submits: 1, jobsCreated: 1 });
    await second.kill();
  });

  it('a job handed back on SIGTERM resumes on another worker without a second submit', async () => {
    const first = await stack.addWorker();
    const taskId = await startTask(
      client,
      'batch_job',
      { label: 't1', steps: 20, stepMs: 100 },
      { progressToken: 'batch_job-t1' },
    );
    await until((s) => s.polls >= 2, 'never polled');
    expect(await first.kill('SIGTERM')).toBe(0);
    const second = await stack.addWorker();
    const result = await client.experimental.tasks.getTaskResult(taskId, CallToolResultSchema);
    expect(result.structuredContent).toMatchObject({ steps: 20 });
    expect(await stats()).toMatchObject({ submits: 1, jobsCreated: 1, cancels: 0 });
    await second.kill();
  });
});

describe('a bad TASKRELAY_JOB_APIS stops the worker at start', () => {
  const dir = mkdtempSync(join(tmpdir(), 'taskrelay-jobapi-'));
  const startWith = async (file: string, extraEnv: Record<string, string | undefined> = {}) => {
    const proc = spawnNode(WORKER_MAIN, { ...stack.env, TASKRELAY_JOB_APIS: file, ...extraEnv });
    const code = await proc.exited;
    return { code, lines: proc.output().trim().split('\n') };
  };

  it('names the tool and the field of a malformed file, in one line, exit code 1', async () => {
    const file = join(dir, 'bad.yaml');
    writeFileSync(
      file,
      [
        'tools:',
        '  - name: render_video',
        '    description: Renders.',
        '    submit: { url: "http://127.0.0.1:9/jobs", id: job.id }',
        '    poll: { url: "http://127.0.0.1:9/jobs/{{id}}", status: state, statusMap: { done: finished } }',
      ].join('\n'),
    );
    const { code, lines } = await startWith(file);
    expect(code).not.toBe(0);
    expect(lines).toHaveLength(1);
    expect(lines[0]).toMatch(
      /^taskrelay-worker: Invalid configuration: TASKRELAY_JOB_APIS .*tool render_video: poll\.statusMap\.done: must be one of/,
    );
  });

  it('names a missing environment variable, in one line, exit code 1', async () => {
    const { code, lines } = await startWith(JOB_API_CONFIG, { BATCH_TOKEN: undefined });
    expect(code).not.toBe(0);
    expect(lines).toHaveLength(1);
    expect(lines[0]).toMatch(
      /tool batch_job: headers\.Authorization needs environment variable BATCH_TOKEN, which is not set/,
    );
  });
});
