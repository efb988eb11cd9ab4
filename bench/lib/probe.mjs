// Preloaded into every process the benchmark spawns (NODE_OPTIONS="--expose-gc --import=<this file>"). On SIGUSR2
// it runs a full GC and writes process.memoryUsage() to $BENCH_PROBE_DIR/<pid>.json (atomically, via rename), so the
// benchmark can read the live heap of a gateway, worker or peer without any code in the product for it.
// On SIGWINCH (bench/profile.ts) it starts a CPU profile through the inspector, and on the next one writes it to
// $BENCH_PROBE_DIR/<pid>.cpuprofile: a profile of the measured window only, without start-up and warm-up.
import { renameSync, writeFileSync } from 'node:fs';
import { Session } from 'node:inspector';
import { join } from 'node:path';

const dir = process.env.BENCH_PROBE_DIR;
if (dir) {
  const write = (name, text) => {
    const file = join(dir, name);
    writeFileSync(`${file}.tmp`, text);
    renameSync(`${file}.tmp`, file);
  };
  process.on('SIGUSR2', () => {
    globalThis.gc?.();
    globalThis.gc?.();
    write(`${process.pid}.json`, JSON.stringify({ ...process.memoryUsage(), at: Date.now() }));
  });
  let session;
  process.on('SIGWINCH', () => {
    if (!session) {
      session = new Session();
      session.connect();
      session.post('Profiler.enable', () =>
        session.post('Profiler.setSamplingInterval', { interval: 100 }, () => session.post('Profiler.start')),
      );
      return;
    }
    const current = session;
    session = undefined;
    current.post('Profiler.stop', (error, result) => {
      if (!error) write(`${process.pid}.cpuprofile`, JSON.stringify(result.profile));
      current.disconnect();
    });
  });
}
