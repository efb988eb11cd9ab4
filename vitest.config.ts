import { defineConfig, type TestProjectInlineConfiguration } from 'vitest/config';
import { scaled } from './test/helpers/load.js';
import { redisSource } from './test/helpers/redis-availability.js';

/**
 * Six projects (docs/TESTING.md). `unit` needs nothing but Node and runs in seconds (`pnpm test:unit`); the others
 * need a Redis. `integration`, `e2e`, `browser` and `terminal` share one per run (redis-global-setup.ts), each file
 * under its own key prefix; `fault` suites kill and restart theirs, so each starts its own.
 */
const SHARED_REDIS = ['test/helpers/redis-global-setup.ts'];

const unit: TestProjectInlineConfiguration = {
  extends: true,
  test: {
    name: 'unit',
    include: [
      'packages/*/test/**/*.test.ts',
      'test/deploy-compose.test.ts',
      'test/docs-config.test.ts',
      'test/docs-layers.test.ts',
      'test/docs-links.test.ts',
    ],
    exclude: ['**/*.integration.test.ts'],
    // startRedis() refuses in this project: a file that needs Redis is an integration test.
    env: { TASKRELAY_TEST_PROJECT: 'unit' },
    // Pure modules: one module graph per worker instead of one per file (most of a file's time was its imports).
    isolate: false,
    testTimeout: 10_000,
    hookTimeout: 10_000,
  },
};

const needRedis: TestProjectInlineConfiguration[] = [
  {
    extends: true,
    test: { name: 'integration', include: ['packages/*/test/**/*.integration.test.ts'], globalSetup: SHARED_REDIS },
  },
  {
    extends: true,
    test: {
      name: 'e2e',
      include: ['test/*.test.ts'],
      exclude: [
        'test/deploy-compose.test.ts',
        'test/docs-config.test.ts',
        'test/docs-layers.test.ts',
        'test/docs-links.test.ts',
        'test/dashboard.e2e.test.ts',
        'test/dashboard-login.e2e.test.ts',
        'test/cli-tty.e2e.test.ts',
      ],
      globalSetup: SHARED_REDIS,
    },
  },
  { extends: true, test: { name: 'fault', include: ['test/faults/*.fault.test.ts'] } },
  // Chromium drives the dashboard (playwright-core over the system chromium).
  {
    extends: true,
    test: {
      name: 'browser',
      include: ['test/dashboard.e2e.test.ts', 'test/dashboard-login.e2e.test.ts'],
      globalSetup: SHARED_REDIS,
    },
  },
  // The CLI on a real terminal: a tmux pane on a private tmux server.
  { extends: true, test: { name: 'terminal', include: ['test/cli-tty.e2e.test.ts'], globalSetup: SHARED_REDIS } },
];

const canGetRedis = redisSource() !== undefined;
// Vitest evaluates this file once more for the inline projects (`extends: true`): say it once per run.
if (!canGetRedis && process.env['TASKRELAY_TEST_NO_REDIS_SAID'] === undefined) {
  process.env['TASKRELAY_TEST_NO_REDIS_SAID'] = '1';
  process.stderr.write(
    'No Redis for the tests (no REDIS_URL, no redis-server on PATH, no container runtime): running only the unit ' +
      'project and skipping integration, e2e, fault, browser and terminal. Install redis-server to run them.\n',
  );
}

export default defineConfig({
  test: {
    projects: canGetRedis ? [unit, ...needRedis] : [unit],
    // Bounds, not speed targets: stretched by the load when the run starts (test/helpers/load.ts), so a suite run
    // beside another full run (load average 10+ on 2 cores) is not failed by its own clock.
    testTimeout: scaled(60_000),
    hookTimeout: scaled(60_000),
    // Cross-process suites spawn gateways, workers and redis-servers: keep the 2-core machine from thrashing.
    maxWorkers: 2,
    // After every file's own hooks: SIGKILL whatever process it started and did not stop (test/helpers/leftovers.ts).
    setupFiles: ['test/helpers/leftovers.ts'],
    fileParallelism: true,
    reporters: ['default'],
  },
});
