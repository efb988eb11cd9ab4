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
  description: 'Reports progress 0, 50 and 100 of 100, about 50 ms apart.',
  inputSchema: z.object({}),
  async run(_input, ctx) {
    ctx.progress(0, 100);
    await ctx.sleep(50);
    ctx.progress(50, 100);
    await ctx.sleep(50);
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
