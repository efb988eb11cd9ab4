// The fixtures the official conformance suite's tasks scenarios (0.2.0-alpha.12) call, served by the stock worker:
// TASKRELAY_TOOLS=test/conformance/tasks-fixtures.mjs. Run by scripts/conformance.sh (through tools.mjs).
import { defineTool, ProtocolError } from '@taskrelay/worker';
import { z } from 'zod';

/** Sync-only: never a task. */
export const greet = defineTool({
  name: 'greet',
  description: 'Returns Hello, {name}!',
  inputSchema: z.object({ name: z.string().default('world') }),
  taskSupport: 'forbidden',
  run: ({ name }) => `Hello, ${name}!`,
});

/** Sleeps `seconds`, honouring cancel (so a cancelled task ends cancelled), then returns. */
export const slow_compute = defineTool({
  name: 'slow_compute',
  description: 'Sleeps seconds seconds, then returns a result; cancellable.',
  inputSchema: z.object({ seconds: z.number().min(0).max(600).default(1), label: z.string().optional() }),
  taskSupport: 'optional',
  async run({ seconds, label }, ctx) {
    const steps = Math.max(1, Math.round(seconds * 10));
    for (let i = 1; i <= steps && seconds > 0; i++) {
      await ctx.sleep((seconds * 1000) / steps);
      ctx.progress(i, steps, `computing ${label ?? ''} ${i}/${steps}`.trim());
    }
    return `Computed ${label ?? 'result'} after ${seconds} s`;
  },
});

/** A tool execution error after about a second; task support required (the -32021 scenario). */
export const failing_job = defineTool({
  name: 'failing_job',
  description: 'Fails with a tool execution error after about a second.',
  inputSchema: z.object({}),
  taskSupport: 'required',
  async run(_input, ctx) {
    await ctx.sleep(1000);
    throw new Error('failing_job failed, as it always does');
  },
});

/** A protocol-level error: the task ends failed with a JSON-RPC error. */
export const protocol_error_job = defineTool({
  name: 'protocol_error_job',
  description: 'Ends its task with a JSON-RPC internal error.',
  inputSchema: z.object({}),
  taskSupport: 'optional',
  async run(_input, ctx) {
    await ctx.sleep(100);
    throw new ProtocolError(-32603, 'protocol_error_job hit an internal failure');
  },
});

/** Asks once (elicitation) and completes with the answer. */
export const confirm_delete = defineTool({
  name: 'confirm_delete',
  description: 'Asks the user to confirm deleting a file, then reports what happened.',
  inputSchema: z.object({ filename: z.string().default('file.txt') }),
  taskSupport: 'optional',
  async run({ filename }, ctx) {
    const answer = await ctx.elicit({
      message: `Delete ${filename}?`,
      requestedSchema: { type: 'object', properties: { confirm: { type: 'boolean' } }, required: ['confirm'] },
    });
    const confirmed = answer.action === 'accept' && answer.content?.confirm === true;
    return confirmed ? `Deleted ${filename}` : `Kept ${filename}`;
  },
});

/** Asks two questions at once. */
export const multi_input = defineTool({
  name: 'multi_input',
  description: 'Asks two questions in parallel, then returns both answers.',
  inputSchema: z.object({}),
  taskSupport: 'optional',
  async run(_input, ctx) {
    const schema = {
      type: 'object',
      properties: { name: { type: 'string' }, confirm: { type: 'boolean' } },
    };
    const [a, b] = await Promise.all([
      ctx.elicit({ message: 'First?', requestedSchema: schema }),
      ctx.elicit({ message: 'Second?', requestedSchema: schema }),
    ]);
    return `Answers: ${JSON.stringify(a.content ?? {})} ${JSON.stringify(b.content ?? {})}`;
  },
});
