/** Waitpoint tokens (PROTOCOL.md §32.2): opaque, bound to their task and name, refused when changed or foreign. */
import { randomBytes } from 'node:crypto';
import { describe, expect, it } from 'vitest';
import { WaitpointTokens } from '../src/waitpoints.js';

describe('waitpoint tokens', () => {
  const tokens = WaitpointTokens.withKey(randomBytes(32));

  it('open to the task and name they were sealed for, and say neither in the clear', async () => {
    const token = await tokens.seal('task-0123456789', 'ci');
    expect(token).not.toContain('task-0123456789');
    expect(Buffer.from(token.split('.').join(''), 'base64url').toString('latin1')).not.toContain('task-0123456789');
    await expect(tokens.open(token)).resolves.toEqual({ taskId: 'task-0123456789', name: 'ci' });
    // Two seals of one waitpoint differ: the stored one (the first run's) is what every run hands out.
    expect(await tokens.seal('task-0123456789', 'ci')).not.toBe(token);
  });

  it('refuse a changed byte, another deployment’s token, and garbage', async () => {
    const token = await tokens.seal('t1', 'ci');
    const parts = token.split('.');
    const ciphertext = parts[3]!;
    parts[3] = (ciphertext[0] === 'A' ? 'B' : 'A') + ciphertext.slice(1);
    await expect(tokens.open(parts.join('.'))).resolves.toBeUndefined();
    await expect(WaitpointTokens.withKey(randomBytes(32)).open(token)).resolves.toBeUndefined();
    for (const junk of ['', 'nope', 'a.b.c.d.e', 'x'.repeat(5_000)]) {
      await expect(tokens.open(junk)).resolves.toBeUndefined();
    }
  });
});
