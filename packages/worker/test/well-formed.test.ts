import { describe, expect, it } from 'vitest';
import { MAX_PROGRESS_MESSAGE_BYTES, boundedText, wellFormedJson, wellFormedText } from '../src/well-formed.js';

describe('well-formed texts (PROTOCOL.md §22.4)', () => {
  it('replaces each lone surrogate with U+FFFD and keeps pairs, wherever they sit', () => {
    expect(wellFormedText('a\uD800b')).toBe('a\uFFFDb');
    expect(wellFormedText('\uDC00start')).toBe('\uFFFDstart');
    expect(wellFormedText('end\uDBFF')).toBe('end\uFFFD');
    expect(wellFormedText('\uDC00\uD800')).toBe('\uFFFD\uFFFD');
    expect(wellFormedText('pair \uD83D\uDE00 kept')).toBe('pair \uD83D\uDE00 kept');
    expect(JSON.stringify(wellFormedText('x\uD800'))).not.toMatch(/\\ud/i);
  });

  it('makes every string of a JSON value well-formed, keys included, and leaves other values alone', () => {
    expect(wellFormedJson({ 'k\uD800': ['\uDC00', 1, true, null, { deep: 'x\uD801' }] })).toEqual({
      'k\uFFFD': ['\uFFFD', 1, true, null, { deep: 'x\uFFFD' }],
    });
  });

  it('bounds a progress message to MAX_PROGRESS_MESSAGE_BYTES of UTF-8, cut on a character, with a marker', () => {
    expect(boundedText('short', MAX_PROGRESS_MESSAGE_BYTES)).toBe('short');
    const long = 'é'.repeat(150_000); // 300,000 bytes
    const bounded = boundedText(long, MAX_PROGRESS_MESSAGE_BYTES);
    expect(Buffer.byteLength(bounded)).toBeLessThanOrEqual(MAX_PROGRESS_MESSAGE_BYTES);
    expect(bounded).toMatch(/^é+ …\[truncated: 300000 bytes\]$/);
    const emoji = boundedText('\u{1F600}'.repeat(5_000), 100);
    expect(emoji).toMatch(/^(\u{1F600})+ …\[truncated: 20000 bytes\]$/u);
    expect(Buffer.byteLength(emoji)).toBeLessThanOrEqual(100);
  });
});
