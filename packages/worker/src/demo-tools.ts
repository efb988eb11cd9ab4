/** The demo tools the stock worker serves (docs/MCP.md "Demo tools"). */
import { z } from 'zod';
import { NonRetryableError } from '@taskrelay/shared';
import { defineTool, type ToolDefinition } from './define-tool.js';

export const buildReport = defineTool({
  name: 'build_report',
  title: 'Build report',
  description:
    'Builds a report from a number of items, waiting delayMs per item and reporting progress as it goes. Cancellable between items.',
  inputSchema: z.object({
    report: z.string().describe('Name of the report'),
    items: z.number().int().min(1).max(1_000_000).describe('How many items to process'),
    delayMs: z.number().int().min(0).max(60_000).default(10).describe('Time spent on each item, in ms'),
  }),
  outputSchema: z.object({ report: z.string(), items: z.number().int() }),
  taskSupport: 'optional',
  async run({ report, items, delayMs }, ctx) {
    for (let i = 1; i <= items; i++) {
      await ctx.sleep(delayMs);
      ctx.progress(i, items, `Processed ${i} of ${items} items for ${report}`);
    }
    return {
      content: [{ type: 'text', text: `Report "${report}" built from ${items} items` }],
      structuredContent: { report, items },
    };
  },
});

export const failAfter = defineTool({
  name: 'fail_after',
  title: 'Fail after a delay',
  description: 'Waits delayMs, then fails with the given message, without retry.',
  inputSchema: z.object({
    delayMs: z.number().int().min(0).max(60_000).describe('Time to wait before failing, in ms'),
    message: z.string().describe('The error message the task fails with'),
  }),
  taskSupport: 'optional',
  async run({ delayMs, message }, ctx): Promise<never> {
    await ctx.sleep(delayMs);
    throw new NonRetryableError(message);
  },
});

export const waitForApproval = defineTool({
  name: 'wait_for_approval',
  title: 'Wait for approval',
  description:
    'Asks the user a yes/no question and completes with their answer. The task waits in input_required, holding no worker, until the user answers.',
  inputSchema: z.object({
    question: z.string().min(1).describe('The yes/no question to ask the user'),
  }),
  outputSchema: z.object({ approved: z.boolean() }),
  taskSupport: 'required',
  async run({ question }, ctx) {
    const answer = await ctx.elicit({
      message: question,
      requestedSchema: {
        type: 'object',
        properties: { approved: { type: 'boolean', title: 'Approve?', description: question } },
        required: ['approved'],
      },
    });
    // Decline and cancel are a "no": the user did not approve.
    const approved = answer.action === 'accept' && answer.content?.['approved'] === true;
    return {
      content: [{ type: 'text', text: approved ? `Approved: ${question}` : `Not approved: ${question}` }],
      structuredContent: { approved },
    };
  },
});

export const batchReport = defineTool({
  name: 'batch_report',
  title: 'Batch of reports',
  description:
    'Builds many reports as one task: one build_report child job per report, run across every worker of the pool. Progress counts finished reports; a failed report is counted, not fatal; a cancel stops the children.',
  inputSchema: z.object({
    reports: z.array(z.string()).min(1).max(10_000).describe('Names of the reports to build, one child job each'),
    items: z.number().int().min(1).max(1_000_000).describe('How many items each report processes'),
    delayMs: z.number().int().min(0).max(60_000).default(10).describe('Time spent on each item, in ms'),
  }),
  outputSchema: z.object({
    completed: z.number().int(),
    failed: z.number().int(),
    reports: z.array(z.object({ report: z.string(), status: z.enum(['completed', 'failed', 'cancelled']) })),
  }),
  taskSupport: 'required',
  async run({ reports, items, delayMs }, ctx) {
    const batch = await ctx.fanOut(
      reports.map((report) => ({ report, items, delayMs })),
      { tool: 'build_report' },
    );
    // The first 1000 outcomes come inline; the rest are paged from the batch (PROTOCOL.md §26.1).
    const outcomes = [...batch.outcomes];
    while (outcomes.length < batch.total) {
      outcomes.push(...(await ctx.batchOutcomes(outcomes.length, Math.min(1_000, batch.total - outcomes.length))));
    }
    return {
      content: [
        {
          type: 'text',
          text: `Built ${batch.completed} of ${batch.total} reports (${batch.failed} failed)`,
        },
      ],
      structuredContent: {
        completed: batch.completed,
        failed: batch.failed,
        reports: outcomes.map((outcome) => ({ report: reports[outcome.index] ?? '', status: outcome.status })),
      },
    };
  },
});

/** Every demo tool, as the stock worker serves them when `TASKRELAY_TOOLS` is unset. */
export const demoTools: readonly ToolDefinition[] = [buildReport, waitForApproval, failAfter, batchReport];
