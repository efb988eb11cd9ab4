export { startGateway, GATEWAY_VERSION, type StartGatewayOptions, type GatewayHandle } from './gateway.js';
export { RedisEventStore } from './event-store.js';
