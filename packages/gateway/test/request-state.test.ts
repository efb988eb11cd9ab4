/**
 * PROTOCOL.md §17.2 and §16.2, without Redis: the MRTR `requestState` signer and the SEP-2243 header checks.
 */
import { describe, expect, it } from 'vitest';
import { RequestStateSigner, argumentsDigest } from '../src/protocol/request-state.js';
import { checkParamHeaders, decodeHeaderValue } from '../src/transports/sessionless/param-headers.js';

const signer = RequestStateSigner.withKey(Buffer.alloc(32, 7));
const digest = argumentsDigest({ question: 'q', n: 1 });
const state = {
  taskId: 't1',
  principal: 'alice',
  tool: 'ask',
  expiresAt: 2_000,
  becomesTask: false,
  argumentsDigest: digest,
};
const expect_ = { principal: 'alice', tool: 'ask', argumentsDigest: digest };

describe('§17.2 requestState', () => {
  it('verifies what it signed, bound to principal, tool and expiry', () => {
    const token = signer.sign(state, 1_000);
    expect(signer.verify(token, expect_, 1_500)).toEqual({ ok: true, state });
    expect(signer.verify(token, { ...expect_, principal: 'bob' }, 1_500)).toEqual({ ok: false, reason: 'principal' });
    expect(signer.verify(token, { ...expect_, tool: 'other' }, 1_500)).toEqual({ ok: false, reason: 'tool' });
    expect(signer.verify(token, expect_, 2_000)).toEqual({ ok: false, reason: 'expired' });
    const task = signer.sign({ ...state, becomesTask: true }, 1_000);
    expect(signer.verify(task, expect_, 1_500)).toMatchObject({ ok: true, state: { becomesTask: true } });
  });

  it('is bound to the call’s arguments (R9): a retry with other arguments is refused', () => {
    const token = signer.sign(state, 1_000);
    // The same arguments in another key order are the same call.
    expect(argumentsDigest({ n: 1, question: 'q' })).toBe(digest);
    const other = argumentsDigest({ question: 'q', n: 2 });
    expect(other).not.toBe(digest);
    expect(signer.verify(token, { ...expect_, argumentsDigest: other }, 1_500)).toEqual({
      ok: false,
      reason: 'arguments',
    });
  });

  it('gives each round its own state', () => {
    expect(signer.sign(state, 1_000)).not.toBe(signer.sign(state, 1_001));
  });

  it('refuses anything altered, and a state signed with another key', () => {
    const token = signer.sign(state, 1_000);
    const [body, mac] = token.split('.') as [string, string];
    const payload = JSON.parse(Buffer.from(body, 'base64url').toString('utf8')) as Record<string, unknown>;
    const forged = Buffer.from(JSON.stringify({ ...payload, p: 'bob' })).toString('base64url');
    const other = RequestStateSigner.withKey(Buffer.alloc(32, 8)).sign(state, 1_000);
    for (const bad of [
      `${token}-TAMPERED`,
      `${forged}.${mac}`,
      `${body}.${mac.slice(1)}`,
      other,
      `${body}.`,
      '',
      'x',
    ]) {
      expect(signer.verify(bad, expect_, 1_500).ok).toBe(false);
    }
    expect(signer.verify(`${forged}.${mac}`, { ...expect_, principal: 'bob' }, 1_500)).toEqual({
      ok: false,
      reason: 'signature',
    });
  });
});

describe('§16.2 SEP-2243 header values', () => {
  it('decodes the Base64 sentinel strictly and takes anything else literally', () => {
    expect(decodeHeaderValue('us-west1')).toBe('us-west1');
    expect(decodeHeaderValue('=?base64?SGVsbG8sIOS4lueVjA==?=')).toBe('Hello, 世界');
    expect(decodeHeaderValue('=?base64?IHBhZGRlZCA=?=')).toBe(' padded ');
    expect(decodeHeaderValue('=?base64?SGVsbG8=')).toBe('=?base64?SGVsbG8=');
    expect(decodeHeaderValue('SGVsbG8=')).toBe('SGVsbG8=');
    expect(decodeHeaderValue('=?base64?SGVsbG8?=')).toBeUndefined(); // no padding
    expect(decodeHeaderValue('=?base64?SGVs!!!bG8=?=')).toBeUndefined();
    expect(decodeHeaderValue('=?base64?/w==?=')).toBeUndefined(); // not UTF-8
    expect(decodeHeaderValue('caf\u00e9')).toBeUndefined();
  });

  it('checks every mirrored argument, nested ones too, and needs no header for an absent or null one', () => {
    const schema = {
      type: 'object',
      properties: {
        region: { type: 'string', 'x-mcp-header': 'Region' },
        n: { type: 'integer', 'x-mcp-header': 'N' },
        flag: { type: 'boolean', 'x-mcp-header': 'Flag' },
        where: { type: 'object', properties: { zone: { type: 'string', 'x-mcp-header': 'Zone' } } },
      },
    };
    const headers =
      (values: Record<string, string>) =>
      (name: string): string | undefined =>
        values[name.toLowerCase()];
    const all = { 'mcp-param-region': 'eu', 'mcp-param-n': '42.0', 'mcp-param-flag': 'true', 'mcp-param-zone': 'b' };
    const args = { region: 'eu', n: 42, flag: true, where: { zone: 'b' } };
    expect(checkParamHeaders(headers(all), schema, args)).toBeUndefined();
    expect(checkParamHeaders(headers({}), schema, { region: null })).toBeUndefined();
    expect(checkParamHeaders(headers({ ...all, 'mcp-param-zone': 'c' }), schema, args)).toMatch(/Mcp-Param-Zone/);
    expect(checkParamHeaders(headers({ ...all, 'mcp-param-n': '43' }), schema, args)).toMatch(/Mcp-Param-N /);
    expect(checkParamHeaders(headers({ ...all, 'mcp-param-flag': 'TRUE' }), schema, args)).toMatch(/Flag/);
    const { 'mcp-param-region': _omitted, ...withoutRegion } = all;
    expect(checkParamHeaders(headers(withoutRegion), schema, args)).toMatch(/Mcp-Param-Region header is required/);
  });
});
