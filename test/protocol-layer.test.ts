/**
 * Issue 47 item 1 (PROTOCOL.md §29.2): `packages/shared/src/protocol/` is the contract the manifest carries, and the lint
 * keeps it standing alone: an import from the rest of the shared package (or another package of ours) is refused.
 */
import { readFileSync } from 'node:fs';
import { resolve } from 'node:path';
import { ESLint } from 'eslint';
import { describe, expect, it } from 'vitest';

const ROOT = resolve(import.meta.dirname, '..');

async function lintImport(specifier: string): Promise<string[]> {
  const eslint = new ESLint({ cwd: ROOT });
  // An existing file of the folder, linted with one more import: the type-aware rules need a file the project knows.
  const filePath = resolve(ROOT, 'packages/shared/src/protocol/keys.ts');
  const text = `${readFileSync(filePath, 'utf8')}\nexport * as probe from '${specifier}';\n`;
  const [result] = await eslint.lintText(text, { filePath });
  return (result?.messages ?? []).filter((m) => m.ruleId === 'no-restricted-imports').map((m) => m.message);
}

describe('the protocol folder of @taskrelay/shared', () => {
  it.each([
    ['a runtime module of shared', '../redis.js'],
    ['the gateway', '@taskrelay/gateway'],
  ])('the lint refuses an import of %s', async (_what, specifier) => {
    const messages = await lintImport(specifier);
    expect(messages).toHaveLength(1);
    expect(messages[0]).toMatch(/imports only from itself|depends on neither/);
  });

  it('the lint lets it import from itself and from libraries', async () => {
    expect(await lintImport('./errors.js')).toEqual([]);
    expect(await lintImport('zod')).toEqual([]);
  });
}, 60_000);
