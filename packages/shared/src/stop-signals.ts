/** The signals that stop a taskrelay process: SIGTERM (an orchestrator) and SIGINT (Ctrl-C). */
const STOP_SIGNALS = ['SIGTERM', 'SIGINT'] as const;
export type StopSignal = (typeof STOP_SIGNALS)[number];

export interface StopSignals {
  /**
   * `drain` runs on the first stop signal, at once when one came before this call; every later signal goes to
   * `repeat`. Call it once, when the process has something to drain.
   */
  onStop(drain: (signal: StopSignal) => void, repeat?: (signal: StopSignal) => void): void;
}

/**
 * Listens for the stop signals from the moment it is called: call it on a process's first line. Until a process listens
 * for SIGTERM, the kernel's default ends it at once. A worker that logged `worker ready` before it listened was ended,
 * with no drain and exit code null, by a SIGTERM sent on seeing that line: 4 of 80 starts on a loaded 2-core machine.
 * A signal that comes while the process starts is kept, and drains the process as soon as it has started; a second one
 * then ends it at once.
 * Hand-written: a dozen lines of `process.on`, where a library (`close-with-grace`) would install its listeners at its
 * own time and decide the exit for us.
 */
export function listenForStopSignals(): StopSignals {
  let received: StopSignal | undefined;
  let drain: ((signal: StopSignal) => void) | undefined;
  let repeat: ((signal: StopSignal) => void) | undefined;
  for (const signal of STOP_SIGNALS) {
    process.on(signal, () => {
      if (received !== undefined) {
        // A second signal while the process still starts: nothing is running yet, so it ends the process.
        if (drain === undefined) process.exit(1);
        repeat?.(signal);
        return;
      }
      received = signal;
      drain?.(signal);
    });
  }
  return {
    onStop(onDrain, onRepeat) {
      drain = onDrain;
      repeat = onRepeat;
      if (received !== undefined) onDrain(received);
    },
  };
}
