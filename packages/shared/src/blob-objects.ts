/**
 * The optional object store for values stored apart from a result (PROTOCOL.md §34.7): an S3-compatible bucket,
 * through `@aws-sdk/client-s3`. Redis keeps the index and the bounds either way; only the bytes move. Credentials come
 * from the AWS SDK's default chain (`AWS_ACCESS_KEY_ID` / `AWS_SECRET_ACCESS_KEY`, a profile, an instance role).
 */
import { GetObjectCommand, PutObjectCommand, S3Client } from '@aws-sdk/client-s3';

/** Where stored values go: Redis (the default) or an S3-compatible bucket. */
export interface BlobStoreConfig {
  /** `TASKRELAY_BLOB_STORE`: `redis` (default) or `s3`. */
  kind: 'redis' | 's3';
  /** `TASKRELAY_S3_BUCKET` (required with `s3`). */
  bucket?: string | undefined;
  /** `TASKRELAY_S3_ENDPOINT`: an S3-compatible server's URL (MinIO, Ceph, moto); unset: AWS. */
  endpoint?: string | undefined;
  /** `TASKRELAY_S3_REGION`, default `us-east-1`. */
  region?: string | undefined;
  /** `TASKRELAY_S3_KEY_PREFIX`, default `taskrelay/`: every object's key starts with it (for a lifecycle rule). */
  keyPrefix?: string | undefined;
}

/** The bytes of stored values in an S3-compatible bucket. */
export class BlobObjects {
  private readonly client: S3Client;
  private readonly bucket: string;
  private readonly keyPrefix: string;

  constructor(config: BlobStoreConfig) {
    if (config.bucket === undefined)
      throw new TypeError('TASKRELAY_S3_BUCKET is required with TASKRELAY_BLOB_STORE=s3');
    this.bucket = config.bucket;
    this.keyPrefix = config.keyPrefix ?? 'taskrelay/';
    this.client = new S3Client({
      region: config.region ?? 'us-east-1',
      ...(config.endpoint === undefined ? {} : { endpoint: config.endpoint, forcePathStyle: true }),
    });
  }

  /** The object key of one value. */
  keyOf(taskId: string, blobId: string): string {
    return `${this.keyPrefix}${taskId}/${blobId}`;
  }

  async put(key: string, body: Buffer, mimeType: string): Promise<void> {
    await this.client.send(new PutObjectCommand({ Bucket: this.bucket, Key: key, Body: body, ContentType: mimeType }));
  }

  /** Bytes `start .. end − 1` of an object (an HTTP range read). */
  async getRange(key: string, start: number, end: number): Promise<Buffer> {
    if (end <= start) return Buffer.alloc(0);
    const got = await this.client.send(
      new GetObjectCommand({ Bucket: this.bucket, Key: key, Range: `bytes=${start}-${end - 1}` }),
    );
    const bytes = await got.Body?.transformToByteArray();
    return Buffer.from(bytes ?? new Uint8Array());
  }

  close(): void {
    this.client.destroy();
  }
}
