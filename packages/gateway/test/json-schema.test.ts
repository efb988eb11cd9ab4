/** The gateway's one JSON Schema validator (tasks/json-schema.ts): both dialects, formats, and nobody else builds an Ajv. */
import { readFileSync, readdirSync } from 'node:fs';
import { join, relative } from 'node:path';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';
import { JsonSchemaValidator } from '../src/tasks/json-schema.js';

const SRC = fileURLToPath(new URL('../../', import.meta.url));

function sources(dir: string): string[] {
  return readdirSync(dir, { withFileTypes: true }).flatMap((entry) => {
    const path = join(dir, entry.name);
    if (entry.isDirectory()) return entry.name === 'node_modules' || entry.name === 'dist' ? [] : sources(path);
    return /\.ts$/.test(entry.name) && path.includes(`${join('src', '')}`) ? [path] : [];
  });
}

describe('JsonSchemaValidator', () => {
  it('checks 2020-12 by default, draft-07 when a schema names it, with formats in both', () => {
    const schemas = new JsonSchemaValidator();
    const tuple = schemas.compile({ type: 'array', prefixItems: [{ type: 'string' }], items: false });
    expect(tuple?.(['a'])).toBe(true);
    expect(tuple?.(['a', 'b'])).toBe(false);
    const old = schemas.compile({
      $schema: 'http://json-schema.org/draft-07/schema#',
      type: 'object',
      properties: { at: { type: 'string', format: 'date-time' } },
    });
    expect(old?.({ at: '2026-12-01T10:00:00Z' })).toBe(true);
    expect(old?.({ at: 'tomorrow' })).toBe(false);
  });

  it('answers undefined for a schema Ajv cannot compile, and compiles each schema once', () => {
    const schemas = new JsonSchemaValidator();
    expect(schemas.compile({ type: 'no-such-type' })).toBeUndefined();
    const schema = { type: 'object' };
    expect(schemas.compile(schema)).toBe(schemas.compile({ ...schema }));
  });

  it('is the only module of the packages that sets up Ajv', () => {
    const users = sources(join(SRC))
      .filter((path) => /from 'ajv(\/|')|from 'ajv-formats'/.test(readFileSync(path, 'utf8')))
      .map((path) => relative(SRC, path));
    expect(users).toEqual([join('gateway', 'src', 'tasks', 'json-schema.ts')]);
  });
});
