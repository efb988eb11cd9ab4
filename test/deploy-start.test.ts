/**
 * `npm start` (scripts/start-stack.mjs) fails loudly when its port is taken, instead of announcing "taskrelay is
 * running" for whatever else answers there.
 */
import { spawn } from 'node:child_process';
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { resolve } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ROOT } from './helpers/processes.js';
import { startRedis, uniquePrefix, type TestRedis } from './helpers/redis.js';

let redis: TestRedis;
let squatter: Server;

beforeAll(async () => {
  redis = await startRedis();
  // Something else on the port, that even answers /readyz with 200.
  squatter = createServer((_req, res) => res.end('{"status":"ready"}'));
  await new Promise<void>((done) => squatter.listen(0, '127.0.0.1', done));
});

afterAll(async () => {
  await new Promise((done) => squatter?.close(done));
  await redis?.stop();
});

describe('npm start', () => {
  it('exits 1 with one line naming the taken port, and never says it is running', async () => {
    const { port } = squatter.address() as AddressInfo;
    const child = spawn(process.execPath, [resolve(ROOT, 'scripts/start-stack.mjs')], {
      cwd: ROOT,
      env: {
        ...process.env,
        REDIS_URL: redis.url,
        TASKRELAY_PREFIX: uniquePrefix('start'),
        HOST: '127.0.0.1',
        PORT: String(port),
      },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let out = '';
    child.stdout.on('data', (d: Buffer) => (out += d.toString()));
    child.stderr.on('data', (d: Buffer) => (out += d.toString()));
    const code = await new Promise<number | null>((done) => child.once('exit', done));
    expect(code).toBe(1);
    expect(out).toMatch(new RegExp(`127\\.0\\.0\\.1:${port} is already in use`));
    expect(out).not.toMatch(/taskrelay is running/);
  });
});
