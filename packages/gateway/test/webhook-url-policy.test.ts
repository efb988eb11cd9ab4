import { describe, expect, it } from 'vitest';
import { WebhookIntake } from '../src/tasks/webhooks/intake.js';
import {
  PendingWebhooksCapError,
  WebhookPolicy,
  WebhookRefusedError,
  type LookupAddress,
} from '../src/tasks/webhooks/url-policy.js';
import { toMcpError } from '../src/wire/errors.js';

/** A resolver of our own: no query leaves the machine. */
function dns(table: Record<string, string[]>) {
  const asked: string[] = [];
  const lookup = async (host: string): Promise<LookupAddress[]> => {
    asked.push(host);
    const addresses = table[host];
    if (!addresses) throw Object.assign(new Error(`getaddrinfo ENOTFOUND ${host}`), { code: 'ENOTFOUND' });
    return addresses.map((address) => ({ address, family: address.includes(':') ? 6 : 4 }));
  };
  return { lookup, asked };
}

function policy(allowedHosts: string[], table: Record<string, string[]> = {}, secretSet = true) {
  return new WebhookPolicy({ secretSet, allowedHosts, lookup: dns(table).lookup });
}

async function refusal(p: WebhookPolicy, url: string): Promise<string> {
  const error = await p.check(url).then(
    () => undefined,
    (e: unknown) => e,
  );
  expect(error).toBeInstanceOf(WebhookRefusedError);
  return (error as Error).message;
}

describe('§27.1 which webhook URLs are accepted', () => {
  it('without a secret every webhook is refused, even an allowed one', async () => {
    const p = policy(['hooks.example.com'], { 'hooks.example.com': ['93.184.216.34'] }, false);
    expect(await refusal(p, 'https://hooks.example.com/h')).toMatch(/TASKRELAY_WEBHOOK_SECRET is not set/);
  });

  it('nothing is allowed by default', async () => {
    const p = policy([], { 'hooks.example.com': ['93.184.216.34'] });
    expect(await refusal(p, 'https://hooks.example.com/h')).toMatch(
      /host hooks\.example\.com is not allowed .*TASKRELAY_WEBHOOK_ALLOWED_HOSTS, which is empty/,
    );
  });

  it('a host entry allows any port, a host:port entry only that port (the scheme default when none is written)', async () => {
    const table = { 'a.example.com': ['93.184.216.34'], 'b.example.com': ['93.184.216.35'] };
    const p = policy(['a.example.com', 'b.example.com:8443'], table);
    await expect(p.check('https://a.example.com:9999/x')).resolves.toMatchObject({ address: '93.184.216.34' });
    await expect(p.check('https://b.example.com:8443/x')).resolves.toMatchObject({ address: '93.184.216.35' });
    expect(await refusal(p, 'https://b.example.com/x')).toMatch(/host b\.example\.com is not allowed/);
    expect(await refusal(p, 'https://c.example.com/x')).toMatch(/not allowed/);
    const q = policy(['b.example.com:443'], table);
    await expect(q.check('https://B.EXAMPLE.COM/x')).resolves.toMatchObject({ address: '93.184.216.35' });
  });

  it('refuses other schemes, credentials in the URL and things that are no URL', async () => {
    const p = policy(['a.example.com'], { 'a.example.com': ['93.184.216.34'] });
    expect(await refusal(p, 'ftp://a.example.com/x')).toMatch(/must be http:\/\/ or https:\/\//);
    expect(await refusal(p, 'https://user:pw@a.example.com/x')).toMatch(/user name or password/);
    expect(await refusal(p, 'not a url')).toMatch(/is not a URL/);
  });

  it('a name that resolves to a private, loopback or link-local address is refused', async () => {
    const table = {
      'intranet.example.com': ['10.0.0.7'],
      'metadata.example.com': ['169.254.169.254'],
      'sneaky.example.com': ['93.184.216.34', '127.0.0.1'],
      'mapped.example.com': ['::ffff:192.168.1.1'],
      'v6local.example.com': ['fe80::1'],
    };
    const p = policy(Object.keys(table), table);
    expect(await refusal(p, 'https://intranet.example.com/')).toMatch(/resolves to 10\.0\.0\.7, a private address/);
    expect(await refusal(p, 'https://metadata.example.com/')).toMatch(/169\.254\.169\.254, a linkLocal address/);
    expect(await refusal(p, 'https://sneaky.example.com/')).toMatch(/127\.0\.0\.1, a loopback address/);
    expect(await refusal(p, 'https://mapped.example.com/')).toMatch(/private address/);
    expect(await refusal(p, 'https://v6local.example.com/')).toMatch(/linkLocal/);
  });

  it('an IP literal is judged as its address: loopback only when that address itself is allowed', async () => {
    expect(await refusal(policy(['127.0.0.1']), 'http://127.0.0.2:8080/')).toMatch(/not allowed/);
    const p = policy(['127.0.0.1:8080', '[::1]:8080']);
    await expect(p.check('http://127.0.0.1:8080/hook')).resolves.toMatchObject({ address: '127.0.0.1', family: 4 });
    await expect(p.check('http://[::1]:8080/hook')).resolves.toMatchObject({ address: '::1', family: 6 });
    expect(await refusal(p, 'http://127.0.0.1:8081/hook')).toMatch(/not allowed/);
  });

  it('a name allowed by name resolving to loopback passes only when the address is on the list too', async () => {
    const table = { localhost: ['127.0.0.1'] };
    expect(await refusal(policy(['localhost:9000'], table), 'http://localhost:9000/')).toMatch(/loopback address/);
    await expect(
      policy(['localhost:9000', '127.0.0.1:9000'], table).check('http://localhost:9000/'),
    ).resolves.toMatchObject({
      address: '127.0.0.1',
    });
  });

  it('a name that does not resolve is refused at creation with the reason', async () => {
    const intake = new WebhookIntake(policy(['gone.example.com']), { pendingFor: async () => 0 }, 10);
    await expect(intake.accept({ url: 'https://gone.example.com/' }, 'task', 'alice')).rejects.toThrow(
      /Webhook refused: gone\.example\.com does not resolve \(getaddrinfo ENOTFOUND/,
    );
  });
});

describe('§27.1 the creation-time checks', () => {
  const allowed = policy(['127.0.0.1:9000']);

  it('accepts {url} and returns what the task stores', async () => {
    const intake = new WebhookIntake(allowed, { pendingFor: async () => 0 }, 5);
    await expect(intake.accept({ url: 'http://127.0.0.1:9000/h' }, 'task', 'alice')).resolves.toEqual({
      url: 'http://127.0.0.1:9000/h',
      cap: 5,
    });
    await expect(intake.accept(undefined, 'task', 'alice')).resolves.toBeUndefined();
  });

  it('refuses a malformed _meta value, a plain call, and a principal at its pending cap', async () => {
    const intake = new WebhookIntake(allowed, { pendingFor: async (p) => (p === 'busy' ? 5 : 0) }, 5);
    await expect(intake.accept('http://127.0.0.1:9000/h', 'task', 'alice')).rejects.toThrow(/must be \{"url"/);
    await expect(intake.accept({ url: 'http://127.0.0.1:9000/h', extra: 1 }, 'task', 'alice')).rejects.toThrow(
      /must be \{"url"/,
    );
    await expect(intake.accept({ url: 'http://127.0.0.1:9000/h' }, 'call', 'alice')).rejects.toThrow(
      /sent for tasks only/,
    );
    const capped = await intake.accept({ url: 'http://127.0.0.1:9000/h' }, 'task', 'busy').catch((e: unknown) => e);
    expect(capped).toBeInstanceOf(PendingWebhooksCapError);
    expect(toMcpError(capped)).toMatchObject({
      code: -32600,
      message: expect.stringMatching(/Too many pending webhook deliveries: .* 5 events .*at most 5/),
      data: { code: 'TOO_MANY_PENDING_WEBHOOKS' },
    });
    expect(toMcpError(new WebhookRefusedError('x'))).toMatchObject({ code: -32602, data: { code: 'WEBHOOK_REFUSED' } });
  });
});
