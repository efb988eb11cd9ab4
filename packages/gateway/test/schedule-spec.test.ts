/**
 * What a schedule and a delayed start accept (PROTOCOL.md §33): the one schema behind the API, the CLI and the file,
 * and the start-at key's checks, without Redis.
 */
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { startAtOf } from '../src/protocol/request-meta.js';
import { readSchedulesFile } from '../src/tasks/schedules/schedule-file.js';
import { scheduleSpecSchema, specProblem } from '../src/tasks/schedules/schedule-model.js';

const DAY = 86_400_000;
const meta = (value: unknown) => ({ 'dev.taskrelay/start-at': value });

describe('start-at', () => {
  const now = Date.parse('2026-12-04T06:00:00Z');

  it('reads an ISO time with its offset, to the ms, whatever the offset', () => {
    expect(startAtOf(meta('2026-12-04T07:30:00Z'), 30 * DAY, now)).toBe(Date.parse('2026-12-04T07:30:00Z'));
    expect(startAtOf(meta('2026-12-04T09:30:00.250+02:00'), 30 * DAY, now)).toBe(
      Date.parse('2026-12-04T07:30:00.250Z'),
    );
    expect(startAtOf(undefined, 30 * DAY, now)).toBeUndefined();
    expect(startAtOf({}, 30 * DAY, now)).toBeUndefined();
  });

  it('gives a past time back as it is (the service starts it at once)', () => {
    expect(startAtOf(meta('2020-01-01T00:00:00Z'), 30 * DAY, now)).toBe(Date.parse('2020-01-01T00:00:00Z'));
  });

  it.each([['tomorrow'], ['2026-12-04'], ['2026-12-04T07:30:00'], [1765000000000], [null], [{ at: 'x' }]])(
    'refuses %j, naming the key and the form it wants',
    (value) => {
      expect(() => startAtOf(meta(value), 30 * DAY, now)).toThrow(
        /_meta\["dev\.taskrelay\/start-at"\] must be an ISO 8601 time with its offset/,
      );
    },
  );

  it('refuses a time past the bound, and takes one just inside it', () => {
    expect(() => startAtOf(meta('2027-01-04T06:00:01Z'), 31 * DAY, now)).toThrow(/too far ahead: at most 31 day/);
    expect(startAtOf(meta('2027-01-04T06:00:00Z'), 31 * DAY, now)).toBe(now + 31 * DAY);
  });
});

describe('schedule definitions', () => {
  const base = { id: 'nightly', tool: 'build_report', arguments: { report: 'n' } };
  const problem = (value: unknown) => {
    const parsed = scheduleSpecSchema.safeParse(value);
    return parsed.success ? undefined : specProblem(parsed.error);
  };

  it('takes a cron with its zone or an interval, and defaults overlap to skip', () => {
    expect(scheduleSpecSchema.parse({ ...base, cron: '0 2 * * *', tz: 'Europe/Paris' })).toMatchObject({
      overlap: 'skip',
      tz: 'Europe/Paris',
    });
    expect(scheduleSpecSchema.parse({ ...base, cron: '*/5 * * * * *' }).cron).toBe('*/5 * * * * *');
    expect(scheduleSpecSchema.parse({ id: 'x', tool: 't', every: 1_000 })).toMatchObject({ arguments: {} });
  });

  it.each<[Record<string, unknown>, RegExp]>([
    [{ ...base }, /exactly one of cron and every/],
    [{ ...base, cron: '* * * * *', every: 1_000 }, /exactly one of cron and every/],
    [{ ...base, every: 999 }, /every/],
    [{ ...base, cron: '61 * * * *' }, /cron is not a cron pattern BullMQ reads/],
    [{ ...base, cron: 'every day' }, /cron is not a cron pattern BullMQ reads/],
    [{ ...base, cron: '0 2 * * *', tz: 'Mars/Olympus' }, /tz must be an IANA time zone/],
    [{ ...base, every: 1_000, tz: 'UTC' }, /tz goes with cron/],
    [{ ...base, every: 1_000, overlap: 'later' }, /overlap/],
    [{ ...base, every: 1_000, id: 'a:b' }, /id must be 1 to 48/],
    [{ ...base, every: 1_000, id: 'x'.repeat(49) }, /id must be 1 to 48/],
    [{ ...base, every: 1_000, colour: 'red' }, /unknown field colour/],
  ])('refuses %j, naming the field', (value, message) => {
    expect(problem(value)).toMatch(message);
  });
});

describe('TASKRELAY_SCHEDULES_FILE', () => {
  const dir = mkdtempSync(join(tmpdir(), 'taskrelay-schedules-'));
  const file = (name: string, text: string) => {
    const path = join(dir, name);
    writeFileSync(path, text);
    return path;
  };

  it('reads each entry with its principal', async () => {
    const path = file(
      'good.yaml',
      'schedules:\n  - id: a\n    principal: reports\n    cron: "0 2 * * *"\n    tool: t\n  - id: b\n    principal: ops\n    every: 60000\n    tool: t\n    overlap: queue\n',
    );
    expect(await readSchedulesFile(path)).toEqual([
      { principal: 'reports', spec: { id: 'a', tool: 't', arguments: {}, cron: '0 2 * * *', overlap: 'skip' } },
      { principal: 'ops', spec: { id: 'b', tool: 't', arguments: {}, every: 60_000, overlap: 'queue' } },
    ]);
  });

  it.each<[string, string, RegExp]>([
    ['missing.yaml', '', /missing\.yaml: cannot be read \(ENOENT\)/],
    ['broken.yaml', 'schedules: [', /broken\.yaml: not YAML/],
    ['no-principal.yaml', 'schedules:\n  - id: a\n    every: 1000\n    tool: t\n', /schedules\.0\.principal/],
    [
      'bad-entry.yaml',
      'schedules:\n  - id: a\n    principal: p\n    cron: "61 * * * *"\n    tool: t\n',
      /schedule a: cron/,
    ],
    [
      'twice.yaml',
      'schedules:\n  - {id: a, principal: p, every: 1000, tool: t}\n  - {id: a, principal: q, every: 1000, tool: t}\n',
      /schedule a: id listed twice/,
    ],
    ['other.yaml', 'jobs: []\n', /schedules must be a list \(the file holds a top-level `schedules:` list\)/],
    ['extra.yaml', 'schedules: []\njobs: []\n', /unknown field jobs/],
  ])('%s stops the start with one line naming the file and the problem', async (name, text, message) => {
    const path = name === 'missing.yaml' ? join(dir, name) : file(name, text);
    const error = await readSchedulesFile(path).catch((e: unknown) => e as Error);
    expect(error).toBeInstanceOf(Error);
    expect((error as Error).message).toMatch(/^Invalid TASKRELAY_SCHEDULES_FILE /);
    expect((error as Error).message).toMatch(message);
    expect((error as Error).message).not.toMatch(/\n/);
  });
});
