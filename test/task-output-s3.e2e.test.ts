/**
 * PROTOCOL.md §34.7: with `TASKRELAY_BLOB_STORE=s3`, values stored apart from results (a large result, an artifact)
 * keep their bytes in an S3-compatible bucket through `@aws-sdk/client-s3`; Redis keeps only the index and the
 * bounds. The server here is moto's (`moto[server]` from PyPI, in the repository's `.venv`), on loopback; the suite
 * is skipped when it is not installed.
 */
import { existsSync } from 'node:fs';
import { resolve } from 'node:path';
import getPort from 'get-port';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { CreateBucketCommand, ListObjectsV2Command, S3Client } from '@aws-sdk/client-s3';
import { McpError, type CallToolResult } from '@modelcontextprotocol/sdk/types.js';
import { useStack } from './helpers/stack.js';
import { ROOT, connectClient, spawnProcess, type ManagedProcess } from './helpers/processes.js';
import { startTask, taskResult } from './helpers/tasks.js';
import { waitFor } from './helpers/wait-for.js';
// @ts-expect-error: a plain ESM fixture without types
import { bigText } from './fixtures/output-tools.mjs';

const MOTO = resolve(ROOT, '.venv/bin/moto_server');
const BUCKET = 'taskrelay-test';
type Json = Record<string, any>;

/** Filled in before the stack starts (the stack reads it then). */
const env: Record<string, string> = {
  TASKRELAY_BLOB_STORE: 's3',
  TASKRELAY_S3_BUCKET: BUCKET,
  AWS_ACCESS_KEY_ID: 'test',
  AWS_SECRET_ACCESS_KEY: 'test',
};
let moto: ManagedProcess | undefined;
let s3: S3Client | undefined;

describe.skipIf(!existsSync(MOTO))('§34.7 stored values in an S3-compatible bucket', () => {
  beforeAll(async () => {
    const port = await getPort({ host: '127.0.0.1' });
    moto = spawnProcess(MOTO, ['-H', '127.0.0.1', '-p', String(port)], {});
    env['TASKRELAY_S3_ENDPOINT'] = `http://127.0.0.1:${port}`;
    s3 = new S3Client({
      region: 'us-east-1',
      endpoint: env['TASKRELAY_S3_ENDPOINT'],
      forcePathStyle: true,
      credentials: { accessKeyId: 'test', secretAccessKey: 'test' },
    });
    await waitFor(
      async () =>
        s3
          ?.send(new CreateBucketCommand({ Bucket: BUCKET }))
          .then(() => true)
          .catch(() => false) ?? false,
      { timeoutMs: 30_000, message: 'moto did not start' },
    );
  }, 60_000);
  afterAll(async () => {
    s3?.destroy();
    await moto?.kill('SIGKILL');
  });

  const stack = useStack({
    name: 'task-output-s3',
    env,
    gateways: [{ TASKRELAY_AUTH_TOKENS: 'alice:alice-token,bob:bob-token' }],
    workers: [
      {
        TASKRELAY_TOOLS: resolve(ROOT, 'test/fixtures/output-tools.mjs'),
        TASKRELAY_QUEUE: 's3',
        TASKRELAY_INLINE_RESULT_BYTES: '65536',
      },
    ],
  });

  it('stores a large result and artifacts in the bucket and reads them back to their principal only', async () => {
    const client = await stack.client({ authorization: 'Bearer alice-token' });
    const bytes = 2 * 1024 * 1024 + 3;
    const taskId = await startTask(client, 'big_result', { bytes });
    const link = ((await taskResult(client, taskId, 60_000)) as CallToolResult).content[0] as Json;
    expect(link).toMatchObject({ type: 'resource_link', size: Buffer.byteLength(bigText(bytes)) });
    const read = await client.readResource({ uri: link['uri'] });
    expect((read.contents[0] as Json)['text']).toBe(bigText(bytes));

    const withArtifacts = await startTask(client, 'make_artifacts', { chunks: 4 });
    const links = ((await taskResult(client, withArtifacts)) as CallToolResult).content.filter(
      (c) => c.type === 'resource_link',
    ) as Json[];
    const bin = await client.readResource({ uri: links[1]?.['uri'] });
    const data = Buffer.from((bin.contents[0] as Json)['blob'] as string, 'base64');
    expect([data.length, data[0], data[3999]]).toEqual([4000, 0, 3]);

    // The bytes are objects in the bucket; Redis holds no value key for them.
    const listed = await s3?.send(new ListObjectsV2Command({ Bucket: BUCKET, Prefix: 'taskrelay/' }));
    const keys = (listed?.Contents ?? []).map((o) => o.Key);
    expect(keys.filter((k) => k?.startsWith(`taskrelay/${taskId}/`))).toHaveLength(1);
    expect(keys.filter((k) => k?.startsWith(`taskrelay/${withArtifacts}/`))).toHaveLength(2);
    expect(await stack.r.keys(`${stack.prefix}:blob:*`)).toEqual([]);

    const mallory = await connectClient(stack.gateway.url, { authorization: 'Bearer bob-token' });
    const refused = await mallory.readResource({ uri: link['uri'] }).catch((error: unknown) => error);
    expect(refused).toBeInstanceOf(McpError);
    expect((refused as McpError).code).toBe(-32602);
    await mallory.close();
  });
});
