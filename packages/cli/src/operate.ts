/**
 * What an operator does with ended work from the command line (docs/CLI.md, PROTOCOL.md §30): `list` with filters
 * (the gateway's task search) and `replay`. Both talk to the gateway's HTTP API beside its MCP endpoint, with the
 * token: an operator's sees every principal's tasks, anyone else's only their own.
 */
import { Option, type Command } from 'commander';
import { positiveInt } from './args.js';
import { UsageError } from './errors.js';

export interface ApiOptions {
  url: string;
  token?: string;
  json?: boolean;
}

/** The filters `list` and `replay` share, as the gateway's search takes them. */
export interface TaskFilters {
  status?: string;
  tool?: string;
  tag?: string;
  principal?: string;
  since?: string;
  until?: string;
}

/** A task as the search answers it (docs/HTTP.md). */
interface TaskSummary {
  taskId: string;
  tool: string;
  principal: string;
  status: string;
  createdAt: string;
  tags: string[];
  statusMessage?: string;
  error?: { code: string; message: string };
  replayOf?: string;
  replayedBy?: string;
}

const FILTER_NAMES = ['status', 'tool', 'tag', 'principal', 'since', 'until'] as const;

/** `7d`, `24h`, `30m`, `90s`: that long ago, as an ISO time; anything else is passed on as given (ISO or ms). */
export function timeArgument(value: string): string {
  const m = /^(\d+)([smhd])$/.exec(value.trim());
  if (!m) return value;
  const unit = { s: 1_000, m: 60_000, h: 3_600_000, d: 86_400_000 }[m[2] as 's' | 'm' | 'h' | 'd'];
  return new Date(Date.now() - Number(m[1]) * unit).toISOString();
}

/** Adds the filter options to a command. */
export function withFilters(command: Command): Command {
  return command
    .option('--status <list>', 'only these statuses (comma list: working,input_required,completed,failed,cancelled)')
    .option('--tool <name>', 'only this tool')
    .option('--tag <tag>', 'only tasks with this tag')
    .option('--principal <name>', "only this principal's tasks (operators)")
    .addOption(
      new Option('--since <time>', 'created since: ISO time, ms, or 7d / 24h / 30m ago').argParser(timeArgument),
    )
    .addOption(new Option('--until <time>', 'created until: the same forms').argParser(timeArgument));
}

/** The filters a command was given; none given is undefined. */
export function filtersOf(opts: Record<string, unknown>): TaskFilters | undefined {
  const picked = Object.fromEntries(FILTER_NAMES.flatMap((k) => (typeof opts[k] === 'string' ? [[k, opts[k]]] : [])));
  return Object.keys(picked).length > 0 ? picked : undefined;
}

/**
 * A request to the gateway's HTTP API beside its MCP endpoint (`…/mcp` → `…<path>`), with the token. A refusal says
 * what to do in one line; a body that is not JSON is the gateway's answer's problem, said as such.
 */
export async function gatewayApi<T>(
  options: ApiOptions,
  path: string,
  init: { method?: 'GET' | 'POST' | 'DELETE'; body?: unknown; needs?: string } = {},
): Promise<T> {
  if (!/\/mcp\/?$/.test(new URL(options.url).pathname)) {
    throw new UsageError(`--url must end in /mcp to find the gateway's HTTP API beside it (got ${options.url})`);
  }
  const url = options.url.replace(/\/mcp\/?$/, path);
  const headers: Record<string, string> = {};
  if (options.token !== undefined) headers['Authorization'] = `Bearer ${options.token}`;
  // The gateway takes an operator POST only as JSON (no cross-site form can send that): `{}` when there is nothing.
  const body = init.body ?? (init.method === 'POST' ? {} : undefined);
  if (body !== undefined) headers['Content-Type'] = 'application/json';
  const res = await fetch(url, {
    method: init.method ?? 'GET',
    headers,
    ...(body === undefined ? {} : { body: JSON.stringify(body) }),
  });
  const answer = (await res.json().catch(() => ({}))) as T & { error?: string };
  if (res.status === 401 || res.status === 403) {
    const why = init.needs ?? 'this needs a token the gateway accepts';
    throw new Error(`the gateway at ${options.url} refused this (HTTP ${res.status}): ${why}; pass --token`);
  }
  if (!res.ok) throw new Error(answer.error ?? `the gateway answered HTTP ${res.status}`);
  return answer;
}

function taskRow(t: TaskSummary): string {
  const tags = t.tags.length > 0 ? ` [${t.tags.join(', ')}]` : '';
  const links = `${t.replayOf ? ` (replays ${t.replayOf})` : ''}${t.replayedBy ? ` (replayed by ${t.replayedBy})` : ''}`;
  const why = t.error ? `  ${t.error.code}: ${t.error.message}` : t.statusMessage ? `  ${t.statusMessage}` : '';
  return `${t.taskId}  ${t.status.padEnd(14)} ${t.tool.padEnd(24)} ${t.principal.padEnd(12)} ${t.createdAt}${tags}${links}${why}`;
}

/** `taskrelay list --status … --tool …`: pages of the search, newest first, up to `max` tasks. */
export async function listFiltered(
  options: ApiOptions,
  filters: TaskFilters,
  max: number,
  write: (line: string) => void,
): Promise<void> {
  let printed = 0;
  let cursor: string | undefined;
  do {
    const query = new URLSearchParams({ ...filters, limit: String(Math.min(200, max - printed)) });
    if (cursor !== undefined) query.set('cursor', cursor);
    const page = await gatewayApi<{ tasks: TaskSummary[]; nextCursor?: string }>(
      options,
      `/api/tasks?${query.toString()}`,
    );
    for (const t of page.tasks) {
      write(options.json ? JSON.stringify({ type: 'task', task: t }) : taskRow(t));
      printed += 1;
    }
    cursor = page.nextCursor;
  } while (cursor !== undefined && printed < max);
}

/** `taskrelay replay ID` or `taskrelay replay --status failed …` (PROTOCOL.md §30.3). */
export function addReplayCommand(program: Command, globals: () => ApiOptions, write: (line: string) => void): void {
  const needs = "replaying needs an operator's token (TASKRELAY_OPERATORS)";
  withFilters(
    program
      .command('replay')
      .description('run ended tasks again as new tasks: one by id, or all that the filters select (operator token)')
      .argument('[id]', 'the task to replay'),
  )
    .option('--redrive', "reuse the original's completed ctx.step results: succeeded steps do not run again")
    .option('--dry-run', 'only count what the filters select')
    .option('--again', 'also replay tasks replayed before')
    .action(async (id: string | undefined, opts: Record<string, unknown>) => {
      const options = globals();
      const filters = filtersOf(opts);
      const redrive = opts['redrive'] === true;
      if (id !== undefined) {
        if (filters !== undefined || opts['dryRun'] === true || opts['again'] === true) {
          throw new UsageError('replay takes a task id or filters, not both');
        }
        const { task } = await gatewayApi<{ task: { taskId: string; status: string } }>(
          options,
          `/admin/api/tasks/${encodeURIComponent(id)}/replay`,
          { method: 'POST', body: { redrive }, needs },
        );
        write(options.json ? JSON.stringify({ type: 'replay', from: id, task }) : `${id} replayed as ${task.taskId}`);
        return;
      }
      if (filters === undefined) throw new UsageError('replay needs a task id, or filters such as --status failed');
      const outcome = await gatewayApi<{
        matched: number;
        skipped: number;
        truncated: boolean;
        replayed: Array<{ from: string; to: string }>;
        failed: Array<{ from: string; error: string }>;
      }>(options, '/admin/api/tasks/replay', {
        method: 'POST',
        body: { ...filters, redrive, dryRun: opts['dryRun'] === true, again: opts['again'] === true },
        needs,
      });
      if (options.json) {
        write(JSON.stringify({ type: 'replay', ...outcome }));
        return;
      }
      for (const r of outcome.replayed) write(`${r.from} replayed as ${r.to}`);
      for (const f of outcome.failed) write(`${f.from} not replayed: ${f.error}`);
      const more = outcome.truncated ? ' (stopped at 1,000: more match)' : '';
      const skipped = outcome.skipped > 0 ? `, ${outcome.skipped} replayed before (--again replays them too)` : '';
      write(
        opts['dryRun'] === true
          ? `${outcome.matched} task(s) would be replayed${skipped}${more}`
          : `${outcome.replayed.length} of ${outcome.matched} replayed${skipped}${more}`,
      );
    });
}

/** A kept log line as the gateway answers it (PROTOCOL.md §30.4). */
interface KeptLine {
  id: string;
  time: string;
  level?: string;
  msg?: string;
  attempt?: number;
  [field: string]: unknown;
}

const ENDED = new Set(['completed', 'failed', 'cancelled']);
const FOLLOW_EVERY_MS = 1_000;

function logRow(line: KeptLine): string {
  const { id: _id, time, level, msg, attempt, ...fields } = line;
  const extra = Object.keys(fields).length > 0 ? ` ${JSON.stringify(fields)}` : '';
  return `${time} ${String(level ?? '')
    .toUpperCase()
    .padEnd(5)} [run ${attempt ?? '?'}] ${msg ?? ''}${extra}`;
}

/** `taskrelay logs ID [--follow]`: the task's kept `ctx.log` lines; following asks again every second until it ends. */
export function addLogsCommand(program: Command, globals: () => ApiOptions, write: (line: string) => void): void {
  program
    .command('logs')
    .description("print a task's kept log lines (its tool's ctx.log, each run's); --follow until the task ends")
    .argument('<id>', 'task id')
    .option('--follow', 'keep printing new lines until the task has ended')
    .action(async (id: string, opts: { follow?: boolean }) => {
      const options = globals();
      let after: string | undefined;
      for (;;) {
        const query = new URLSearchParams({ limit: '1000', ...(after === undefined ? {} : { after }) });
        const page = await gatewayApi<{ status: string; lines: KeptLine[]; last: string | null }>(
          options,
          `/api/tasks/${encodeURIComponent(id)}/logs?${query.toString()}`,
          { needs: "reading a task's logs needs its owner's token or an operator's" },
        );
        for (const line of page.lines) write(options.json ? JSON.stringify({ type: 'log', line }) : logRow(line));
        after = page.last ?? after;
        if (opts.follow !== true || (ENDED.has(page.status) && page.lines.length === 0)) return;
        if (page.lines.length < 1000) await new Promise((r) => setTimeout(r, FOLLOW_EVERY_MS));
      }
    });
}

/** `taskrelay webhooks dead` and `taskrelay webhooks resend ID|--all` (PROTOCOL.md §27.6; operator token). */
export function addWebhookCommands(program: Command, globals: () => ApiOptions, write: (line: string) => void): void {
  const needs = "dead webhooks need an operator's token (TASKRELAY_OPERATORS)";
  const webhooks = program.command('webhooks').description('dead webhook events: list them, send them again');
  webhooks
    .command('dead')
    .description('list the newest dead webhook events (operator token)')
    .option('--limit <n>', 'at most N', positiveInt('--limit', 1_000), 50)
    .action(async (opts: { limit: number }) => {
      const options = globals();
      const { deadLetters } = await gatewayApi<{ deadLetters: Array<Record<string, unknown>> }>(
        options,
        `/admin/api/webhooks/dead?limit=${opts.limit}`,
        { needs },
      );
      for (const d of deadLetters) {
        const at = new Date(Number(d['deadAt'])).toISOString();
        write(
          options.json
            ? JSON.stringify({ type: 'deadWebhook', ...d })
            : `${text(d['id'])}  ${text(d['status'])}  ${text(d['url'])}  dead ${at}: ${text(d['reason'])}`,
        );
      }
    });
  webhooks
    .command('resend')
    .description('send a dead webhook event again, or --all of them (operator token)')
    .argument('[id]', 'the dead event id (msg_…)')
    .option('--all', 'every dead event, newest first')
    .action(async (id: string | undefined, opts: { all?: boolean }) => {
      const options = globals();
      if ((id === undefined) === (opts.all !== true))
        throw new UsageError('webhooks resend takes an event id or --all');
      const path =
        id === undefined
          ? '/admin/api/webhooks/dead/resend'
          : `/admin/api/webhooks/dead/${encodeURIComponent(id)}/resend`;
      const { resent } = await gatewayApi<{ resent: string[] }>(options, path, { method: 'POST', needs });
      write(options.json ? JSON.stringify({ type: 'resent', resent }) : `${resent.length} webhook event(s) due again`);
    });
}

const text = (v: unknown) => (typeof v === 'string' ? v : '');
