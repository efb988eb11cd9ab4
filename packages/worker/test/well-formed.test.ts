import { describe, expect, it } from 'vitest';
import { wellFormedJson, wellFormedText } from '../src/well-formed.js';

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
});
