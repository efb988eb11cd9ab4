// The `test_*` tools the official MCP conformance suite (@modelcontextprotocol/conformance 0.1.16, server mode)
// calls, as taskrelay tools: serve them with the stock worker (TASKRELAY_TOOLS=test/conformance/tools.mjs) and run
// scripts/conformance.sh. Each follows the scenario's own description (`conformance list` / the package's source).
import { defineTool, NonRetryableError } from '@taskrelay/worker';
import { z } from 'zod';

// The tasks extension's fixtures (slow_compute, greet, ...): one worker serves every suite version's tools.
export * from './tasks-fixtures.mjs';

// A 1x1 red PNG and a tiny silent WAV, base64.
const PNG = 'iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8DwHwAFBQIAX8jx0gAAAABJRU5ErkJggg==';
const WAV = 'UklGRiQAAABXQVZFZm10IBAAAAABAAEAQB8AAIA+AAACABAAZGF0YQAAAAA=';

const text = (t) => ({ content: [{ type: 'text', text: t }] });

// A module's exports are listed in name order, and http-header-validation calls the first tool listed with no
// arguments: this quick one sorts first (before confirm_delete, which asks a question).
export const add_numbers = defineTool({
  name: 'add_numbers',
  description: 'Adds two numbers (0 when omitted).',
  inputSchema: z.object({ a: z.number().default(0), b: z.number().default(0) }),
  async run({ a, b }) {
    return text(`The sum of ${a} and ${b} is ${a + b}`);
  },
});

export const test_simple_text = defineTool({
  name: 'test_simple_text',
  description: 'Returns simple text.',
  inputSchema: z.object({}),
  async run() {
    return text('This is a simple text response for testing.');
  },
});

export const test_image_content = defineTool({
  name: 'test_image_content',
  description: 'Returns an image.',
  inputSchema: z.object({}),
  async run() {
    return { content: [{ type: 'image', data: PNG, mimeType: 'image/png' }] };
  },
});

export const test_audio_content = defineTool({
  name: 'test_audio_content',
  description: 'Returns audio.',
  inputSchema: z.object({}),
  async run() {
    return { content: [{ type: 'audio', data: WAV, mimeType: 'audio/wav' }] };
  },
});

export const test_embedded_resource = defineTool({
  name: 'test_embedded_resource',
  description: 'Returns an embedded resource.',
  inputSchema: z.object({}),
  async run() {
    return {
      content: [
        {
          type: 'resource',
          resource: {
            uri: 'test://embedded-resource',
            mimeType: 'text/plain',
            text: 'This is an embedded resource content.',
          },
        },
      ],
    };
  },
});

export const test_multiple_content_types = defineTool({
  name: 'test_multiple_content_types',
  description: 'Returns text, an image and a resource.',
  inputSchema: z.object({}),
  async run() {
    return {
      content: [
        { type: 'text', text: 'Multiple content types test:' },
        { type: 'image', data: PNG, mimeType: 'image/png' },
        {
          type: 'resource',
          resource: {
            uri: 'test://mixed-content-resource',
            mimeType: 'application/json',
            text: JSON.stringify({ test: 'data', value: 123 }),
          },
        },
      ],
    };
  },
});

export const test_error_handling = defineTool({
  name: 'test_error_handling',
  description: 'Always fails.',
  inputSchema: z.object({}),
  async run() {
    throw new NonRetryableError('This tool intentionally returns an error for testing');
  },
});

export const test_tool_with_progress = defineTool({
  name: 'test_tool_with_progress',
  description: 'Reports progress 0, 50 and 100 of 100, about 150 ms apart.',
  inputSchema: z.object({}),
  async run(_input, ctx) {
    // The scenario says ~50 ms and counts 3 notifications; progress is throttled to one per 50 ms per task
    // (TASKRELAY_PROGRESS_INTERVAL_MS, PROTOCOL.md §8), so on a loaded machine 50 ms gaps merged two of them (2 of 3
    // seen in one run). Gaps well above the throttle keep each one a notification of its own.
    ctx.progress(0, 100);
    await ctx.sleep(150);
    ctx.progress(50, 100);
    await ctx.sleep(150);
    ctx.progress(100, 100);
    return text('Progress test completed');
  },
});

export const test_tool_with_logging = defineTool({
  name: 'test_tool_with_logging',
  description: 'Sends three info log messages about 50 ms apart.',
  inputSchema: z.object({}),
  async run(_input, ctx) {
    ctx.notify('info', 'Tool execution started');
    await ctx.sleep(50);
    ctx.notify('info', 'Tool processing data');
    await ctx.sleep(50);
    ctx.notify('info', 'Tool execution completed');
    return text('Logging test completed');
  },
});

export const test_sampling = defineTool({
  name: 'test_sampling',
  description: 'Asks the client model to complete the prompt (sampling).',
  inputSchema: z.object({ prompt: z.string().describe('The prompt to send to the LLM') }),
  async run({ prompt }, ctx) {
    const answer = await ctx.sample({
      messages: [{ role: 'user', content: { type: 'text', text: prompt } }],
      maxTokens: 100,
    });
    const reply = answer.content?.type === 'text' ? answer.content.text : JSON.stringify(answer.content);
    return text(`LLM response: ${reply}`);
  },
});

export const test_elicitation = defineTool({
  name: 'test_elicitation',
  description: 'Asks the user for a username and email (elicitation).',
  inputSchema: z.object({ message: z.string().describe('The message to show the user') }),
  async run({ message }, ctx) {
    const answer = await ctx.elicit({
      message,
      requestedSchema: {
        type: 'object',
        properties: {
          username: { type: 'string', description: "User's response" },
          email: { type: 'string', description: "User's email address" },
        },
        required: ['username', 'email'],
      },
    });
    return text(`User response: action=${answer.action}, content=${JSON.stringify(answer.content ?? {})}`);
  },
});

const completed = (answer) =>
  text(`Elicitation completed: action=${answer.action}, content=${JSON.stringify(answer.content ?? {})}`);

export const test_elicitation_sep1034_defaults = defineTool({
  name: 'test_elicitation_sep1034_defaults',
  description: 'Elicitation whose schema has a default for every primitive type (SEP-1034).',
  inputSchema: z.object({}),
  async run(_input, ctx) {
    return completed(
      await ctx.elicit({
        message: 'Please review and update the form fields with defaults',
        requestedSchema: {
          type: 'object',
          properties: {
            name: { type: 'string', description: 'User name', default: 'John Doe' },
            age: { type: 'integer', description: 'User age', default: 30 },
            score: { type: 'number', description: 'User score', default: 95.5 },
            status: {
              type: 'string',
              description: 'User status',
              enum: ['active', 'inactive', 'pending'],
              default: 'active',
            },
            verified: { type: 'boolean', description: 'Verification status', default: true },
          },
        },
      }),
    );
  },
});

export const test_elicitation_sep1330_enums = defineTool({
  name: 'test_elicitation_sep1330_enums',
  description: 'Elicitation with every enum variant (SEP-1330).',
  inputSchema: z.object({}),
  async run(_input, ctx) {
    return completed(
      await ctx.elicit({
        message: 'Please select options from the enum fields',
        requestedSchema: {
          type: 'object',
          properties: {
            untitledSingle: {
              type: 'string',
              description: 'Select one option',
              enum: ['option1', 'option2', 'option3'],
            },
            titledSingle: {
              type: 'string',
              description: 'Select one option with titles',
              oneOf: [
                { const: 'value1', title: 'First Option' },
                { const: 'value2', title: 'Second Option' },
                { const: 'value3', title: 'Third Option' },
              ],
            },
            legacyEnum: {
              type: 'string',
              description: 'Select one option (legacy)',
              enum: ['opt1', 'opt2', 'opt3'],
              enumNames: ['Option One', 'Option Two', 'Option Three'],
            },
            untitledMulti: {
              type: 'array',
              description: 'Select multiple options',
              minItems: 1,
              items: { type: 'string', enum: ['option1', 'option2', 'option3'] },
            },
            titledMulti: {
              type: 'array',
              description: 'Select multiple options with titles',
              minItems: 1,
              items: {
                anyOf: [
                  { const: 'value1', title: 'First Choice' },
                  { const: 'value2', title: 'Second Choice' },
                  { const: 'value3', title: 'Third Choice' },
                ],
              },
            },
          },
        },
      }),
    );
  },
});

/** json-schema-2020-12: `$schema`, `$defs` (a `$ref`'d address) and `additionalProperties: false` kept in tools/list. */
const Address = z.object({ street: z.string().optional(), city: z.string().optional() }).meta({ id: 'address' });
export const json_schema_2020_12_tool = defineTool({
  name: 'json_schema_2020_12_tool',
  description: 'Tool with JSON Schema 2020-12 features',
  inputSchema: z.strictObject({ name: z.string().optional(), address: Address.optional() }),
  run: ({ name, address }) => `Hello ${name ?? 'anonymous'}${address?.city ? ` of ${address.city}` : ''}`,
});

// The 0.2.0-alpha.12 suite's diagnostic tools (server-stateless, SEP-2575).

/** Needs sampling: a client that did not declare it gets -32021 naming `sampling`, before anything is asked. */
export const test_missing_capability = defineTool({
  name: 'test_missing_capability',
  description: 'Asks the client model for a completion (sampling); refused for a client without the capability.',
  inputSchema: z.object({}),
  async run(_input, ctx) {
    const answer = await ctx.sample({
      messages: [{ role: 'user', content: { type: 'text', text: 'Say hello' } }],
      maxTokens: 10,
    });
    return text(`Sampled: ${answer.content?.type === 'text' ? answer.content.text : ''}`);
  },
});

/** Logs at info; a 2026-07-28 request that set no log level gets no notifications/message. */
export const test_logging_tool = defineTool({
  name: 'test_logging_tool',
  description: 'Sends an info log message, then returns.',
  inputSchema: z.object({}),
  async run(_input, ctx) {
    ctx.notify('info', 'test_logging_tool ran');
    return text('Logged');
  },
});

/** Asks the user a question mid-call: on 2026-07-28 the answer is an InputRequiredResult, never a request on the stream. */
export const test_streaming_elicitation = defineTool({
  name: 'test_streaming_elicitation',
  description: 'Asks the user for a name (elicitation), then greets them.',
  inputSchema: z.object({}),
  async run(_input, ctx) {
    const answer = await ctx.elicit({
      message: 'What is your name?',
      requestedSchema: { type: 'object', properties: { name: { type: 'string' } }, required: ['name'] },
    });
    return text(`Hello, ${answer.content?.name ?? 'nobody'}`);
  },
});

// The 0.2.0-alpha.12 suite's input-required-result-* scenarios (SEP-2322, MRTR; PROTOCOL.md §17): each asks with
// ctx.elicit / ctx.sample / ctx.listRoots under the key the scenario names, and a 2026-07-28 plain call answers the
// question as an InputRequiredResult. The same tools ask on the request stream on a 2025-11-25 session.

const nameSchema = (message) => ({
  message,
  requestedSchema: { type: 'object', properties: { name: { type: 'string' } }, required: ['name'] },
});
const sampled = (answer) =>
  answer.content?.type === 'text' ? answer.content.text : JSON.stringify(answer.content ?? null);

export const test_input_required_result_elicitation = defineTool({
  name: 'test_input_required_result_elicitation',
  description: 'Asks for the user name (elicitation, key user_name), then greets.',
  inputSchema: z.object({}),
  async run(_input, ctx) {
    const answer = await ctx.elicit(nameSchema('What is your name?'), { key: 'user_name' });
    return text(`Hello, ${answer.content?.name ?? 'nobody'}!`);
  },
});

export const test_input_required_result_sampling = defineTool({
  name: 'test_input_required_result_sampling',
  description: 'Asks the client model a question (sampling, key capital_question), then returns its answer.',
  inputSchema: z.object({}),
  async run(_input, ctx) {
    const answer = await ctx.sample(
      {
        messages: [{ role: 'user', content: { type: 'text', text: 'What is the capital of France?' } }],
        maxTokens: 100,
      },
      { key: 'capital_question' },
    );
    return text(`Sampling response: ${sampled(answer)}`);
  },
});

export const test_input_required_result_list_roots = defineTool({
  name: 'test_input_required_result_list_roots',
  description: "Asks for the client's roots (roots/list, key client_roots), then lists them.",
  inputSchema: z.object({}),
  async run(_input, ctx) {
    const answer = await ctx.listRoots({ key: 'client_roots' });
    return text(`Roots: ${answer.roots.map((root) => root.uri).join(', ')}`);
  },
});

const confirmSchema = {
  message: 'Please confirm',
  requestedSchema: { type: 'object', properties: { ok: { type: 'boolean' } }, required: ['ok'] },
};

export const test_input_required_result_request_state = defineTool({
  name: 'test_input_required_result_request_state',
  description: 'Asks for a confirmation (key confirm); the retry must echo the signed requestState.',
  inputSchema: z.object({}),
  async run(_input, ctx) {
    const answer = await ctx.elicit(confirmSchema, { key: 'confirm' });
    // Reached only through a retry whose requestState the gateway verified (PROTOCOL.md §17.2).
    return text(`state-ok: confirmed=${answer.content?.ok === true}`);
  },
});

export const test_input_required_result_tampered_state = defineTool({
  name: 'test_input_required_result_tampered_state',
  description: 'Asks for a confirmation (key confirm); a retry with an altered requestState is refused.',
  inputSchema: z.object({}),
  async run(_input, ctx) {
    const answer = await ctx.elicit(confirmSchema, { key: 'confirm' });
    return text(`confirmed=${answer.content?.ok === true}`);
  },
});

export const test_input_required_result_multiple_inputs = defineTool({
  name: 'test_input_required_result_multiple_inputs',
  description: 'Asks three things at once: a name (elicitation), a greeting (sampling) and the roots.',
  inputSchema: z.object({}),
  async run(_input, ctx) {
    const [name, greeting, roots] = await Promise.all([
      ctx.elicit(nameSchema('What is your name?'), { key: 'user_name' }),
      ctx.sample(
        { messages: [{ role: 'user', content: { type: 'text', text: 'Generate a greeting' } }], maxTokens: 50 },
        { key: 'greeting' },
      ),
      ctx.listRoots({ key: 'client_roots' }),
    ]);
    return text(`${sampled(greeting)} ${name.content?.name ?? 'nobody'} (${roots.roots.length} roots)`);
  },
});

export const test_input_required_result_multi_round = defineTool({
  name: 'test_input_required_result_multi_round',
  description: 'Asks two questions one after the other (keys step1, step2): two input rounds.',
  inputSchema: z.object({}),
  async run(_input, ctx) {
    const first = await ctx.elicit(nameSchema('Step 1: What is your name?'), { key: 'step1' });
    const second = await ctx.elicit(
      {
        message: 'Step 2: What is your favorite color?',
        requestedSchema: { type: 'object', properties: { color: { type: 'string' } }, required: ['color'] },
      },
      { key: 'step2' },
    );
    return text(`${first.content?.name ?? 'nobody'} likes ${second.content?.color ?? 'nothing'}`);
  },
});

/** Asks only what the client declared: elicitation when it can, else sampling (ctx.elicit refuses it up front). */
export const test_input_required_result_capabilities = defineTool({
  name: 'test_input_required_result_capabilities',
  description: 'Asks with elicitation when the client declared it, else with sampling.',
  inputSchema: z.object({}),
  async run(_input, ctx) {
    try {
      const answer = await ctx.elicit(nameSchema('What is your name?'), { key: 'user_name' });
      return text(`Hello, ${answer.content?.name ?? 'nobody'}!`);
    } catch (error) {
      if (error?.code !== 'CAPABILITY_MISSING') throw error;
    }
    const answer = await ctx.sample(
      { messages: [{ role: 'user', content: { type: 'text', text: 'Pick a name' } }], maxTokens: 20 },
      { key: 'name_suggestion' },
    );
    return text(`Hello, ${sampled(answer)}!`);
  },
});

/** tasks-mrtr-composition: asks first as a plain call (MRTR), then becomes a task once answered (PROTOCOL.md §17.4). */
export const test_tool_with_task = defineTool({
  name: 'test_tool_with_task',
  description: 'Asks for the user name, then finishes as a task whose result greets them.',
  inputSchema: z.object({}),
  taskSupport: 'required',
  inputFirst: true,
  async run(_input, ctx) {
    const answer = await ctx.elicit(nameSchema('What is your name?'), { key: 'user_name' });
    await ctx.sleep(200);
    return text(`Hello, ${answer.content?.name ?? 'nobody'}! (finished as a task)`);
  },
});

/** http-custom-header-server-validation (SEP-2243): `tenant` is mirrored into the Mcp-Param-Tenant header. */
export const test_header_param = defineTool({
  name: 'test_header_param',
  description: 'Echoes its tenant argument, which a 2026-07-28 client mirrors into Mcp-Param-Tenant.',
  inputSchema: z.object({ tenant: z.string() }),
  mcpHeaders: { tenant: 'Tenant' },
  run: ({ tenant }) => `tenant=${tenant}`,
});
