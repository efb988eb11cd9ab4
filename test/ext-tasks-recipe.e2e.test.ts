/**
 * docs/CLIENTS.md's recipe, `examples/ext-tasks/client.mjs`: `@modelcontextprotocol/ext-tasks` on the 2026-07-28
 * transport with the `rawDispatch` that adds the routing headers (`Mcp-Method`, `Mcp-Name`, `Mcp-Param-*`), run as a
 * user runs it: to a result, with a header-mapped argument (non-ASCII, so Base64-encoded), and cancelled by Ctrl-C.
 */
import { spawn } from 'node:child_process';
import { resolve } from 'node:path';
import { pathToFileURL } from 'node:url';
import { beforeAll, describe, expect, it } from 'vitest';
import { waitFor } from './helpers/wait-for.js';
import { ROOT, type GatewayProcess } from './helpers/processes.js';
import { useStack } from './helpers/stack.js';

const RECIPE = resolve(ROOT, 'examples/ext-tasks/client.mjs');
const stack = useStack({
  name: 'ext-recipe',
  workers: [{}, { TASKRELAY_TOOLS: resolve(ROOT, 'test/fixtures/recipe-tools.mjs'), TASKRELAY_QUEUE: 'recipe' }],
});
let gateway: GatewayProcess;

beforeAll(() => {
  ({ gateway } = stack);
});

function startRecipe(args: string[]) {
  const child = spawn(process.execPath, [RECIPE, gateway.url, ...args], {
    cwd: ROOT,
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let out = '';
  child.stdout.on('data', (d: Buffer) => (out += d.toString()));
  child.stderr.on('data', (d: Buffer) => (out += d.toString()));
  const exited = new Promise<number | null>((done) => child.once('exit', (code) => done(code)));
  return { child, output: () => out, exited };
}

describe('the ext-tasks recipe on 2026-07-28 (examples/ext-tasks/client.mjs)', () => {
  it('runs a tool as a task of the extension to its result', async () => {
    const run = startRecipe(['build_report', JSON.stringify({ report: 'recipe', items: 3, delayMs: 5 })]);
    expect(await run.exited).toBe(0);
    expect(run.output()).toBe(
      'execution task\nstatus completed: Processed 3 of 3 items for recipe\nresult {"report":"recipe","items":3}\n',
    );
  });

  it('sends the Mcp-Param header a tool maps an argument to, Base64-encoded when the value needs it', async () => {
    const run = startRecipe(['regional_report', JSON.stringify({ region: 'Zürich Nord', items: 2 })]);
    expect(await run.exited).toBe(0);
    expect(run.output()).toContain('result {"region":"Zürich Nord","items":2}');
    // Without the tool's declaration the dispatch sends no Mcp-Param-Region, and the gateway refuses the call.
    const recipe = (await import(pathToFileURL(RECIPE).href)) as {
      taskrelayRawDispatch: (url: string) => (message: unknown) => Promise<{ error?: { code: number } }>;
    };
    const bare = await recipe.taskrelayRawDispatch(gateway.url)({
      method: 'tools/call',
      params: {
        name: 'regional_report',
        arguments: { region: 'Zürich Nord' },
        _meta: {
          'io.modelcontextprotocol/protocolVersion': '2026-07-28',
          'io.modelcontextprotocol/clientInfo': { name: 'bare', version: '0' },
          'io.modelcontextprotocol/clientCapabilities': {},
        },
      },
    });
    expect(bare.error?.code).toBe(-32020);
  });

  it('cancels the task on Ctrl-C', async () => {
    const run = startRecipe(['build_report', JSON.stringify({ report: 'long', items: 1000, delayMs: 50 })]);
    await waitFor(() => run.output().includes('execution task'), { timeoutMs: 20_000, message: 'no task' });
    run.child.kill('SIGINT');
    expect(await run.exited).toBe(1);
    expect(run.output()).toMatch(/cancelling\nstatus cancelled/);
  });
});
