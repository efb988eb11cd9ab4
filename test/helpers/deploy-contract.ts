/**
 * What deployment files (docker-compose.yml, deploy/k8s) are checked against: the configuration table of
 * docs/CONFIGURATION.md and the processes' own config loaders, so a variable a file sets is one the
 * process reads, for that process, with a value it accepts.
 */
import { readFileSync } from 'node:fs';
import { resolve } from 'node:path';
import { loadGatewayConfig, loadWorkerConfig } from '@taskrelay/shared';
import { ROOT } from './processes.js';

export type ProcessKind = 'gateway' | 'worker';

/** Variable name → the process column of the configuration table (docs/CONFIGURATION.md). */
export function readConfigTable(): Map<string, 'gateway' | 'worker' | 'both'> {
  const section = readFileSync(resolve(ROOT, 'docs/CONFIGURATION.md'), 'utf8');
  const table = new Map<string, 'gateway' | 'worker' | 'both'>();
  for (const line of section.split('\n')) {
    const cells = line.split('|').map((c) => c.trim());
    const who = cells[2];
    if (!line.startsWith('| `') || (who !== 'gateway' && who !== 'worker' && who !== 'both')) continue;
    for (const [, name] of (cells[1] ?? '').matchAll(/`([A-Z][A-Z0-9_]*)`/g)) if (name) table.set(name, who);
  }
  return table;
}

/** The entry point a container command runs, or undefined when it runs neither. */
export function processOf(command: readonly string[]): ProcessKind | undefined {
  const script = command.find((part) => part.endsWith('main.js')) ?? '';
  if (/gateway\/dist\/main\.js$/.test(script)) return 'gateway';
  if (/worker\/dist\/main\.js$/.test(script)) return 'worker';
  // The Python worker reads the Node worker's environment (docs/PYTHON.md).
  if (command.includes('taskrelay_worker')) return 'worker';
  return undefined;
}

/**
 * Problems with one process's environment: variables docs/CONFIGURATION.md does not list for that process, and what its config
 * loader refuses (`${VAR:-default}` is taken at its default, as compose does with the variable unset).
 */
export function envProblems(kind: ProcessKind, env: Record<string, string>): string[] {
  const table = readConfigTable();
  const problems: string[] = [];
  const resolved: Record<string, string> = {};
  for (const [name, raw] of Object.entries(env)) {
    const who = table.get(name);
    if (who === undefined) problems.push(`${name} is not in the configuration table of docs/CONFIGURATION.md`);
    else if (who !== 'both' && who !== kind) problems.push(`${name} is a ${who} variable, set on a ${kind}`);
    resolved[name] = raw.replace(/\$\{[A-Z0-9_]+:-([^}]*)\}/g, '$1');
  }
  try {
    if (kind === 'gateway') loadGatewayConfig(resolved);
    else loadWorkerConfig(resolved);
  } catch (error) {
    problems.push(error instanceof Error ? error.message : String(error));
  }
  return problems;
}
