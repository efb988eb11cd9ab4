/**
 * docs/CONFIGURATION.md's table is generated from the gateway's and the worker's zod schemas (scripts/docs-config.ts):
 * a variable added, removed, moved between processes or given another default in a schema, without `pnpm docs:config`,
 * fails here.
 */
import { readFileSync } from 'node:fs';
import { describe, expect, it } from 'vitest';
import { CONFIG_DOC, configRows, regenerate } from '../scripts/docs-config.js';

describe('the configuration table', () => {
  it('is what the schemas generate (run pnpm docs:config after changing one)', () => {
    const doc = readFileSync(CONFIG_DOC, 'utf8');
    expect(regenerate(doc)).toBe(doc);
  });

  it('has a row for each variable with the schema’s process and default', () => {
    const rows = configRows(readFileSync(CONFIG_DOC, 'utf8'));
    expect(rows.find((r) => r.name === 'WORKER_CONCURRENCY')).toMatchObject({ process: 'worker', default: '`8`' });
    expect(rows.find((r) => r.name === 'PORT')).toMatchObject({ process: 'gateway', default: '`3000`' });
    expect(rows.find((r) => r.name === 'TASKRELAY_PREFIX')).toMatchObject({ process: 'both', default: '`taskrelay`' });
  });

  it('refuses a variable that has neither a description nor a row', () => {
    const doc = readFileSync(CONFIG_DOC, 'utf8');
    const withoutPort = doc
      .split('\n')
      .filter((line) => !line.startsWith('| `PORT` |'))
      .join('\n');
    expect(() => configRows(withoutPort)).toThrow(/PORT has no description/);
  });
});
