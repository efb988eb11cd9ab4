// Preloaded into every process the benchmark spawns (NODE_OPTIONS="--expose-gc --import=<this file>"). On SIGUSR2
// it runs a full GC and writes process.memoryUsage() to $BENCH_PROBE_DIR/<pid>.json (atomically, via rename), so the
// benchmark can read the live heap of a gateway, worker or peer without any code in the product for it.
import { renameSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';

const dir = process.env.BENCH_PROBE_DIR;
if (dir) {
  process.on('SIGUSR2', () => {
    globalThis.gc?.();
    globalThis.gc?.();
    const file = join(dir, `${process.pid}.json`);
    writeFileSync(`${file}.tmp`, JSON.stringify({ ...process.memoryUsage(), at: Date.now() }));
    renameSync(`${file}.tmp`, file);
  });
}
