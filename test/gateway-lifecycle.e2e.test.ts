/**
 * PROTOCOL.md §16.1: the gateway's lifecycle. A start that fails midway (here the listener: its port is taken, after
 * the Redis connections, the router's subscriber, the reaper and the session sweep are up) undoes what it started.
 */
import { spawn } from 'node:child_process';
import { createServer as createHttpServer } from 'node:http';
import { createServer, type Server } from 'node:net';
import { resolve } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ROOT, listensOn, startGatewayProcess } from './helpers/processes.js';
import { startRedis, type TestRedis } from './helpers/redis.js';
import { waitFor } from './helpers/wait-for.js';

let redis: TestRedis;
let taken: Server;
let port: number;

beforeAll(async () => {
  redis = await startRedis();
  taken = createServer();
  await new Promise<void>((done) => taken.listen(0, '127.0.0.1', done));
  port = (taken.address() as { port: number }).port;
});

afterAll(async () => {
  await new Promise((done) => taken.close(done));
  await redis.stop();
});

describe('§16.1 gateway lifecycle', () => {
  it('a start that fails at listen leaves no open handle: the process exits by itself', async () => {
    const child = spawn(process.execPath, [resolve(ROOT, 'test/fixtures/failed-start.mjs')], {
      env: {
        ...process.env,
        REDIS_URL: redis.url,
        TASKRELAY_PREFIX: `lifecycle-${process.pid}`,
        HOST: '127.0.0.1',
        PORT: String(port),
        LOG_LEVEL: 'silent',
      },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let out = '';
    child.stdout.on('data', (chunk: Buffer) => (out += chunk.toString()));
    child.stderr.on('data', (chunk: Buffer) => (out += chunk.toString()));
    const exited = new Promise<number | null>((done) => child.once('exit', (code) => done(code)));
    try {
      await waitFor(() => child.exitCode !== null, {
        timeoutMs: 15_000,
        message: `the failed start kept the process alive (output: ${out})`,
      });
    } finally {
      if (child.exitCode === null) child.kill('SIGKILL');
    }
    expect(await exited).toBe(0);
    expect(out).toContain('FAILED EADDRINUSE');
    // Had anything kept the loop alive a second after the failure, the fixture would have named it.
    expect(out).not.toContain('STILL OPEN');
  });

  // The test harness, not the gateway: another suite's process that took the free port first answers /readyz while
  // this gateway exits with EADDRINUSE. Taken for ready, a whole file ran against another stack's gateway once (its
  // tools unknown, then its port closed). Readiness counts only the gateway's own listener.
  it("is not taken for ready by another process's answer on its port", async () => {
    const other = createHttpServer((_req, res) => res.writeHead(200, { 'content-type': 'application/json' }).end('{}'));
    await new Promise<void>((done) => other.listen(0, '127.0.0.1', done));
    const otherPort = (other.address() as { port: number }).port;
    try {
      expect(listensOn(process.pid, otherPort)).toBe(true);
      const start = startGatewayProcess({
        REDIS_URL: redis.url,
        TASKRELAY_PREFIX: `lifecycle-ready-${process.pid}`,
        PORT: String(otherPort),
      });
      await expect(start).rejects.toThrow(/EADDRINUSE/);
    } finally {
      await new Promise((done) => other.close(done));
    }
  });
});
