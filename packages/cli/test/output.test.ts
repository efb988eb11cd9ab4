import { describe, expect, it } from 'vitest';
import { barRows } from '../src/output.js';

describe('barRows: the rows live bars may use', () => {
  it('leaves one row of a real terminal free', () => {
    expect(barRows({ rows: 40 }, {})).toBe(39);
  });

  it('falls back to LINES, then 24, when the terminal reports 0 rows (a pty made by `script`)', () => {
    expect(barRows({ rows: 0 }, { LINES: '30' })).toBe(29);
    expect(barRows({ rows: 0 }, {})).toBe(23);
    expect(barRows({}, { LINES: 'x' })).toBe(23);
  });

  it('keeps two rows on a tiny terminal', () => {
    expect(barRows({ rows: 1 }, {})).toBe(2);
  });
});
