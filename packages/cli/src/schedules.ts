/**
 * `taskrelay schedule add|list|pause|resume|rm` (docs/CLI.md, PROTOCOL.md §33.2): the gateway's schedules API beside
 * its MCP endpoint (`…/api/schedules`). Anyone's token manages its own schedules; an operator's sees every
 * principal's, and `add --principal P` creates one for P.
 */
import type { Command } from 'commander';
import { parseToolArguments, positiveInt } from './args.js';
import { UsageError } from './errors.js';
import { gatewayApi, type ApiOptions } from './operate.js';

/** A schedule as the API answers it (docs/HTTP.md). */
interface Schedule {
  id: string;
  principal: string;
  tool: string;
  arguments: Record<string, unknown>;
  cron?: string;
  tz?: string;
  every?: number;
  overlap: string;
  paused: boolean;
  next?: string;
  lastTaskId?: string;
  runs: number;
  skipped: number;
  lastError?: string;
}

interface AddOptions {
  cron?: string;
  tz?: string;
  every?: number;
  overlap?: string;
  webhook?: string;
  principal?: string;
}

const OVERLAPS = ['skip', 'queue', 'cancel'];

function row(s: Schedule): string {
  const when = s.cron !== undefined ? `cron "${s.cron}" ${s.tz ?? 'UTC'}` : `every ${s.every ?? '?'} ms`;
  const state = s.paused ? 'paused' : `next ${s.next ?? '-'}`;
  const last = s.lastTaskId === undefined ? '' : `  last ${s.lastTaskId}`;
  const error = s.lastError === undefined ? '' : `  error: ${s.lastError}`;
  return `${s.id}  ${s.principal}  ${s.tool}  ${when}  ${s.overlap}  ${state}  runs ${s.runs} skipped ${s.skipped}${last}${error}`;
}

export function addScheduleCommands(program: Command, globals: () => ApiOptions, write: (line: string) => void): void {
  const schedule = program.command('schedule').description('schedules: tool calls made on a cron pattern or interval');
  const show = (s: Schedule) => write(globals().json ? JSON.stringify({ type: 'schedule', ...s }) : row(s));
  schedule
    .command('add')
    .description('create a schedule (or replace the one with this id): ID TOOL [key=value ...]')
    .argument('<id>', 'its name: 1 to 48 of A-Z a-z 0-9 _ . -')
    .argument('<tool>', 'the tool each firing calls')
    .argument('[args...]', 'the tool arguments, key=value (a value is parsed as JSON when it parses)')
    .option('--cron <pattern>', 'cron pattern: 5 fields, or 6 with seconds first')
    .option('--tz <zone>', 'time zone of --cron (IANA, e.g. Europe/Paris); default UTC')
    .option('--every <ms>', 'instead of --cron: every this many ms (at least 1000)', positiveInt('--every'))
    .option('--overlap <policy>', 'while the previous run is on: skip (default), queue, or cancel it')
    .option('--webhook <url>', 'completion webhook of every task it creates')
    .option('--principal <name>', "whose schedule it is (an operator's token only)")
    .action(async (id: string, tool: string, pairs: string[], opts: AddOptions) => {
      if ((opts.cron === undefined) === (opts.every === undefined)) {
        throw new UsageError('schedule add takes one of --cron and --every');
      }
      if (opts.overlap !== undefined && !OVERLAPS.includes(opts.overlap)) {
        throw new UsageError(`--overlap must be one of ${OVERLAPS.join(', ')}, got "${opts.overlap}"`);
      }
      const body = {
        id,
        tool,
        arguments: parseToolArguments(pairs, 1),
        ...Object.fromEntries(Object.entries(opts).filter(([, v]) => v !== undefined)),
      };
      const { schedule: s } = await gatewayApi<{ schedule: Schedule }>(globals(), '/api/schedules', {
        method: 'POST',
        body,
      });
      show(s);
    });
  schedule
    .command('list')
    .description('list the schedules (an operator sees every principal’s)')
    .option('--principal <name>', "only this principal's (operators)")
    .action(async (opts: { principal?: string }) => {
      const query = opts.principal === undefined ? '' : `?principal=${encodeURIComponent(opts.principal)}`;
      const path = opts.principal === undefined ? '/api/schedules' : `/admin/api/schedules${query}`;
      const { schedules } = await gatewayApi<{ schedules: Schedule[] }>(globals(), path, {
        needs: "--principal needs an operator's token (TASKRELAY_OPERATORS)",
      });
      for (const s of schedules) show(s);
    });
  for (const action of ['pause', 'resume'] as const) {
    schedule
      .command(action)
      .description(action === 'pause' ? 'stop its firings until resumed' : 'fire again, from the next match')
      .argument('<id>')
      .action(async (id: string) => {
        const path = `/api/schedules/${encodeURIComponent(id)}/${action}`;
        const { schedule: s } = await gatewayApi<{ schedule: Schedule }>(globals(), path, { method: 'POST' });
        show(s);
      });
  }
  schedule
    .command('rm')
    .description('remove a schedule (the tasks it created stay)')
    .argument('<id>')
    .action(async (id: string) => {
      await gatewayApi(globals(), `/api/schedules/${encodeURIComponent(id)}`, { method: 'DELETE' });
      write(globals().json ? JSON.stringify({ type: 'removed', id }) : `schedule ${id} removed`);
    });
}
