export { startGateway, GATEWAY_VERSION, type StartGatewayOptions, type GatewayHandle } from './gateway.js';
export { SessionEventStore, MAX_SESSION_EVENT_BYTES, type SessionEventStoreOptions } from './event-store.js';
export { createAuthenticator, type Authenticator } from './auth/authenticate.js';
export { hostGuard, originGuard, jsonRpcError } from './http-guards.js';
