/**
 * Issue 45 for the Python worker (PROTOCOL.md §1.1, §29): with `TASKRELAY_KEY_LAYOUT=sharded` on one Redis (the
 * layout's test aid) a Python worker places its tools' shards by Node's lease rule, consumes both shards of a
 * `shards=2` tool, and a Node gateway routes calls to it: results, progress on the gateway's channel and a cancel, each
 * task under the shard its id names. Its keys come from the manifest's sharded templates (issue 47).
 */
import { resolve } from 'node:path';
import { beforeAll, describe, expect, it } from 'vitest';
import type { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { CallToolResultSchema, type CallToolResult } from '@modelcontextprotocol/sdk/types.js';
import { createKeys } from '@taskrelay/shared';
import { monitorRedis } from './helpers/monitor.js';
import { PYTHON, ROOT, recordingShape, spawnProcess } from './helpers/processes.js';
import { useStack } from './helpers/stack.js';
import { startTask, taskResult } from './helpers/tasks.js';
import { waitFor } from './helpers/wait-for.js';

const PY_TOOLS = resolve(ROOT, 'test/fixtures/python_sharded.py');

if (PYTHON === undefined) console.log('python-sharded suite skipped: no .venv/bin/python (needs Python 3.11+)');

describe.skipIf(PYTHON === undefined)('a Python worker on the sharded key layout', () => {
  const progress = new Map<string, number[]>();
  const logs: unknown[] = [];
  // A Redis of its own (its command counts are read), the sharded layout by its test aid; no Node worker. The
  // Python worker places the shards (the gateway places none before a worker announces its tools). Its cancel sweep
  // is 10 min: a cancel that reaches its tool within the test reached it on a channel, not by the sweep.
  const stack = useStack({
    name: 'pysharded',
    redis: {},
    env: { TASKRELAY_KEY_LAYOUT: 'sharded' },
    workers: [],
    pythonWorkers: [{ TASKRELAY_TOOLS: PY_TOOLS, WORKER_CANCEL_SWEEP_MS: '600000' }],
  });
  let client: Client;

  beforeAll(async () => {
    client = await stack.client({}, undefined, recordingShape(progress, logs));
    await waitFor(async () => (await client.listTools()).tools.some((t) => t.name === 'py_spread'), {
      message: 'the Python tools never reached the gateway',
    });
  });

  it('places every shard of its tools in the registry, as Node would', async () => {
    const registry = await stack.r.hgetall(createKeys(stack.prefix, 'sharded').placement);
    expect(Object.keys(registry).sort()).toEqual([
      'default~py_hold#0',
      'default~py_spread#0',
      'default~py_spread#1',
      'default~py_talk#0',
    ]);
    const codes = Object.values(registry);
    for (const code of codes) expect(code).toMatch(/^[0-9a-f]{4}$/);
    expect(new Set(codes).size).toBe(4);
  });

  it('runs calls on both shards of a shards=2 tool, with progress, each task under its shard', async () => {
    const registry = await stack.r.hgetall(createKeys(stack.prefix, 'sharded').placement);
    const spread = [registry['default~py_spread#0'], registry['default~py_spread#1']].sort();
    const ids = await Promise.all(
      [1, 2, 3, 4].map((n) => startTask(client, 'py_spread', { n }, { progressToken: `p${n}` })),
    );
    const results = await Promise.all(ids.map((id) => taskResult(client, id)));
    expect(results.map((r) => r.structuredContent)).toEqual([1, 2, 3, 4].map((n) => ({ n, attempt: 1 })));
    // The gateway takes the shards in turn: both were used, and every id names one of the tool's shards.
    expect([...new Set(ids.map((id) => id.slice(0, 4)))].sort()).toEqual(spread);
    const keys = createKeys(stack.prefix, 'sharded');
    for (const id of ids) {
      expect(await stack.r.hget(keys.forTask(id).task(id), 'status')).toBe('completed');
      expect(await stack.r.exists(createKeys(stack.prefix, 'single').task(id))).toBe(0);
    }
    await waitFor(() => [1, 2, 3, 4].every((n) => progress.get(`p${n}`)?.includes(2) === true), {
      message: 'progress of every call reaches the client',
    });
  });

  it('listens for cancels by SSUBSCRIBE on the cancel channel of each tool shard it consumes, not on P:cancel', async () => {
    const keys = createKeys(stack.prefix, 'sharded');
    const codes = Object.values(await stack.r.hgetall(keys.placement));
    const channels = codes.map((code) => keys.forShard(code).cancelChannel);
    await waitFor(
      async () => {
        const counts = (await stack.r.call('PUBSUB', 'SHARDNUMSUB', ...channels)) as (string | number)[];
        return counts.filter((_, i) => i % 2 === 1).every((n) => Number(n) === 1);
      },
      { message: "the Python worker never SSUBSCRIBEd to its tool shards' cancel channels" },
    );
    const [, home] = (await stack.r.call('PUBSUB', 'NUMSUB', keys.cancelChannel)) as [string, number];
    expect(Number(home)).toBe(0);
  });

  it("cancels a running Python task on its shard's cancel channel (the sweep is 10 min)", async () => {
    const id = await startTask(client, 'py_hold', {});
    await waitFor(() => stack.pythonWorkers[0]!.logs().some((l) => l['taskId'] === id && l['msg'] === 'tool started'));
    expect((await client.experimental.tasks.cancelTask(id)).status).toBe('cancelled');
    await waitFor(() =>
      stack.pythonWorkers[0]!.logs().some(
        (l) => l['taskId'] === id && l['msg'] === 'tool signal aborted' && l['reason'] === 'CLIENT_CANCELLED',
      ),
    );
  });

  it("sends its progress, logs, output wake-up and status by SPUBLISH on the shard's channels, never PUBLISH", async () => {
    // Said with this stack's channels only: another test file's stack on the same Redis (the single layout, whose
    // events are classic PUBLISHes) ran beside this one once in eight runs, and the server-wide count took its PUBLISH.
    const monitor = await monitorRedis(stack.redis.url);
    try {
      await monitor.ready((marker) => stack.r.exists(marker));
      // This client takes every progress notification by its token (beforeAll's handler), so the call names its own.
      const result = (await client.request(
        { method: 'tools/call', params: { name: 'py_talk', arguments: { n: 3 }, _meta: { progressToken: 'talk' } } },
        CallToolResultSchema,
      )) as CallToolResult;
      expect(result.structuredContent).toEqual({ n: 3 });
      expect(progress.get('talk')?.at(-1)).toBe(2);
      await waitFor(() => logs.length === 2, { message: 'the log messages did not reach the caller' });
      // Python sends them in the background: their order is not the point here.
      expect(logs).toEqual(
        expect.arrayContaining([
          { n: 3, line: 1 },
          { n: 3, line: 2 },
        ]),
      );
      const ours = (name: string) =>
        monitor.commands.filter((c) => c.name === name && c.args[0]?.startsWith(`${stack.prefix}:`) === true);
      // The last progress, the two logs, the output wake-up and the terminal status at least; no classic PUBLISH.
      await waitFor(() => ours('spublish').length >= 5, { message: 'fewer than 5 SPUBLISHes on the shard channels' });
      expect(ours('publish').map((c) => `${c.source} ${c.args.join(' ')}`)).toEqual([]);
    } finally {
      monitor.close();
    }
  });

  it('refuses a braced prefix with the sharded layout, in one line', async () => {
    const refused = spawnProcess(PYTHON!, ['-m', 'taskrelay_worker'], {
      REDIS_URL: stack.redis.url,
      TASKRELAY_PREFIX: `{${stack.prefix}}`,
      TASKRELAY_KEY_LAYOUT: 'sharded',
      TASKRELAY_TOOLS: PY_TOOLS,
    });
    expect(await refused.exited).toBe(1);
    expect(refused.output().trim()).toMatch(
      /^taskrelay-worker: Invalid configuration: TASKRELAY_PREFIX must have no braces with the sharded key layout[^\n]*$/,
    );
  });
});
