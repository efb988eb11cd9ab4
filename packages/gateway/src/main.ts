#!/usr/bin/env node
/**
 * `node packages/gateway/dist/main.js`: one gateway process, configured from the environment (docs/CONFIGURATION.md).
 */
import {
  createLogger,
  endLogs,
  listenForStopSignals,
  loadGatewayConfig,
  oneLine,
  startTracing,
  type StopSignal,
} from '@taskrelay/shared';
import { startGateway } from './app/gateway.js';
import { startHeapGuard } from './app/heap-guard.js';

async function main(): Promise<void> {
  // First: a SIGTERM sent on seeing `gateway listening` must drain, never find the kernel's default still in place.
  const signals = listenForStopSignals();
  const config = loadGatewayConfig();
  const logger = createLogger('gateway', { level: config.logLevel });
  const tracing = await startTracing('taskrelay-gateway');
  const gateway = await startGateway({ ...config, logger });
  // Only the gateway process bounds its heap's garbage (§22.2): in-process gateways (tests) share their host's heap.
  startHeapGuard({
    budgetBytes: config.memoryBudgetBytes,
    onCollect: (before, after) => logger.debug({ before, after }, 'heap past the memory budget: collected'),
  });
  const stop = (signal: StopSignal) => {
    logger.info({ signal }, 'shutting down');
    void gateway
      .close()
      .then(() => tracing.shutdown())
      .then(
        () => 0,
        (error: unknown) => {
          logger.error({ err: error }, 'shutdown failed');
          return 1;
        },
      )
      // Every log line out, in order, before the exit (`endLogs`, which never rejects).
      .then(async (code) => {
        await endLogs(logger);
        process.exit(code);
      });
  };
  // A second signal while it drains changes nothing: the drain has its own deadline.
  signals.onStop(stop, () => undefined);
}

main().catch((error: unknown) => {
  console.error(`taskrelay-gateway: ${oneLine(error)}`);
  process.exit(1);
});
