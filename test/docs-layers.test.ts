/**
 * The gateway's layers (PROTOCOL.md §16, now docs/architecture/protocol-layer.md, and ARCHITECTURE.md): the table in both docs is what the lint's list generates, and the lint refuses
 * an import up the layers or across a row.
 */
import { readFileSync } from 'node:fs';
import { resolve } from 'node:path';
import { ESLint } from 'eslint';
import { describe, expect, it } from 'vitest';
import { ARCHITECTURE_DOC, PROTOCOL_DOC, regenerate } from '../scripts/docs-layers.mjs';

const ROOT = resolve(import.meta.dirname, '..');

async function lintImport(from: string, specifier: string): Promise<string[]> {
  const eslint = new ESLint({ cwd: ROOT });
  // An existing file of the folder, linted with one more import: the type-aware rules need a file the project knows.
  const filePath = resolve(ROOT, 'packages/gateway/src', from);
  const text = `${readFileSync(filePath, 'utf8')}\nexport * as probe from '${specifier}';\n`;
  const [result] = await eslint.lintText(text, { filePath });
  return (result?.messages ?? []).filter((m) => m.ruleId === 'import-x/no-restricted-paths').map((m) => m.message);
}

describe('the gateway layers', () => {
  it.each([
    ['architecture/protocol-layer.md (§16)', PROTOCOL_DOC],
    ['ARCHITECTURE.md', ARCHITECTURE_DOC],
  ])('%s shows the table the lint’s list generates (run pnpm docs:layers after changing it)', (_name, path) => {
    const doc = readFileSync(path, 'utf8');
    expect(regenerate(doc, path)).toBe(doc);
  });

  it.each([
    ['tasks/ importing http/', 'tasks/errors.ts', '../http/limits.js', /tasks\/ sits below/],
    ['protocol/ importing http/', 'protocol/request-meta.ts', '../http/limits.js', /protocol\/ sits below/],
    ['metrics/ importing admin/', 'metrics/gateway-metrics.ts', '../admin/queries.js', /metrics\/ sits below/],
    ['admin/ importing a transport', 'admin/queries.ts', '../transports/session/event-store.js', /are peers/],
    [
      'one transport importing the other',
      'transports/session/event-store.ts',
      '../sessionless/param-headers.js',
      /are peers/,
    ],
  ])('the lint refuses %s', async (_what, from, specifier, message) => {
    const messages = await lintImport(from, specifier);
    expect(messages).toHaveLength(1);
    expect(messages[0]).toMatch(message);
  });

  it('the lint lets an import go down', async () => {
    expect(await lintImport('protocol/request-meta.ts', '../wire/result-cap.js')).toEqual([]);
  });
}, 60_000);
