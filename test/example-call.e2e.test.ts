/**
 * The README's first call (`node examples/call-build-report.mjs URL`) against a gateway with authentication on
 * (issue 49 item 5): it sends `TASKRELAY_TOKEN` as the CLI does, and a missing or refused token is one line on stderr
 * saying what to do, never a stack trace.
 */
import { execFile } from 'node:child_process';
import { resolve } from 'node:path';
import { promisify } from 'node:util';
import { describe, expect, it } from 'vitest';
import { useStack } from './helpers/stack.js';
import { ROOT } from './helpers/processes.js';

const run = promisify(execFile);
const EXAMPLE = resolve(ROOT, 'examples/call-build-report.mjs');

const stack = useStack({ name: 'example-call', gateways: [{ TASKRELAY_AUTH_TOKENS: 'alice:alice-token' }] });

/** The example's exit code and output, with `TASKRELAY_TOKEN` set to `token` (or unset). */
async function example(token: string | undefined) {
  const env = { ...process.env, TASKRELAY_TOKEN: token };
  if (token === undefined) delete env['TASKRELAY_TOKEN'];
  return run(process.execPath, [EXAMPLE, stack.gateway.url, '3'], { env, timeout: 60_000 }).then(
    ({ stdout, stderr }) => ({ code: 0, stdout, stderr }),
    (error: { code?: number; stdout?: string; stderr?: string }) => ({
      code: error.code ?? -1,
      stdout: error.stdout ?? '',
      stderr: error.stderr ?? '',
    }),
  );
}

describe('examples/call-build-report.mjs with authentication on', () => {
  it('calls build_report as a task with TASKRELAY_TOKEN, printing progress and the result', async () => {
    const { code, stdout, stderr } = await example('alice-token');
    expect(stderr).toBe('');
    expect(code).toBe(0);
    expect(stdout).toMatch(/^task [0-9a-f]+ created$/m);
    expect(stdout).toMatch(/^progress 3\/3 /m);
    expect(stdout).toMatch(/^result .*"items":3/m);
  });

  it('says in one line, with no stack trace, that a token is needed or was refused', async () => {
    const missing = await example(undefined);
    expect(missing.code).toBe(1);
    expect(missing.stderr).toBe(
      `call-build-report: the gateway at ${stack.gateway.url} needs a token (HTTP 401): set TASKRELAY_TOKEN\n`,
    );
    const wrong = await example('nope');
    expect(wrong.code).toBe(1);
    expect(wrong.stderr).toBe(
      `call-build-report: the gateway at ${stack.gateway.url} refused TASKRELAY_TOKEN (HTTP 401)\n`,
    );
  });
});
