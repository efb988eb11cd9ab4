/**
 * examples/job-api as its README runs it: the fake batch service, the example's jobs.yaml, and `call.mjs` as the
 * caller. When the upstream job fails, the caller sees the upstream's own message (issue 22), not the SDK's
 * "MCP error -32603: Task … failed" and a stack trace.
 */
import { spawn } from 'node:child_process';
import { resolve } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ROOT } from './helpers/processes.js';
import { startStack, type TestStack } from './helpers/stack.js';
import { EXAMPLE_CONFIG, startBatchService, type BatchService } from './fixtures/job-api-service.js';

const CALL = resolve(ROOT, 'examples/job-api/call.mjs');
const TOKEN = 'example-token';
let service: BatchService;
let stack: TestStack;

beforeAll(async () => {
  // The stack is started once the service is, whose address its processes take.
  service = await startBatchService({ BATCH_TOKEN: TOKEN });
  stack = await startStack({
    name: 'jobapi-example',
    env: { TASKRELAY_JOB_APIS: EXAMPLE_CONFIG, BATCH_URL: service.url, BATCH_TOKEN: TOKEN },
  });
});

afterAll(async () => {
  await stack?.stop();
  await service?.stop();
});

function runCall(args: string[]): Promise<{ code: number | null; stdout: string; stderr: string }> {
  return new Promise((done) => {
    const child = spawn(process.execPath, [CALL, stack.gateway.url, ...args], {
      cwd: ROOT,
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let stdout = '';
    let stderr = '';
    child.stdout.on('data', (d: Buffer) => (stdout += d.toString()));
    child.stderr.on('data', (d: Buffer) => (stderr += d.toString()));
    child.once('exit', (code) => done({ code, stdout, stderr }));
  });
}

describe('examples/job-api/call.mjs', () => {
  it('prints the upstream failure message, without a stack trace, and exits 1', async () => {
    const { code, stdout, stderr } = await runCall(['run_batch', '2', '50', 'GPU fell over']);
    expect(stdout).toMatch(/task [0-9a-f]+ created/);
    expect(stdout).toMatch(/status failed/);
    expect(stderr.trim()).toBe('task failed: GPU fell over');
    expect(stderr).not.toMatch(/-32603|\n\s+at /);
    expect(code).toBe(1);
  });

  it('prints the result of a job that succeeds and exits 0', async () => {
    const { code, stdout, stderr } = await runCall(['run_batch', '2', '20']);
    expect(stdout).toMatch(/status completed/);
    expect(stdout).toMatch(/result \{.*"steps":2/);
    expect(stderr).toBe('');
    expect(code).toBe(0);
  });
});
