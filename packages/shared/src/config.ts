/**
 * Configuration from the environment: one zod schema per process, defaults as in docs/CONFIGURATION.md, and a one-line
 * `ConfigError` naming the variable for anything invalid. Resolved once at the edge; the rest of the code takes the
 * resolved objects (units in names).
 *
 * Split by concern under config/ (issue 47: no source file over about 600 lines): `values.ts` (value schemas),
 * `common.ts` (what every process reads), `gateway-env.ts` and `gateway.ts`, `worker.ts`. These are the public names.
 */
export { workerSettingsShape, requireRedisUrl, type CommonConfig } from './config/common.js';
export { gatewayEnvSchema } from './config/gateway-env.js';
export {
  isLoopbackHost,
  loadGatewayConfig,
  resolveGatewayOptions,
  type GatewayConfig,
  type GatewayOptions,
  type OAuthConfig,
  type WebhookConfig,
} from './config/gateway.js';
export { loadWorkerConfig, workerEnvSchema, type WorkerConfig } from './config/worker.js';
