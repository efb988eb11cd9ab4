/**
 * PROTOCOL.md §26.3, §3.5: a batch child's run goes through the same named stages as a task's (engine/stages/). Its
 * admit stage refuses with the child's failed outcome where a task's would fail the task, and its limits send it back
 * to wait; the cross-process flow is test/batch.e2e.test.ts.
 */
import { describe, expect, it } from 'vitest';
import type { Job } from 'bullmq';
import { z } from 'zod';
import { TaskrelayError } from '@taskrelay/shared';
import { defineTool, type ToolDefinition } from '../src/define-tool.js';
import { ChildAdmission } from '../src/engine/stages/admit.js';
import type { ToolLimits } from '../src/engine/tool-limits.js';
import type { RunningJob } from '../src/engine/running-jobs.js';

const tool = defineTool({
  name: 'child_tool',
  description: 'A child.',
  inputSchema: z.object({ n: z.number() }),
  maxStalls: 1,
  run: () => 'ok',
});
const tools = new Map<string, ToolDefinition>([[tool.name, tool]]);
const job = (stalledCounter = 0) => ({ queueName: 'q-default.child_tool', stalledCounter }) as Job<unknown, void>;
const data = (over: Record<string, unknown> = {}) => ({
  taskId: 'parent',
  child: 0,
  tool: 'child_tool',
  arguments: { n: 1 },
  ...over,
});
const entry = {} as RunningJob;
const limitsThat = (admit: () => Promise<unknown>) => ({ admit }) as unknown as ToolLimits;

describe('26.3 a batch child is admitted by the stages a task is', () => {
  it('refuses a tool this worker does not serve, a child that stalled too often and bad arguments, as its outcome', () => {
    const admission = new ChildAdmission({ tools });
    expect(admission.check(job(), data({ tool: 'other' }))).toEqual({
      refused: expect.objectContaining({
        status: 'failed',
        error: expect.objectContaining({ code: 'TOOL_NOT_FOUND' }),
      }) as unknown,
    });
    expect(admission.check(job(2), data())).toEqual({
      refused: expect.objectContaining({
        status: 'failed',
        error: expect.objectContaining({ code: 'JOB_LOST' }),
      }) as unknown,
    });
    expect(admission.check(job(), data({ arguments: { n: 'x' } }))).toEqual({
      refused: expect.objectContaining({
        status: 'failed',
        error: expect.objectContaining({ code: 'INVALID_ARGUMENTS' }),
      }) as unknown,
    });
    expect(admission.check(job(), data())).toEqual({ tool, args: { n: 1 } });
  });

  it('sends the child back to wait when its limit says so, and admits it without limits', async () => {
    const wait = { limit: 'slot', waitMs: 1_000, message: 'Waiting for a slot' };
    const limited = new ChildAdmission({ tools, limits: limitsThat(() => Promise.resolve(wait)) });
    await expect(limited.admit(tool, { n: 1 }, job(), entry)).resolves.toEqual({ wait });
    await expect(new ChildAdmission({ tools }).admit(tool, { n: 1 }, job(), entry)).resolves.toEqual({});
  });

  it("fails the child when its limit's key function throws, and leaves Redis lost to the envelope", async () => {
    const thrown = new ChildAdmission({ tools, limits: limitsThat(() => Promise.reject(new Error('no tenant'))) });
    await expect(thrown.admit(tool, { n: 1 }, job(), entry)).resolves.toEqual({
      refused: expect.objectContaining({
        status: 'failed',
        error: { code: 'INTERNAL', message: 'no tenant' },
      }) as unknown,
    });
    const lost = new TaskrelayError('REDIS_UNAVAILABLE', 'Redis is unreachable');
    const unreachable = new ChildAdmission({ tools, limits: limitsThat(() => Promise.reject(lost)) });
    await expect(unreachable.admit(tool, { n: 1 }, job(), entry)).rejects.toBe(lost);
  });
});
