import { defineConfig } from 'vitest/config';

export default defineConfig({
  test: {
    include: ['packages/*/test/**/*.test.ts', 'test/**/*.test.ts'],
    testTimeout: 60_000,
    hookTimeout: 60_000,
    // Cross-process suites spawn gateways, workers and redis-servers: keep the 2-core machine from thrashing.
    maxWorkers: 2,
    fileParallelism: true,
    reporters: ['default'],
  },
});
