/**
 * The net under a suite that forgets a process (vitest.config.ts `setupFiles`). Registered before the file's own
 * hooks, so with vitest's default `sequence.hooks: 'stack'` this `afterAll` runs after the file's: whatever process
 * the file started through test/helpers/processes.ts and did not stop is SIGKILLed there, named on stderr so the suite
 * gets fixed. Found by running suites 10 times in a row: each run of completion-race and artifact-bytes left its Python
 * worker behind (their afterAll stopped the stack but not the worker started beside it), reconnecting for ever to a
 * Redis that was gone.
 */
import { afterAll } from 'vitest';
import { runningProcesses, stopAll } from './processes.js';

afterAll(async () => {
  const left = runningProcesses();
  if (left.length === 0) return;
  process.stderr.write(`test left ${left.length} process(es) running (pids ${left.join(', ')}): stopping them\n`);
  await stopAll();
});
