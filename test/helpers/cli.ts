/** Runs the built `taskrelay` CLI (docs/CLI.md) as a real process, off a TTY. */
import { spawn, type ChildProcess } from 'node:child_process';
import { resolve } from 'node:path';
import { ROOT } from './processes.js';

export const CLI_MAIN = resolve(ROOT, 'packages/cli/dist/main.js');

export interface CliRun {
  readonly child: ChildProcess;
  stdout(): string;
  stderr(): string;
  /** stdout's JSON lines so far (`--json`). */
  lines(): Array<Record<string, unknown>>;
  exited: Promise<number | null>;
}

export function startCli(args: string[], env: Record<string, string | undefined> = {}): CliRun {
  const child = spawn(process.execPath, [CLI_MAIN, ...args], {
    cwd: ROOT,
    env: { ...process.env, TASKRELAY_URL: undefined, TASKRELAY_TOKEN: undefined, ...env },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let out = '';
  let err = '';
  child.stdout?.on('data', (d: Buffer) => (out += d.toString()));
  child.stderr?.on('data', (d: Buffer) => (err += d.toString()));
  const exited = new Promise<number | null>((res) => child.once('close', (code) => res(code)));
  return {
    child,
    stdout: () => out,
    stderr: () => err,
    lines: () =>
      out
        .split('\n')
        .filter((l) => l.startsWith('{'))
        .map((l) => JSON.parse(l) as Record<string, unknown>),
    exited,
  };
}

/** Runs the CLI to its end. */
export async function runCli(
  args: string[],
  env: Record<string, string | undefined> = {},
): Promise<{ code: number | null; stdout: string; stderr: string; lines: Array<Record<string, unknown>> }> {
  const run = startCli(args, env);
  const code = await run.exited;
  return { code, stdout: run.stdout(), stderr: run.stderr(), lines: run.lines() };
}
