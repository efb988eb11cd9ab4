/**
 * The 2026-07-28 era's SDK client for `pnpm bench --sdk` (issue 37): the v2 SDK `Client` (`@modelcontextprotocol/client`
 * 2.4, pinned to 2026-07-28, so sessionless) with `@modelcontextprotocol/ext-tasks` 0.2.2 over it, connected exactly as
 * the repo's recipe does it (examples/ext-tasks/client.mjs `connectTasks`, which test/ext-tasks-recipe.e2e.test.ts
 * runs): ext-tasks sends the tasks extension's requests through the recipe's `rawDispatch`, which adds the SEP-2243
 * routing headers.
 *
 * A task operation is what ext-tasks does with a tool call: `tools/call` declaring the extension; when the server
 * answers with a task, `tasks/get` every `pollIntervalMs` it suggests until the task is terminal (the result comes
 * inlined in the terminal `tasks/get`); ext-tasks 0.2.2 polls, it does not open `subscriptions/listen`. A plain
 * operation is the v2 client's own `client.callTool` on the same era.
 */
import { resolve } from 'node:path';
import { pathToFileURL } from 'node:url';
import type { Client } from '@modelcontextprotocol/client';
import { resultFromTaskOutcome, type TaskEnabledSession } from '@modelcontextprotocol/ext-tasks/client';
import { ROOT } from '../../test/helpers/processes.js';

const RECIPE = pathToFileURL(resolve(ROOT, 'examples/ext-tasks/client.mjs')).href;

interface Recipe {
  connectTasks(
    url: string,
    options?: { token?: string; clientInfo?: { name: string; version: string } },
  ): Promise<{ client: Client; session: TaskEnabledSession; close(): Promise<void> }>;
}

/** One virtual client: what each operation is, and how many task calls the server answered with a task. */
export interface ExtRunner {
  task(): Promise<void>;
  plain(): Promise<void>;
  close(): Promise<void>;
  /** Task operations the server ran as a task / answered at once (ext-tasks' `execution.kind`). */
  readonly kinds: { task: number; immediate: number };
}

const TOOL = 'bench_noop';

export async function openExtClients(url: string, count: number): Promise<ExtRunner[]> {
  const { connectTasks } = (await import(RECIPE)) as Recipe;
  return Promise.all(
    Array.from({ length: count }, async () => {
      const { client, session, close } = await connectTasks(url, {
        clientInfo: { name: 'bench-sdk-ext-tasks', version: '0.0.0' },
      });
      const kinds = { task: 0, immediate: 0 };
      return {
        kinds,
        close,
        async task() {
          const execution = await session.callTool(TOOL, {});
          kinds[execution.kind === 'task' ? 'task' : 'immediate']++;
          const { outcome } = await execution.settle();
          const result = resultFromTaskOutcome(outcome);
          if (result.isError) throw new Error(`tool error: ${JSON.stringify(result).slice(0, 200)}`);
        },
        async plain() {
          const result = await client.callTool({ name: TOOL, arguments: {} });
          if (result.isError) throw new Error(`tool error: ${JSON.stringify(result).slice(0, 200)}`);
        },
      };
    }),
  );
}
