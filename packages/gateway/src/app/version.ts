/**
 * The gateway's version, as its package.json says (it goes out in `serverInfo` and in the webhooks' User-Agent).
 * Read at load time from the file beside `src/` and `dist/` alike, so a release bump cannot leave it behind.
 */
import { createRequire } from 'node:module';

const pkg = createRequire(import.meta.url)('../../package.json') as { version: string };

export const GATEWAY_VERSION: string = pkg.version;
