/** PROTOCOL.md §34.1: the task resource URIs, built and parsed in one place. */
import { describe, expect, it } from 'vitest';
import { blobUri, outputUri, parseTaskResourceUri } from '../src/task-output.js';

describe('task resource URIs', () => {
  it('parses what it builds', () => {
    expect(parseTaskResourceUri(outputUri('abc123'))).toEqual({ kind: 'output', taskId: 'abc123' });
    expect(parseTaskResourceUri(blobUri('abc123', 'b1'))).toEqual({ kind: 'blob', taskId: 'abc123', blobId: 'b1' });
    expect(parseTaskResourceUri(blobUri('parent', 'x'))?.kind).toBe('blob');
  });

  it.each([
    'taskrelay://tasks/',
    'taskrelay://tasks/abc',
    'taskrelay://tasks/abc/output/more',
    'taskrelay://tasks/abc/blobs/',
    'taskrelay://tasks/a%2Fb/output',
    'taskrelay://tasks/%E0%A4%A/output',
    'file:///etc/passwd',
    'taskrelay://tasks/abc/blobs/../output',
  ])('refuses %s', (uri) => {
    expect(parseTaskResourceUri(uri)).toBeUndefined();
  });
});
