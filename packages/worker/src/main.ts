#!/usr/bin/env node
/**
 * The stock worker process: configuration from the environment (docs/CONFIGURATION.md), the tools of `TASKRELAY_TOOLS` or
 * the demo tools, a clean drain on SIGTERM/SIGINT. The only file allowed to write to the console: a startup failure is
 * one line on stderr and exit code 1.
 */
import { resolve } from 'node:path';
import { pathToFileURL } from 'node:url';
import {
  ConfigError,
  createLogger,
  createRedis,
  endLogs,
  listenForStopSignals,
  loadWorkerConfig,
  oneLine,
  requireRedisUrl,
  startTracing,
  waitForRedis,
  type StopSignal,
  type StopSignals,
  type Tracing,
} from '@taskrelay/shared';
import { demoTools } from './demo-tools.js';
import { isToolDefinition, type ToolDefinition } from './define-tool.js';
import { loadJobApiTools } from './job-api/index.js';
import { WorkerMetrics, serveMetrics, type MetricsServer } from './metrics.js';
import { startWorker, type WorkerHandle } from './worker.js';

async function main(): Promise<void> {
  // First: a SIGTERM sent on seeing `worker ready` must drain, never find the kernel's default still in place.
  const signals = listenForStopSignals();
  const config = loadWorkerConfig();
  const redisUrl = requireRedisUrl(config);
  const logger = createLogger('worker', { level: config.logLevel });
  const tools = config.toolsModule === undefined ? [...demoTools] : await loadTools(config.toolsModule);
  // docs/JOB-API.md: served beside the other tools; read here until shared's config owns the variable.
  const jobApis = process.env['TASKRELAY_JOB_APIS']?.trim();
  if (jobApis) tools.push(...(await loadJobApiTools(resolve(process.cwd(), jobApis))));

  const probe = createRedis(redisUrl, { lazyConnect: false });
  probe.on('error', () => undefined);
  try {
    await waitForRedis(probe);
  } finally {
    probe.disconnect();
  }

  const tracing = await startTracing('taskrelay-worker');
  const metrics = new WorkerMetrics();
  // The rest of the configuration is startWorker's settings under their own names (shared's workerSettingsShape).
  const {
    redisUrl: _url,
    logLevel: _level,
    toolsModule: _module,
    metricsPort: _port,
    metricsHost: _host,
    ...settings
  } = config;
  const handle = await startWorker({ ...settings, redisUrl, tools, logger, metrics });
  let metricsServer: MetricsServer | undefined;
  const metricsPort = config.metricsPort;
  if (metricsPort !== undefined) {
    metricsServer = await serveMetrics(metrics.registry, config.metricsHost, metricsPort).catch(
      async (error: unknown) => {
        await handle.close({ graceMs: 0 });
        throw new ConfigError(
          `Invalid configuration: WORKER_METRICS_PORT ${metricsPort} cannot be served: ${oneLine(error)}`,
        );
      },
    );
  }
  logger.info(
    {
      workerId: handle.workerId,
      queue: handle.queue,
      tools: tools.map((t) => t.name),
      metricsPort: metricsServer?.port,
    },
    'worker ready',
  );
  handleSignals(signals, handle, logger, metricsServer, tracing);
}

/** Every tool definition a module exports: named exports, the default export, and arrays of either. */
async function loadTools(modulePath: string): Promise<ToolDefinition[]> {
  const url = pathToFileURL(resolve(process.cwd(), modulePath)).href;
  let exports: Record<string, unknown>;
  try {
    exports = (await import(url)) as Record<string, unknown>;
  } catch (error) {
    throw new ConfigError(`Invalid configuration: TASKRELAY_TOOLS could not load ${modulePath}: ${oneLine(error)}`);
  }
  const found = new Set<ToolDefinition>();
  for (const value of Object.values(exports)) {
    for (const item of Array.isArray(value) ? value : [value]) {
      if (isToolDefinition(item)) found.add(item);
    }
  }
  if (found.size === 0) {
    throw new ConfigError(
      `Invalid configuration: TASKRELAY_TOOLS module ${modulePath} exports no tool definitions (export the results of defineTool)`,
    );
  }
  return [...found];
}

function handleSignals(
  signals: StopSignals,
  handle: WorkerHandle,
  logger: ReturnType<typeof createLogger>,
  metricsServer: MetricsServer | undefined,
  tracing: Tracing,
): void {
  const drain = (signal: StopSignal) => {
    logger.info({ signal }, 'shutting down');
    Promise.all([handle.close(), metricsServer?.close()])
      .then(() => tracing.shutdown())
      // Every log line out, in order, before the exit (`endLogs`).
      .then(() => endLogs(logger))
      .then(
        () => process.exit(0),
        (error: unknown) => {
          console.error(`taskrelay-worker: shutdown failed: ${oneLine(error)}`);
          process.exit(1);
        },
      );
  };
  signals.onStop(drain, (signal) => {
    logger.warn({ signal }, 'second signal; exiting without waiting for running tools');
    process.exit(1);
  });
}

main().catch((error: unknown) => {
  console.error(`taskrelay-worker: ${oneLine(error)}`);
  process.exit(1);
});
