/**
 * The requirements manifest (issue 19, Deliver item 7): each behaviour the gateway promises an MCP client, written
 * once against the uniform `Driver` (drivers.ts), with the specification or docs/PROTOCOL.md section it comes from
 * and the combinations of transport × tasks rendering it applies to. `test/requirements.e2e.test.ts` runs every
 * requirement on every combination it applies to, so a flow cannot drift between eras unnoticed.
 *
 * Where the eras differ by specification (a created task's shape, the cancel answer, which error a task-only tool
 * called plainly gets), the body branches on `d.combo.rendering` / `d.combo.transport`: the difference is then
 * written here, in one place, and every other expectation is shared.
 *
 * `knownFailure` marks a requirement that fails on one combination today, a suspected product bug, with what
 * differs and the assertion it fails with; the runner runs it as `it.fails` there, and only that failure counts (any
 * other error turns it red). Once fixed it turns red too: then delete the entry. `MANIFEST_STRICT=1` runs every
 * known failure as an ordinary test.
 *
 * Every row runs against both workers, the worker's language being a cell of the matrix: a Node worker serving
 * test/fixtures/manifest-tools.mjs and a Python worker serving test/fixtures/manifest_tools.py (the same tools).
 * What the Python worker does not do yet (PROTOCOL.md §29.3) is a `WORKER_GAPS` entry, and a row that needs it names
 * the gap in `gaps` with the failure it gives: it runs as `it.fails` on that language while the gap is open. Once the
 * worker has it, set the gap's `open` to false (every row bound to it then runs as an ordinary test), and delete it.
 */
import { expect } from 'vitest';
import { absenceWindow } from '../helpers/load.js';
import { waitFor } from '../helpers/wait-for.js';
import {
  RELATED_TASK,
  TASKS_EXT,
  TaskFailedError,
  type Answer,
  type CombinationId,
  type Driver,
  type InputRequest,
  type Json,
} from './drivers.js';

export type Language = 'node' | 'python';

export interface RequirementContext {
  /** The gateway's TASKRELAY_MAX_RESULT_BYTES. */
  maxResultBytes: number;
  /** The language of the worker serving the tools. */
  language: Language;
  /** The pids of the workers serving the tools. */
  workerPids: readonly number[];
}

export interface WorkerGap {
  language: Language;
  /** What the worker lacks, and where that is written. */
  reason: string;
  /** True while the worker lacks it: rows bound to it run as expected failures on that language. */
  open: boolean;
}

/**
 * PROTOCOL.md §29.3, "Not the same yet", as far as an MCP client can see it. Both are closed (`open: false`): the
 * Python worker has `ctx.fan_out` and isolated runs since pypar; their rows now must pass on it.
 */
export const WORKER_GAPS = {
  'python-fan-out': { language: 'python', reason: 'python: no fan-out (ctx.fanOut, §29.3)', open: false },
  'python-isolate': { language: 'python', reason: 'python: no isolated runs (§29.3, §31)', open: false },
} as const satisfies Record<string, WorkerGap>;

export type GapId = keyof typeof WORKER_GAPS;

export interface KnownFailure {
  /** What differs from the requirement, and from the other combinations. */
  differs: string;
  /** The failure it must fail with: any other error (a timeout, a driver bug) does not count as this one. */
  failsWith: RegExp;
}

export interface Requirement {
  /** Stable id, `R<n>-<slug>`. */
  id: string;
  /** What is required, as one sentence. */
  title: string;
  /** Where it is specified: docs/PROTOCOL.md sections, the MCP specification, SEPs. */
  spec: string;
  appliesTo: readonly CombinationId[];
  /** Combinations where it fails today (a suspected product bug), with what differs. */
  knownFailure?: Partial<Record<CombinationId, KnownFailure>>;
  /** Worker gaps this requirement needs closed, each with the failure it gives while open (on every combination). */
  gaps?: Partial<Record<GapId, RegExp>>;
  body: (d: Driver, ctx: RequirementContext) => Promise<void>;
}

const ALL: readonly CombinationId[] = ['session-2025', 'session-ext', 'sessionless-ext'];
const UNKNOWN_TASK = '0'.repeat(32);

function ok(answer: Answer, what: string): Json {
  if (!answer.ok) throw new Error(`${what} → JSON-RPC error ${JSON.stringify(answer.error)}`);
  return answer.result;
}

function rpcError(answer: Answer, what: string): { code: number; message: string; data?: unknown } {
  if (answer.ok) throw new Error(`${what} → a result where an error was required: ${JSON.stringify(answer.result)}`);
  return answer.error;
}

function textOf(result: Json): string {
  return ((result['content'] ?? []) as Json[]).map((c) => String(c['text'] ?? '')).join('');
}

const acceptName = (name: string) => (request: InputRequest) => {
  expect(request.method).toBe('elicitation/create');
  expect(request.params['message']).toBe('What is your name?');
  return { action: 'accept', content: { name } };
};

/** The progress values one notification stream carried are strictly increasing, on `token`, and reach `total`. */
function expectProgress(seen: Json[], token: unknown, total: number): void {
  expect(seen.length).toBeGreaterThan(0);
  const values = seen.map((p) => Number(p['progress']));
  for (let i = 1; i < values.length; i++) expect(values[i]).toBeGreaterThan(values[i - 1] ?? -Infinity);
  for (const p of seen) {
    expect(p['progressToken']).toBe(token);
    expect(p['total']).toBe(total);
  }
}

export const REQUIREMENTS: readonly Requirement[] = [
  {
    id: 'R1-tools-list',
    title: 'tools/list lists every tool with its name, description and input schema',
    spec: 'MCP tools/list; PROTOCOL.md §14 (resultType "complete" on 2026-07-28)',
    appliesTo: ALL,
    async body(d) {
      const tools = await d.listTools();
      const byName = new Map(tools.map((t) => [String(t['name']), t]));
      for (const name of ['m_count', 'm_count_plain', 'required_task', 'sleepy']) {
        expect(byName.get(name)).toMatchObject({ description: expect.any(String), inputSchema: { type: 'object' } });
      }
      if (d.combo.transport === 'sessionless')
        expect(ok(await d.request('tools/list'), 'tools/list')['resultType']).toBe('complete');
    },
  },
  {
    id: 'R2-tools-task-support',
    title: "tools/list shows each tool's taskSupport where the rendering has it (2025-11-25), and not elsewhere",
    spec: 'MCP 2025-11-25 Tool.execution.taskSupport; SEP-2663 (no per-tool flag: the server decides)',
    appliesTo: ALL,
    async body(d) {
      const tools = await d.listTools();
      const support = (name: string) =>
        (tools.find((t) => t['name'] === name)?.['execution'] as Json | undefined)?.['taskSupport'];
      if (d.combo.rendering === '2025-11-25') {
        expect([support('m_count'), support('m_count_plain'), support('required_task')]).toEqual([
          'optional',
          'forbidden',
          'required',
        ]);
      } else {
        for (const tool of tools) expect([tool['name'], tool['execution']]).toEqual([tool['name'], undefined]);
      }
    },
  },
  {
    id: 'R3-plain-result',
    title: 'a plain call answers the tool result itself (no task), structuredContent and its text',
    spec: 'PROTOCOL.md §4.4, §14 (resultType "complete" on 2026-07-28)',
    appliesTo: ALL,
    async body(d) {
      const { answer, requests } = await d.call('m_count_plain', { steps: 2, stepMs: 1 });
      const result = ok(answer, 'tools/call');
      expect(requests).toBe(1);
      expect(result).toMatchObject({ structuredContent: { steps: 2 } });
      expect(JSON.parse(textOf(result))).toEqual({ steps: 2 });
      expect(result['isError']).toBeFalsy();
      for (const key of ['task', 'taskId']) expect(result).not.toHaveProperty(key);
      if (d.combo.transport === 'sessionless') expect(result['resultType']).toBe('complete');
    },
  },
  {
    id: 'R4-plain-progress',
    title: "a plain call's progress arrives on its own progressToken, strictly increasing, before the result",
    spec: 'MCP basic/utilities/progress; PROTOCOL.md §6.3, §14 (progress on the response stream)',
    appliesTo: ALL,
    async body(d) {
      const seen: Json[] = [];
      const call = await d.call('m_count_plain', { steps: 4, stepMs: 40 }, { onProgress: (p) => seen.push(p) });
      expect(ok(call.answer, 'tools/call')).toMatchObject({ structuredContent: { steps: 4 } });
      expectProgress(seen, call.progressToken, 4);
      // The last value is flushed before the answer, on the same stream (§6.5).
      expect(seen.at(-1)).toMatchObject({ progress: 4, message: 'Step 4 of 4' });
    },
  },
  {
    id: 'R5-invalid-arguments',
    title: 'invalid arguments are an isError tool result naming the field, not a JSON-RPC error',
    spec: 'SEP-1303; PROTOCOL.md §4.1, §13 (a task: its result); MCP.md',
    appliesTo: ALL,
    async body(d) {
      const plain = ok((await d.call('m_count_plain', { steps: 'many' })).answer, 'tools/call (plain)');
      expect(plain['isError']).toBe(true);
      expect(textOf(plain)).toMatch(/steps/);

      const { answer, taskId } = await d.createTask('m_count', { steps: 'many' });
      ok(answer, 'tools/call (task)');
      const result = await d.taskResult(taskId);
      expect(result['isError']).toBe(true);
      expect(textOf(result)).toMatch(/steps/);
      // A tool error: failed in 2025-11-25, completed with the isError result in the extension (§13).
      const task = await d.waitStatus(taskId, 'terminal');
      expect(task['status']).toBe(d.combo.rendering === '2025-11-25' ? 'failed' : 'completed');
    },
  },
  {
    id: 'R6-task-created',
    title: "a task call answers at once with the rendering's CreateTaskResult, and tasks/get finds the task",
    spec: 'MCP 2025-11-25 tasks ({task}); SEP-2663 (flat Result & Task & {resultType: "task"}, durable before the answer)',
    appliesTo: ALL,
    async body(d) {
      const { answer, taskId } = await d.createTask('m_count', { steps: 1, stepMs: 1, holdMs: 60_000 });
      const created = ok(answer, 'tools/call');
      expect(taskId).toMatch(/^[0-9a-f]{32}$/);
      if (d.combo.rendering === '2025-11-25') {
        expect(Object.keys(created)).toEqual(['task']);
        expect(created['task']).toMatchObject({ taskId, status: 'working' });
        expect(created['task']['ttl']).toEqual(expect.any(Number));
        expect(created['task']['pollInterval']).toEqual(expect.any(Number));
      } else {
        expect(created).toMatchObject({ resultType: 'task', taskId, status: 'working' });
        expect(created['ttlMs']).toEqual(expect.any(Number));
        expect(created['pollIntervalMs']).toEqual(expect.any(Number));
        // Result & Task & {resultType}: nothing of a CallToolResult, nothing of 2025-11-25.
        for (const extra of ['task', 'ttl', 'pollInterval', 'content']) expect(created).not.toHaveProperty(extra);
      }
      // Durable before the answer: tasks/get resolves at once.
      expect(ok(await d.getTask(taskId), 'tasks/get')).toMatchObject({ taskId, status: 'working' });
      ok(await d.cancel(taskId), 'tasks/cancel');
    },
  },
  {
    id: 'R7-task-result',
    title: "a task is polled with tasks/get and ends with the tool's result (tasks/result, or inline in tasks/get)",
    spec: 'MCP 2025-11-25 tasks (tasks/result, related-task _meta); SEP-2663 (result inline in tasks/get); PROTOCOL.md §13',
    appliesTo: ALL,
    async body(d) {
      const { answer, taskId } = await d.createTask('m_count', { steps: 3, stepMs: 60 });
      ok(answer, 'tools/call');
      const polled = ok(await d.getTask(taskId), 'tasks/get');
      expect(['working', 'completed']).toContain(polled['status']);
      const result = await d.taskResult(taskId);
      expect(result).toMatchObject({ structuredContent: { steps: 3 } });
      expect(result['isError']).toBeFalsy();
      if (d.combo.rendering === '2025-11-25') expect(result['_meta']?.[RELATED_TASK]).toEqual({ taskId });
      else expect(JSON.stringify(result)).not.toContain(RELATED_TASK);
      const done = await d.waitStatus(taskId, 'terminal');
      expect(done['status']).toBe('completed');
      if (d.combo.rendering === 'extension') expect(done['resultType']).toBe('complete');
    },
  },
  {
    id: 'R8-task-progress',
    title: "a task's progress: notifications on the original token (2025-11-25), statusMessage (extension)",
    spec: 'MCP 2025-11-25 progress ("throughout the task\'s lifetime"); SEP-2663 ("statusMessage carries progress"); PROTOCOL.md §6, §13',
    appliesTo: ALL,
    async body(d) {
      const notified: Json[] = [];
      // The tool holds after its last step until cancelled: its last progress is seen while it works, whatever the load.
      const { answer, taskId } = await d.createTask(
        'm_count',
        { steps: 5, stepMs: 40, holdMs: 60_000 },
        { onProgress: (p) => notified.push(p), meta: { progressToken: 'unused-by-the-extension' } },
      );
      ok(answer, 'tools/call');
      // Both renderings mirror progress into statusMessage (§6.2); the extension has nothing else.
      const working = await waitFor(
        async () => {
          const task = ok(await d.getTask(taskId), 'tasks/get');
          return task['statusMessage'] === 'Step 5 of 5' ? task : undefined;
        },
        { timeoutMs: 20_000, message: 'tasks/get never showed the last progress in statusMessage' },
      );
      expect(working['status']).toBe('working');
      if (d.combo.rendering === '2025-11-25') {
        await waitFor(() => notified.at(-1)?.['progress'] === 5, { message: 'no 5/5 progress notification' });
        expectProgress(notified, notified[0]?.['progressToken'], 5);
        for (const p of notified) expect(p['_meta']?.[RELATED_TASK]).toEqual({ taskId });
      } else {
        expect(notified).toEqual([]);
      }
      ok(await d.cancel(taskId), 'tasks/cancel');
      expect((await d.waitStatus(taskId, 'terminal'))['status']).toBe('cancelled');
    },
  },
  {
    id: 'R9-cancel',
    title: 'tasks/cancel ends a working task cancelled; a cancel of a terminal task: -32602 (2025) / an ack (ext)',
    spec: 'MCP 2025-11-25 tasks ("MUST be cancelled before the response"); SEP-2663 (ack, idempotent); PROTOCOL.md §7',
    appliesTo: ALL,
    async body(d) {
      const { answer, taskId } = await d.createTask('sleepy', { ms: 60_000 });
      ok(answer, 'tools/call');
      const cancelled = ok(await d.cancel(taskId), 'tasks/cancel');
      if (d.combo.rendering === '2025-11-25') expect(cancelled).toMatchObject({ taskId, status: 'cancelled' });
      else expect(cancelled).toMatchObject({ resultType: 'complete' });
      expect((await d.waitStatus(taskId, 'terminal'))['status']).toBe('cancelled');

      const again = await d.cancel(taskId);
      if (d.combo.rendering === '2025-11-25') expect(rpcError(again, 'tasks/cancel (terminal)').code).toBe(-32602);
      else expect(ok(again, 'tasks/cancel (terminal)')).toMatchObject({ resultType: 'complete' });
      expect((await d.waitStatus(taskId, 'terminal'))['status']).toBe('cancelled');
    },
  },
  {
    id: 'R10-task-input',
    title: 'a task that asks is input_required; the answer resumes it to its result',
    spec: 'MCP 2025-11-25 tasks input_required (elicitation on the session); SEP-2663 inputRequests + tasks/update; PROTOCOL.md §12, §17 table',
    appliesTo: ALL,
    async body(d) {
      const { answer, taskId } = await d.createTask('m_ask', {});
      ok(answer, 'tools/call');
      const waiting = await d.waitStatus(taskId, 'input_required');
      if (d.combo.rendering === 'extension') {
        expect(waiting['inputRequests']).toMatchObject({
          name: { method: 'elicitation/create', params: { message: 'What is your name?' } },
        });
      }
      const asked: InputRequest[] = [];
      const result = await d.taskResult(taskId, {
        answer: (request) => {
          asked.push(request);
          return acceptName('Ada')(request);
        },
      });
      expect(result).toMatchObject({ structuredContent: { action: 'accept', name: 'Ada' } });
      expect(asked.length).toBeGreaterThan(0);
      if (d.combo.rendering === 'extension') expect(asked[0]?.key).toBe('name');
    },
  },
  {
    id: 'R11-question-once',
    title: "a task's question reaches the client once while the stream it went out on is open",
    spec: 'issue 19 Deliver item 6; PROTOCOL.md §19',
    appliesTo: ALL,
    async body(d) {
      const { answer, taskId } = await d.createTask('m_ask', {});
      ok(answer, 'tools/call');
      await d.waitStatus(taskId, 'input_required');
      // 2025-11-25: with no tasks/result open, the question is pushed on the GET stream; the client holds it.
      if (d.combo.rendering === '2025-11-25') {
        await waitFor(() => d.questionsHeld() === 1, { message: 'the question did not reach the GET stream' });
      }
      // A person takes a moment to answer a pushed question: up to 2 s (stretched by the load), or until a copy of it arrives, whichever is
      // first (so a duplicate is seen whenever one is sent, and a correct gateway costs those 2 s once).
      const asked: InputRequest[] = [];
      let copyArrived = () => {};
      const copy = new Promise<void>((resolve) => (copyArrived = resolve));
      const result = await d.taskResult(taskId, {
        answer: async (request) => {
          asked.push(request);
          if (asked.length > 1) copyArrived();
          if (d.combo.rendering === '2025-11-25') await Promise.race([copy, absenceWindow(2_000)]);
          return acceptName('Lin')(request);
        },
      });
      expect(result).toMatchObject({ structuredContent: { action: 'accept', name: 'Lin' } });
      expect(asked.map((q) => q.method)).toEqual(['elicitation/create']);
    },
  },
  {
    id: 'R12-plain-input',
    title: 'a plain call that asks: elicitation on the request stream (session) / an MRTR round (2026-07-28)',
    spec: 'MCP 2025-11-25 elicitation; SEP-2322 InputRequiredResult + requestState; PROTOCOL.md §17',
    appliesTo: ALL,
    async body(d) {
      const asked: InputRequest[] = [];
      const call = await d.call(
        'm_ask_plain',
        {},
        {
          answer: (request) => {
            asked.push(request);
            return acceptName('Grace')(request);
          },
        },
      );
      expect(ok(call.answer, 'tools/call')).toMatchObject({ structuredContent: { action: 'accept', name: 'Grace' } });
      expect(asked).toHaveLength(1);
      // One request on a session (the question rides its stream); round 1 + its retry on 2026-07-28.
      expect(call.requests).toBe(d.combo.transport === 'session' ? 1 : 2);
      if (d.combo.transport === 'sessionless') expect(asked[0]?.key).toBe('name');

      if (d.combo.transport === 'sessionless') {
        // Round 1 on its own is the InputRequiredResult: no task, a signed state.
        const round1 = ok((await d.call('m_ask_plain', {})).answer, 'tools/call round 1');
        expect(round1).toMatchObject({
          resultType: 'input_required',
          inputRequests: { name: { method: 'elicitation/create' } },
        });
        expect(round1['requestState']).toEqual(expect.any(String));
        expect(round1).not.toHaveProperty('taskId');
      }
    },
  },
  {
    id: 'R13-unknown-task',
    title: 'an unknown task id is -32602 on every task method of the rendering',
    spec: 'MCP 2025-11-25 tasks (errors); SEP-2663; PROTOCOL.md §13',
    appliesTo: ALL,
    async body(d) {
      const methods =
        d.combo.rendering === '2025-11-25'
          ? ['tasks/get', 'tasks/result', 'tasks/cancel']
          : ['tasks/get', 'tasks/update', 'tasks/cancel'];
      for (const method of methods) {
        const params: Json = { taskId: UNKNOWN_TASK };
        if (method === 'tasks/update') params['inputResponses'] = { '1': { action: 'decline' } };
        expect([method, rpcError(await d.request(method, params), method).code]).toEqual([method, -32602]);
      }
    },
  },
  {
    id: 'R14-foreign-task',
    title: "another principal's task is invisible: -32602 as for an unknown one, and left untouched",
    spec: 'MCP 2025-11-25 tasks §Security (bind to the authorization context); SEP-2663; MCP.md',
    appliesTo: ALL,
    async body(d) {
      const { answer, taskId } = await d.createTask('sleepy', { ms: 60_000 });
      ok(answer, 'tools/call');
      const bob = await d.as('bob');
      const methods =
        d.combo.rendering === '2025-11-25'
          ? ['tasks/get', 'tasks/result', 'tasks/cancel']
          : ['tasks/get', 'tasks/update', 'tasks/cancel'];
      for (const method of methods) {
        const params: Json = { taskId };
        if (method === 'tasks/update') params['inputResponses'] = { '1': { action: 'decline' } };
        expect([method, rpcError(await bob.request(method, params), method).code]).toEqual([method, -32602]);
      }
      if (d.combo.rendering === '2025-11-25') {
        const listed = ok(await bob.request('tasks/list'), 'tasks/list');
        expect((listed['tasks'] as Json[]).map((t) => t['taskId'])).not.toContain(taskId);
      }
      expect(ok(await d.getTask(taskId), 'tasks/get (owner)')['status']).toBe('working');
      ok(await d.cancel(taskId), 'tasks/cancel (owner)');
    },
  },
  {
    id: 'R15-result-cap-plain',
    title: "a plain call's result over TASKRELAY_MAX_RESULT_BYTES is delivered as an isError result saying so",
    spec: 'docs/CONFIGURATION.md TASKRELAY_MAX_RESULT_BYTES',
    appliesTo: ALL,
    async body(d, ctx) {
      const plain = ok((await d.call('m_big_plain', { bytes: ctx.maxResultBytes * 2 })).answer, 'tools/call');
      expect(JSON.stringify(plain).length).toBeLessThan(ctx.maxResultBytes);
      expect(plain['isError']).toBe(true);
      expect(textOf(plain)).toMatch(/larger than this gateway delivers/);
    },
  },
  {
    id: 'R16-result-cap-task',
    title:
      "a task's result over TASKRELAY_MAX_RESULT_BYTES is delivered as an isError result; the task stays completed",
    spec: 'docs/CONFIGURATION.md TASKRELAY_MAX_RESULT_BYTES ("the task itself keeps its status")',
    appliesTo: ALL,
    async body(d, ctx) {
      const { answer, taskId } = await d.createTask('m_big', { bytes: ctx.maxResultBytes * 2 });
      ok(answer, 'tools/call');
      const result = await d.taskResult(taskId);
      expect(JSON.stringify(result).length).toBeLessThan(ctx.maxResultBytes);
      expect(result['isError']).toBe(true);
      expect(textOf(result)).toMatch(/larger than this gateway delivers/);
      expect((await d.waitStatus(taskId, 'terminal'))['status']).toBe('completed');
    },
  },
  {
    id: 'R17-task-required-plain',
    title: "a task-only tool called without asking for a task gets the era's error",
    spec: 'MCP 2025-11-25 tools (taskSupport "required": -32601); SEP-2663 (-32021 requiredCapabilities); PROTOCOL.md §14',
    appliesTo: ALL,
    async body(d) {
      const { answer } = await d.call('required_task', {}, { declareTasks: false });
      const error = rpcError(answer, 'tools/call');
      if (d.combo.transport === 'session') {
        expect(error.code).toBe(-32601);
      } else {
        expect(error.code).toBe(-32021);
        expect(error.data).toEqual({ requiredCapabilities: { extensions: { [TASKS_EXT]: {} } } });
      }
      // Declaring the extension (or asking for a task) makes it a task instead.
      const { answer: created, taskId } = await d.createTask('required_task', { ms: 1 });
      ok(created, 'tools/call (task)');
      expect(await d.taskResult(taskId)).toMatchObject({ content: [{ type: 'text', text: 'required_task done' }] });
    },
  },
  {
    id: 'R18-unknown-method',
    title: 'an unknown method is -32601 (HTTP 404 on 2026-07-28)',
    spec: 'JSON-RPC 2.0 -32601; PROTOCOL.md §16.2',
    appliesTo: ALL,
    async body(d) {
      const answer = await d.request('no/such-method', {});
      expect(rpcError(answer, 'no/such-method').code).toBe(-32601);
      if (d.combo.transport === 'sessionless') expect(answer.status).toBe(404);
    },
  },
  {
    id: 'R19-removed-methods',
    title: "a method the era removed is -32601 (HTTP 404 on 2026-07-28), never answered in another era's shape",
    spec: 'SEP-2663 (tasks/result, tasks/list are not part of the extension); 2026-07-28 removals; PROTOCOL.md §14, §16.2',
    appliesTo: ['session-ext', 'sessionless-ext'],
    async body(d) {
      for (const method of d.removedMethods) {
        const answer = await d.request(method, { taskId: UNKNOWN_TASK });
        const code = answer.ok ? `a result: ${JSON.stringify(answer.result).slice(0, 120)}` : answer.error.code;
        expect([method, code]).toEqual([method, -32601]);
        if (d.combo.transport === 'sessionless') expect([method, answer.status]).toEqual([method, 404]);
      }
    },
  },
  {
    id: 'R20-tool-error',
    title: "a tool's thrown error ends its task with an isError result: failed (2025-11-25), completed (ext)",
    spec: 'PROTOCOL.md §13 (outcomeOf); SEP-2663 ("an isError tool result is completed")',
    appliesTo: ALL,
    async body(d) {
      const { answer, taskId } = await d.createTask('fail_now', { message: 'disk full' });
      ok(answer, 'tools/call');
      const result = await d.taskResult(taskId).catch((error: unknown) => {
        if (error instanceof TaskFailedError) throw new Error(`a tool error became a JSON-RPC error: ${error.message}`);
        throw error;
      });
      expect(result['isError']).toBe(true);
      expect(textOf(result)).toContain('disk full');
      const task = await d.waitStatus(taskId, 'terminal');
      expect(task['status']).toBe(d.combo.rendering === '2025-11-25' ? 'failed' : 'completed');
    },
  },
  {
    id: 'R21-fan-out',
    title: "a tool's fan-out runs one child task per item and ends with the batch's counts",
    spec: 'PROTOCOL.md §26 (ctx.fanOut); §29.3 (not in the Python worker yet)',
    appliesTo: ALL,
    gaps: { 'python-fan-out': /no fan-out/ },
    async body(d) {
      const items = [{ n: 1 }, { n: 2 }, { n: 3, fail: true }];
      const { answer, taskId } = await d.createTask('m_fan_out', { items });
      ok(answer, 'tools/call');
      // Polled to its end first (bounds stretched by the load): a client's one request would time out on a busy host.
      const done = await d.waitStatus(taskId, 'terminal');
      const result = await d.taskResult(taskId);
      expect(result['isError'], textOf(result)).toBeFalsy();
      expect(result['structuredContent']).toEqual({ total: 3, completed: 2, failed: 1, cancelled: 0 });
      expect(done['status']).toBe('completed');
    },
  },
  {
    id: 'R22-isolated-run',
    title: 'a tool defined isolated runs in a child process of its worker, not in the worker itself',
    spec: 'PROTOCOL.md §31 (isolate); §29.3 (Node tools only)',
    appliesTo: ALL,
    gaps: { 'python-isolate': /ran in its worker's own process/ },
    async body(d, ctx) {
      const { answer, taskId } = await d.createTask('m_isolated', {});
      ok(answer, 'tools/call');
      // A run forks a Node process: on a loaded 2-core host (load 35) that outlasted the SDK's 60 s request timeout of
      // tasks/result, so the task is polled to its end first (bounds stretched by the load).
      await d.waitStatus(taskId, 'terminal');
      const result = await d.taskResult(taskId);
      expect(result['isError'], textOf(result)).toBeFalsy();
      const pid = Number(result['structuredContent']?.['pid']);
      expect(pid).toBeGreaterThan(0);
      expect(ctx.workerPids, "the tool ran in its worker's own process").not.toContain(pid);
    },
  },
];
