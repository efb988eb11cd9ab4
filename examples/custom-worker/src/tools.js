// The tools this worker serves: every export made by defineTool. The stock entry point loads this module
// (TASKRELAY_TOOLS=./src/tools.js taskrelay-worker); startWorker({ tools: [count_to] }) works as well.
import { defineTool } from '@taskrelay/worker';
import { z } from 'zod';

/** Counts from 1 to `n`, one step every `delayMs`, reporting progress; honours cancellation between steps. */
export const count_to = defineTool({
  name: 'count_to',
  title: 'Count to n',
  description: 'Counts from 1 to n, waiting delayMs between numbers, and reports each number as progress.',
  inputSchema: z.object({
    n: z.number().int().min(1).max(100_000),
    delayMs: z.number().int().min(0).max(10_000).default(10),
  }),
  outputSchema: z.object({ counted: z.number().int() }),
  async run({ n, delayMs }, ctx) {
    for (let i = 1; i <= n; i++) {
      await ctx.sleep(delayMs); // throws CancelledError once the task is cancelled
      ctx.progress(i, n, `Counted to ${i}`);
    }
    return { counted: n };
  },
});
