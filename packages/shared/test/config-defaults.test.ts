/**
 * Issue 47: the config options' `@default` JSDoc tags (packages/shared/src/config/*.ts) say what an empty environment
 * resolves to, so an editor shows the real default; this reads each tag and checks it against `loadGatewayConfig({})`
 * and `loadWorkerConfig({})`, so a changed default with a stale tag goes red.
 */
import { readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';
import { loadGatewayConfig, loadWorkerConfig } from '../src/config.js';

const gateway = loadGatewayConfig({}) as unknown as Record<string, unknown>;
const worker = loadWorkerConfig({}) as unknown as Record<string, unknown>;
/** What each interface's fields resolve to from an empty environment. */
const RESOLVED: Record<string, Record<string, unknown>> = {
  CommonConfig: gateway,
  GatewayConfig: gateway,
  WebhookConfig: gateway['webhooks'] as Record<string, unknown>,
  WorkerConfig: worker,
};

/** `[interface, field, tag]` for every `@default` tag on an interface field. */
function tags(file: string): Array<[string, string, string]> {
  const lines = readFileSync(fileURLToPath(new URL(`../src/config/${file}.ts`, import.meta.url)), 'utf8').split('\n');
  const found: Array<[string, string, string]> = [];
  let current: string | undefined;
  let pending: string | undefined;
  for (const line of lines) {
    current = /^export interface (\w+)/.exec(line)?.[1] ?? (line === '}' ? undefined : current);
    const tag = /@default (.+?)( \*\/)?$/.exec(line);
    if (tag) pending = tag[1];
    const field = /^ {2}(\w+)\??: /.exec(line);
    if (field && current) {
      if (pending !== undefined) found.push([current, field[1]!, pending]);
      pending = undefined;
    }
  }
  return found;
}

describe('config @default tags', () => {
  const all = ['common', 'gateway', 'worker'].flatMap(tags);

  it('are there, on the options', () => {
    expect(all.length).toBeGreaterThan(40);
  });

  it.each(all)('%s.%s is %s, as an empty environment resolves it', (iface, field, tag) => {
    expect(RESOLVED[iface]?.[field]).toEqual(JSON.parse(tag));
  });
});
