/**
 * PROTOCOL.md §19 inside one session: a question the client has answered is never asked again on another stream —
 * not while its answer is being stored, and not by a late read of the task once it moved on. Both races were seen in
 * CI as a second `elicitation/create` for one task (test/question-once.e2e.test.ts, 1 task in 20).
 */
import type { Server } from '@modelcontextprotocol/sdk/server/index.js';
import { describe, expect, it } from 'vitest';
import { createLogger, type TaskRecord } from '@taskrelay/shared';
import { ClientChannel, type AnswerOutcome } from '../src/transports/session/client-channel.js';

interface Deferred<T> {
  promise: Promise<T>;
  resolve: (value: T) => void;
}

function deferred<T>(): Deferred<T> {
  let resolve!: (value: T) => void;
  const promise = new Promise<T>((r) => (resolve = r));
  return { promise, resolve };
}

const record = {
  taskId: 't1',
  status: 'input_required',
  pendingInputs: ['1'],
  inputRequests: { '1': { method: 'elicitation/create', params: { message: 'Go?', requestedSchema: {} } } },
  deadlineAt: Date.now() + 60_000,
} as unknown as TaskRecord;

/** A session whose client answers every request at once; storing an answer waits until the test lets it go. */
function session() {
  const sent: Array<string | undefined> = [];
  const server = {
    getClientCapabilities: () => ({ elicitation: {} }),
    transport: undefined,
    request: (_req: unknown, _schema: unknown, options: { relatedRequestId?: string }) => {
      sent.push(options.relatedRequestId);
      return Promise.resolve({ action: 'accept', content: { approved: true } });
    },
  } as unknown as Server;
  const storing: Array<Deferred<AnswerOutcome>> = [];
  const channel = new ClientChannel({
    server,
    sessionId: 's1',
    log: createLogger('test', { level: 'silent' }),
    answer: () => {
      const d = deferred<AnswerOutcome>();
      storing.push(d);
      return d.promise;
    },
  });
  const settle = () => new Promise((r) => setTimeout(r, 0));
  return { channel, sent, storing, settle };
}

describe('ClientChannel: a question answered in a session goes nowhere again (§19)', () => {
  it('a late read delivered after the task moved on is not asked on another stream', async () => {
    const { channel, sent, storing, settle } = session();
    const get = channel.sink(undefined, 'task');
    const result = channel.sink('r1', 'task');
    get.deliverInput(record);
    await settle();
    expect(storing).toHaveLength(1); // answered on GET, being stored
    get.withdrawInput('t1'); // the task moved on (its 'working' event)
    result.deliverInput(record); // a tasks/result whose read of the task started before that
    await settle();
    storing[0]?.resolve('stored');
    await settle();
    expect(sent).toEqual([undefined]);
  });

  it('a stream that leaves while its answer is stored does not move the question to a standby', async () => {
    const { channel, sent, storing, settle } = session();
    const result = channel.sink('r1', 'task');
    const get = channel.sink(undefined, 'task');
    result.deliverInput(record);
    get.deliverInput(record); // stands by: the question is in flight on the tasks/result stream
    await settle();
    expect(storing).toHaveLength(1);
    result.leave?.('t1'); // the tasks/result answered (the task ended) before the store call returned
    await settle();
    storing[0]?.resolve('stored');
    await settle();
    get.deliverInput(record);
    await settle();
    expect(sent).toEqual(['r1']);
  });

  it('a refused answer on a stream that left moves the question to its standby', async () => {
    const { channel, sent, storing, settle } = session();
    const result = channel.sink('r1', 'task');
    const get = channel.sink(undefined, 'task');
    result.deliverInput(record);
    get.deliverInput(record);
    await settle();
    result.leave?.('t1');
    storing[0]?.resolve('invalid');
    await settle();
    expect(sent).toEqual(['r1', undefined]);
  });
});
