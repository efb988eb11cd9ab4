/**
 * What a tools/call is, decided once (PROTOCOL.md §16, §17): the whole matrix of era, rendering, params.task,
 * requestState and the tool's taskSupport / inputFirst, as one table.
 */
import { describe, expect, it } from 'vitest';
import { callKind, type CallShape } from '../src/protocol/call-kind.js';

type Support = 'forbidden' | 'optional' | 'required';
const tool = (taskSupport: Support, inputFirst = false) => ({ name: 't', taskSupport, inputFirst });
const session = { extension: false, inputRounds: false, requestState: false };
const sessionExt = { extension: true, inputRounds: false, requestState: false };
const modern = { extension: false, inputRounds: true, requestState: false };
const modernExt = { extension: true, inputRounds: true, requestState: false };

describe('callKind', () => {
  it.each<[string, CallShape, ReturnType<typeof callKind>['kind'], boolean?]>([
    // 2025-11-25 without the extension: params.task decides, and must fit taskSupport (-32601 otherwise).
    ['session, task, optional', { ...session, taskRequested: true, tool: tool('optional') }, 'task'],
    ['session, plain, optional', { ...session, taskRequested: false, tool: tool('optional') }, 'call', false],
    ['session, task, forbidden', { ...session, taskRequested: true, tool: tool('forbidden') }, 'task-support-mismatch'],
    ['session, plain, required', { ...session, taskRequested: false, tool: tool('required') }, 'task-support-mismatch'],
    ['session, task, required', { ...session, taskRequested: true, tool: tool('required') }, 'task'],
    ['session, plain, forbidden', { ...session, taskRequested: false, tool: tool('forbidden') }, 'call', false],
    // The extension: the server chooses; never a mismatch.
    ['extension, no task, optional', { ...sessionExt, taskRequested: false, tool: tool('optional') }, 'task'],
    ['extension, task, forbidden', { ...sessionExt, taskRequested: true, tool: tool('forbidden') }, 'call', false],
    [
      'extension, inputFirst without rounds',
      { ...sessionExt, taskRequested: false, tool: tool('optional', true) },
      'task',
    ],
    // 2026-07-28 without the extension: plain calls; a task-required tool is -32021.
    ['modern, optional', { ...modern, taskRequested: false, tool: tool('optional') }, 'call', false],
    ['modern, required', { ...modern, taskRequested: false, tool: tool('required') }, 'task-required'],
    ['modern, a retry', { ...modern, requestState: true, taskRequested: false, tool: tool('optional') }, 'round-retry'],
    // 2026-07-28 with the extension.
    ['modern ext, optional', { ...modernExt, taskRequested: false, tool: tool('optional') }, 'task'],
    ['modern ext, required', { ...modernExt, taskRequested: false, tool: tool('required') }, 'task'],
    ['modern ext, forbidden', { ...modernExt, taskRequested: false, tool: tool('forbidden') }, 'call', false],
    ['modern ext, inputFirst', { ...modernExt, taskRequested: false, tool: tool('optional', true) }, 'call', true],
    [
      'modern ext, inputFirst but forbidden',
      { ...modernExt, taskRequested: false, tool: tool('forbidden', true) },
      'call',
      false,
    ],
    [
      'modern ext, a retry',
      { ...modernExt, requestState: true, taskRequested: false, tool: tool('optional') },
      'round-retry',
    ],
    // A requestState means nothing on a session: a new call.
    [
      'session, a stray requestState',
      { ...session, requestState: true, taskRequested: true, tool: tool('optional') },
      'task',
    ],
  ])('%s', (_what, shape, kind, becomesTask) => {
    const decided = callKind(shape);
    expect(decided.kind).toBe(kind);
    if (decided.kind === 'call') expect(decided.becomesTask).toBe(becomesTask);
    if (decided.kind === 'task-support-mismatch') expect(decided.message).toMatch(/taskSupport: (forbidden|required)/);
  });
});
