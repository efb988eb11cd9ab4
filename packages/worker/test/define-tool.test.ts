import { describe, expect, it } from 'vitest';
import { z } from 'zod';
import { z as z3 } from 'zod3';
import { NonRetryableError } from '@taskrelay/shared';
import { defineTool, isToolDefinition, toToolResult, toolJsonSchema } from '../src/define-tool.js';
import { buildReport, demoTools, failAfter } from '../src/demo-tools.js';

const noop = defineTool({
  name: 'noop',
  description: 'Does nothing.',
  inputSchema: z.object({}),
  run: () => 'ok',
});

const withOutput = defineTool({
  name: 'with_output',
  description: 'Has an output schema.',
  inputSchema: z.object({}),
  outputSchema: z.object({ count: z.number().int() }),
  run: () => ({ count: 1 }),
});

describe('defineTool result normalisation', () => {
  it('a string result becomes one text content item', () => {
    expect(toToolResult(noop, 'hello')).toEqual({ content: [{ type: 'text', text: 'hello' }] });
  });

  it('a result with a content array is used as is', () => {
    const result = { content: [{ type: 'text', text: 'x' }], structuredContent: { a: 1 }, isError: false };
    expect(toToolResult(noop, result)).toBe(result);
  });

  it('a result with a content array that is not a CallToolResult fails the run without retry, naming the field', () => {
    for (const bad of [
      { content: [{ text: 'no type' }] },
      { content: [{ type: 'bogus' }] },
      { content: [], structuredContent: 'not an object' },
      { content: [], isError: 'yes' },
    ]) {
      expect(() => toToolResult(noop, bad)).toThrow(NonRetryableError);
    }
    expect(() => toToolResult(noop, { content: [{ type: 'bogus' }] })).toThrow(
      /returned an invalid result: content\.0\.type/,
    );
  });

  it('a plain object becomes structuredContent plus its JSON as text', () => {
    expect(toToolResult(noop, { a: 1, b: 'two' })).toEqual({
      content: [{ type: 'text', text: '{"a":1,"b":"two"}' }],
      structuredContent: { a: 1, b: 'two' },
    });
  });

  it('a value that is not a plain object becomes JSON text without structuredContent', () => {
    expect(toToolResult(noop, [1, 2])).toEqual({ content: [{ type: 'text', text: '[1,2]' }] });
    expect(toToolResult(noop, 42)).toEqual({ content: [{ type: 'text', text: '42' }] });
    expect(toToolResult(noop, undefined)).toEqual({ content: [] });
  });

  it('a value matching the outputSchema is stored as parsed', () => {
    expect(toToolResult(withOutput, { count: 3 })).toEqual({
      content: [{ type: 'text', text: '{"count":3}' }],
      structuredContent: { count: 3 },
    });
  });

  it('a value breaking the outputSchema is a non-retryable error naming the field', () => {
    expect(() => toToolResult(withOutput, { count: 'many' })).toThrow(NonRetryableError);
    expect(() => toToolResult(withOutput, { count: 'many' })).toThrow(/with_output.*count:/);
  });
});

describe('defineTool options', () => {
  it('applies the defaults: taskSupport optional, one attempt, jittered exponential backoff, 10 stalls, no timeout', () => {
    expect(noop.taskSupport).toBe('optional');
    expect(noop.attempts).toBe(1);
    expect(noop.timeoutMs).toBeUndefined();
    expect(noop.maxStalls).toBe(10);
    expect(noop.descriptor).toEqual({
      name: 'noop',
      description: 'Does nothing.',
      inputSchema: { $schema: 'https://json-schema.org/draft/2020-12/schema', type: 'object', properties: {} },
      taskSupport: 'optional',
      attempts: 1,
      backoff: { type: 'exponential', delayMs: 1000, jitter: 0.5 },
      maxStalls: 10,
      version: noop.version,
    });
  });

  it('publishes backoff and maxStalls, and rejects invalid ones', () => {
    const base = { name: 'b', description: 'x', inputSchema: z.object({}), run: () => 'x' };
    const tool = defineTool({ ...base, backoff: { type: 'fixed', delayMs: 250 }, maxStalls: 0 });
    expect(tool.descriptor).toMatchObject({ backoff: { type: 'fixed', delayMs: 250 }, maxStalls: 0 });
    expect(() => defineTool({ ...base, maxStalls: -1 })).toThrow(/maxStalls/);
    expect(() => defineTool({ ...base, backoff: { type: 'fixed', delayMs: 1, jitter: 2 } })).toThrow(/backoff/);
  });

  it('publishes title, timeout, attempts and the output schema in the descriptor', () => {
    const tool = defineTool({
      name: 'full',
      title: 'Full',
      description: 'Every option.',
      inputSchema: z.object({ a: z.string() }),
      outputSchema: z.object({ b: z.number() }),
      taskSupport: 'required',
      timeoutMs: 1_000,
      attempts: 3,
      run: () => ({ b: 1 }),
    });
    expect(tool.descriptor).toMatchObject({
      name: 'full',
      title: 'Full',
      taskSupport: 'required',
      timeoutMs: 1_000,
      attempts: 3,
      outputSchema: { type: 'object', properties: { b: { type: 'number' } }, required: ['b'] },
    });
  });

  it('rejects an invalid name, a non-object input schema and a bad attempts count', () => {
    const base = { description: 'x', inputSchema: z.object({}), run: () => 'x' };
    expect(() => defineTool({ ...base, name: 'has space' })).toThrow(/name/);
    expect(() => defineTool({ ...base, name: 'ok', attempts: 0 })).toThrow(/attempts/);
    expect(() => defineTool({ ...base, name: 'ok', inputSchema: z.string() as never })).toThrow(
      /inputSchema must be a zod object schema/,
    );
  });

  it('rejects a zod 3 schema with an error that names the zod version it needs', () => {
    const base = { name: 'old', description: 'x', run: () => 'x' };
    expect(() => defineTool({ ...base, inputSchema: z3.object({ a: z3.string() }) as never })).toThrow(
      /defineTool\(old\): inputSchema is a zod 3 schema; @taskrelay\/worker needs zod 4/,
    );
    expect(() =>
      defineTool({ ...base, inputSchema: z.object({}), outputSchema: z3.object({ b: z3.number() }) as never }),
    ).toThrow(/outputSchema is a zod 3 schema/);
  });

  it('isToolDefinition recognises definitions and nothing else', () => {
    expect(isToolDefinition(noop)).toBe(true);
    expect(isToolDefinition({ ...noop })).toBe(true);
    expect(isToolDefinition({ name: 'noop', run: () => 'x' })).toBe(false);
    expect(isToolDefinition(null)).toBe(false);
  });
});

describe('published JSON Schema', () => {
  it('is the input JSON Schema naming its 2020-12 dialect, defaults kept and defaulted fields optional', () => {
    const schema = toolJsonSchema(buildReport.inputSchema);
    expect(schema['$schema']).toBe('https://json-schema.org/draft/2020-12/schema');
    expect(schema).toMatchObject({
      type: 'object',
      properties: {
        report: { type: 'string' },
        items: { type: 'integer', minimum: 1, maximum: 1_000_000 },
        delayMs: { type: 'integer', minimum: 0, maximum: 60_000, default: 10 },
      },
      required: ['report', 'items'],
    });
    expect(buildReport.descriptor.inputSchema).toEqual(schema);
  });

  it('must describe an object', () => {
    expect(() => toolJsonSchema(z.string())).toThrow(/must describe an object/);
  });
});

describe('demo tools', () => {
  it('are build_report and fail_after (optional task support), wait_for_approval and batch_report (tasks only)', () => {
    expect(demoTools.map((t) => [t.name, t.taskSupport])).toEqual([
      ['build_report', 'optional'],
      ['wait_for_approval', 'required'],
      ['fail_after', 'optional'],
      ['batch_report', 'required'],
    ]);
    expect(failAfter.descriptor.inputSchema).toMatchObject({ required: ['delayMs', 'message'] });
  });
});

describe('defineTool options', () => {
  it('refuses an option it does not know, naming it, instead of ignoring it (a typo would drop a limit)', () => {
    const typo = {
      name: 'limited',
      description: 'Has a typo in an option.',
      inputSchema: z.object({}),
      concurency: 3,
      run: () => 'ok',
    };
    expect(() => defineTool(typo as never)).toThrow(/^defineTool\(limited\): unknown option 'concurency' \(known: /);
    expect(() => defineTool({ ...typo, concurency: undefined, retries: 2, concurency2: 1 } as never)).toThrow(
      /unknown options 'concurency', 'retries', 'concurency2'/,
    );
  });

  it('takes every option it documents', () => {
    expect(
      defineTool({
        name: 'all',
        title: 'All',
        description: 'Every option.',
        inputSchema: z.object({}),
        outputSchema: z.object({}),
        taskSupport: 'optional',
        inputFirst: false,
        timeoutMs: 1000,
        attempts: 2,
        backoff: { type: 'fixed', delayMs: 10 },
        maxStalls: 1,
        concurrency: { limit: 3 },
        rateLimit: { max: 10, perMs: 1000 },
        inputTimeoutMs: 1000,
        onCancelled: () => undefined,
        run: () => ({}),
      }).name,
    ).toBe('all');
  });

  it('publishes dedupe (PROTOCOL.md §25.2) as argument names, and refuses a function or an unknown argument', () => {
    const base = {
      name: 'deduped',
      description: 'Deduped.',
      inputSchema: z.object({ report: z.string(), ms: z.number() }),
      run: () => 'ok',
    };
    expect(defineTool({ ...base, dedupe: true }).descriptor.dedupe).toEqual({ ttlMs: 3_600_000 });
    expect(defineTool({ ...base, dedupe: { key: ['report'], ttlMs: 60_000 } }).descriptor.dedupe).toEqual({
      key: ['report'],
      ttlMs: 60_000,
    });
    expect(() => defineTool({ ...base, dedupe: { key: () => 'k' } } as never)).toThrow(
      /^defineTool\(deduped\): dedupe\.key must list argument names, not be a function/,
    );
    expect(() => defineTool({ ...base, dedupe: { key: ['reprot'] } })).toThrow(
      /^defineTool\(deduped\): dedupe\.key names reprot, which inputSchema does not/,
    );
  });

  it('publishes fleet-wide limits (PROTOCOL.md §3.3), and refuses a form it does not support', () => {
    const base = { name: 'limited', description: 'Limited.', inputSchema: z.object({}), run: () => 'ok' };
    expect(defineTool({ ...base, concurrency: 3 }).descriptor.concurrency).toBe(3);
    expect(defineTool({ ...base, concurrency: { limit: 4 } }).descriptor.concurrency).toBe(4);
    expect(defineTool({ ...base, rateLimit: { max: 10, perMs: 1000 } }).descriptor.rateLimit).toEqual({
      max: 10,
      perMs: 1000,
    });
    expect(defineTool(base).descriptor).not.toHaveProperty('concurrency');
    expect(() => defineTool({ ...base, concurrency: 0 })).toThrow(/^defineTool\(limited\): concurrency/);
    // A form it does not know is refused at start, never silently dropped.
    expect(() => defineTool({ ...base, rateLimit: { max: 10, perMs: 1000, per: 'tenant' } } as never)).toThrow(
      /^defineTool\(limited\): rateLimit/,
    );
  });

  it('takes limits per key and shared by name as the worker’s own (PROTOCOL.md §3.5)', () => {
    const base = {
      name: 'keyed',
      description: 'Keyed.',
      inputSchema: z.object({ tenant: z.string(), region: z.string().optional() }),
      run: () => 'ok',
    };
    const byNames = defineTool({ ...base, concurrency: { limit: 2, key: ['tenant', 'region'] } });
    // BullMQ's queue-wide concurrency is not set for it; the catalog still publishes the limit and its key.
    expect(byNames.concurrency).toBeUndefined();
    expect(byNames.descriptor).toMatchObject({ concurrency: 2, concurrencyKey: ['tenant', 'region'] });
    expect(byNames.admitted.slot?.keyOf({ tenant: 'acme' })).toBe('["acme",null]');
    const byFunction = defineTool({ ...base, concurrency: { limit: 1, key: (args) => `t-${String(args['tenant'])}` } });
    expect(byFunction.admitted.slot?.keyOf({ tenant: 'acme' })).toBe('t-acme');
    expect(byFunction.descriptor.concurrencyKey).toEqual(['(function)']);
    const shared = defineTool({ ...base, rateLimit: { max: 5, perMs: 1000, name: 'billing' } });
    expect(shared.rateLimit).toBeUndefined();
    expect(shared.admitted.rate).toMatchObject({ max: 5, perMs: 1000, scope: 'name:billing' });
    expect(shared.descriptor.rateLimit).toEqual({ max: 5, perMs: 1000, name: 'billing' });
    expect(defineTool({ ...base, rateLimit: { max: 5, perMs: 1000, key: ['tenant'] } }).admitted.rate?.scope).toBe(
      'tool:keyed',
    );
    // An unkeyed concurrency stays BullMQ's. A plain rate limit is both: BullMQ's limiter paces the takes, and the
    // worker counts the starts exactly, one budget for everyone (§3.3).
    const plain = defineTool({ ...base, concurrency: 3, rateLimit: { max: 1, perMs: 10 } });
    expect(plain.admitted.slot).toBeUndefined();
    expect(plain.concurrency).toBe(3);
    expect(plain.rateLimit).toEqual({ max: 1, perMs: 10 });
    expect(plain.admitted.rate).toMatchObject({ max: 1, perMs: 10, scope: 'tool:keyed', acrossPrincipals: true });
    expect(plain.admitted.rate?.paced).toBe(true);
    expect(shared.admitted.rate?.paced).toBe(false);
    expect(() => defineTool({ ...base, concurrency: { limit: 1, key: ['tenantId'] } })).toThrow(
      /^defineTool\(keyed\): concurrency\.key names tenantId, which inputSchema does not/,
    );
    expect(() => defineTool({ ...base, rateLimit: { max: 1, perMs: 10, name: 'has space' } })).toThrow(
      /^defineTool\(keyed\): rateLimit/,
    );
  });
});

describe('defineTool version (PROTOCOL.md §12.11)', () => {
  const base = { name: 'v', description: 'd', inputSchema: z.object({ a: z.string() }) };
  it('publishes an explicit version, or one derived from the name, schemas and run', () => {
    expect(defineTool({ ...base, version: '2.1', run: () => 'x' }).descriptor.version).toBe('2.1');
    const a = defineTool({ ...base, run: () => 'x' });
    const same = defineTool({ ...base, run: () => 'x' });
    const otherRun = defineTool({ ...base, run: () => 'y' });
    const otherSchema = defineTool({ ...base, inputSchema: z.object({ b: z.string() }), run: () => 'x' });
    expect(a.version).toMatch(/^[0-9a-f]{12}$/);
    expect(same.version).toBe(a.version);
    expect(otherRun.version).not.toBe(a.version);
    expect(otherSchema.version).not.toBe(a.version);
    expect(a.onVersionChange).toBe('resume');
    expect(a.descriptor.onVersionChange).toBeUndefined();
    expect(defineTool({ ...base, onVersionChange: 'fail', run: () => 'x' }).descriptor.onVersionChange).toBe('fail');
  });

  it('refuses a malformed version or policy at definition', () => {
    expect(() => defineTool({ ...base, version: 'has space', run: () => 'x' })).toThrow(/version/);
    expect(() => defineTool({ ...base, onVersionChange: 'retry' as never, run: () => 'x' })).toThrow(/onVersionChange/);
  });
});
