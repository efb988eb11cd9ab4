export { startGateway, GATEWAY_VERSION, type StartGatewayOptions, type GatewayHandle } from './app/gateway.js';
export {
  SessionEventStore,
  MAX_SESSION_EVENT_BYTES,
  type SessionEventStoreOptions,
} from './transports/session/event-store.js';
export { createAuthenticator, type Authenticator } from './http/auth/authenticate.js';
export { hostGuard, originGuard, jsonRpcError } from './http/http-guards.js';
export { retirePool, rememberedPools, type RetireOutcome } from './tasks/catalog.js';
