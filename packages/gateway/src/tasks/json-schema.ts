/**
 * The gateway's one JSON Schema validator: tool arguments against a tool's `inputSchema` (the catalog) and an
 * elicitation answer against its `requestedSchema` (the answer check) use the same Ajv set-up, formats included.
 * JSON Schema 2020-12 is the dialect MCP names (SEP-1613) and zod 4 emits; a schema that names draft-07 or older
 * gets that dialect. Compiled schemas are kept by their JSON, bounded, since each task may bring its own.
 */
import { Ajv, type ErrorObject, type ValidateFunction } from 'ajv';
import { Ajv2020 } from 'ajv/dist/2020.js';
import addFormatsPlugin from 'ajv-formats';
import type { Logger } from '@taskrelay/shared';

export type { ErrorObject, ValidateFunction };

/** How many compiled schemas are kept; past it the cache starts again. */
const MAX_COMPILED = 500;

export class JsonSchemaValidator {
  private readonly ajv2020: Ajv2020;
  private readonly ajv07: Ajv;
  private readonly compiled = new Map<string, ValidateFunction | undefined>();

  /** Ajv's warnings (unknown keywords, ignored formats) go to `log`, never to the console. */
  constructor(private readonly log?: Logger) {
    const logger = log
      ? {
          log: (...args: unknown[]) => log.debug({ ajv: args.map(String).join(' ') }, 'ajv'),
          warn: (...args: unknown[]) => log.debug({ ajv: args.map(String).join(' ') }, 'ajv warning'),
          error: (...args: unknown[]) => log.warn({ ajv: args.map(String).join(' ') }, 'ajv error'),
        }
      : (false as const);
    this.ajv2020 = addFormats(new Ajv2020({ allErrors: false, strict: false, logger }));
    this.ajv07 = addFormats(new Ajv({ allErrors: false, strict: false, logger }));
  }

  /**
   * The validator of `schema`, or undefined when Ajv cannot compile it (the caller decides what an unusable schema
   * means; the compile error is logged once per schema).
   */
  compile(schema: Record<string, unknown>): ValidateFunction | undefined {
    const key = JSON.stringify(schema);
    if (this.compiled.has(key)) return this.compiled.get(key);
    const dialect = schema['$schema'];
    const older = typeof dialect === 'string' && /draft-0[467]/.test(dialect);
    let validate: ValidateFunction | undefined;
    try {
      validate = older ? this.ajv07.compile(schema) : this.ajv2020.compile(schema);
    } catch (error) {
      this.log?.warn({ err: error }, 'JSON Schema does not compile; it is not checked here');
      validate = undefined;
    }
    if (this.compiled.size >= MAX_COMPILED) this.compiled.clear();
    this.compiled.set(key, validate);
    return validate;
  }
}

/** ajv-formats is CommonJS: its default export arrives wrapped under ESM. */
function addFormats<T extends Ajv | Ajv2020>(ajv: T): T {
  const plugin = addFormatsPlugin as unknown as { default?: (a: T) => T } & ((a: T) => T);
  return (plugin.default ?? plugin)(ajv);
}
