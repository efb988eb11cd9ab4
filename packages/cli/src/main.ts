#!/usr/bin/env node
/**
 * `taskrelay`: the command line for a taskrelay gateway (docs/CLI.md). Live bars on a TTY, plain lines otherwise,
 * JSON lines with `--json`. Exit codes: 0 completed, 1 failed or `isError`, 2 usage error, 130 cancelled.
 */
import { Command, CommanderError, Option } from 'commander';
import { ListToolsResultSchema, type Task } from '@modelcontextprotocol/sdk/types.js';
import { positiveInt, parseToolArguments } from './args.js';
import { startCall, watchTask, type Run } from './calls.js';
import { connect, type Connection } from './connection.js';
import { terminalElicitation } from './elicit.js';
import {
  addLogsCommand,
  addReplayCommand,
  addWebhookCommands,
  filtersOf,
  gatewayApi,
  listFiltered,
  withFilters,
} from './operate.js';
import { addScheduleCommands } from './schedules.js';
import { EXIT, UsageError, explainFailure, worstExit, type ExitCode } from './errors.js';
import {
  SILENT_VIEW,
  createReporter,
  outcomeLine,
  resultText,
  taskLine,
  type CallView,
  type OutputMode,
  type Outcome,
} from './output.js';

const DEFAULT_URL = 'http://127.0.0.1:3000/mcp';
/** After Ctrl-C, how long the cancels may take before the CLI exits anyway. */
const CANCEL_WAIT_MS = 10_000;

interface GlobalOptions {
  url: string;
  token?: string;
  json?: boolean;
}

const out = process.stdout;

/** `_meta` key of a tool's controls in `tools/list` (the gateway's TOOL_CONTROLS_META, docs/MCP.md). */
const TOOL_CONTROLS_META = 'dev.taskrelay/controls';

/** What controls a tool's runs, as `taskrelay tools` prints it before the description: `[paused, ≤3, 10/1000ms] `. */
function controlsText(raw: unknown): string {
  if (typeof raw !== 'object' || raw === null) return '';
  const c = raw as {
    paused?: unknown;
    priority?: unknown;
    concurrency?: unknown;
    concurrencyKey?: unknown;
    rateLimit?: { max?: unknown; perMs?: unknown; key?: unknown; name?: unknown };
  };
  const per = (key: unknown) => (Array.isArray(key) ? ` per ${key.map(String).join(', ')}` : '');
  const parts: string[] = [];
  if (c.paused === true) parts.push('paused');
  if (typeof c.priority === 'number') parts.push(`priority ${c.priority}`);
  if (typeof c.concurrency === 'number') parts.push(`at most ${c.concurrency} at once${per(c.concurrencyKey)}`);
  if (typeof c.rateLimit?.max === 'number' && typeof c.rateLimit.perMs === 'number') {
    const shared = typeof c.rateLimit.name === 'string' ? ` (shared: ${c.rateLimit.name})` : '';
    parts.push(`${c.rateLimit.max} per ${c.rateLimit.perMs} ms${per(c.rateLimit.key)}${shared}`);
  }
  return parts.length > 0 ? `[${parts.join(', ')}] ` : '';
}

/** A tool as the gateway's admin API answers it (docs/HTTP.md). */
interface AdminToolView {
  name: string;
  paused: boolean;
  active: number;
  waiting: number;
}

/** POSTs to the gateway's admin API beside its MCP endpoint (`…/mcp` → `…/admin`), with the token. */
async function adminPost(options: GlobalOptions, path: string): Promise<AdminToolView> {
  const body = await gatewayApi<{ tool?: AdminToolView }>(options, `/admin${path}`, {
    method: 'POST',
    needs: "pausing a tool needs an operator's token (TASKRELAY_OPERATORS)",
  });
  if (!body.tool) throw new Error('the gateway answered without the tool');
  return body.tool;
}

function mode(options: GlobalOptions): OutputMode {
  if (options.json) return 'json';
  return out.isTTY ? 'tty' : 'plain';
}

function exitCodeOf(outcome: Outcome): ExitCode {
  // Cancelled, or (watch) stopped watching at Ctrl-C: interrupted either way.
  if (outcome.status === 'cancelled' || outcome.status === 'stopped') return EXIT.cancelled;
  return outcome.status === 'failed' || outcome.result?.isError ? EXIT.failed : EXIT.ok;
}

async function withConnection<T>(options: GlobalOptions, use: (c: Connection) => Promise<T>): Promise<T> {
  const interactive = mode(options) === 'tty' && process.stdin.isTTY;
  const connection = await connect({
    url: options.url,
    token: options.token,
    ...(interactive ? { elicit: terminalElicitation(process.stdin, out) } : {}),
  });
  try {
    return await use(connection);
  } finally {
    await connection.close();
  }
}

function writeJson(line: Record<string, unknown>): void {
  out.write(`${JSON.stringify(line)}\n`);
}

function printTask(options: GlobalOptions, task: Task): void {
  if (options.json) writeJson({ type: 'task', task });
  else out.write(`${taskLine(task)}\n`);
}

/**
 * Runs calls to the end with one view each. The first Ctrl-C cancels them all and waits (bounded) for the cancels to
 * be acknowledged; a second exits at once.
 */
async function runAll(options: GlobalOptions, labels: string[], start: (n: number, view: CallView) => Run) {
  const reporter = createReporter(mode(options), out, labels.length);
  const runs: Run[] = [];
  let interrupted = false;
  const onSigint = () => {
    if (interrupted) process.exit(EXIT.cancelled);
    interrupted = true;
    const cancels = Promise.allSettled(runs.map((run) => run.cancel()));
    const timer = setTimeout(() => process.exit(EXIT.cancelled), CANCEL_WAIT_MS);
    void cancels.finally(() => clearTimeout(timer));
  };
  process.on('SIGINT', onSigint);
  try {
    for (const [i, label] of labels.entries()) runs.push(start(i + 1, reporter.open(i + 1, label)));
    let outcomes: Awaited<Run['done']>[];
    try {
      outcomes = await Promise.all(runs.map((run) => run.done));
    } catch (error) {
      // After Ctrl-C a run may end by rejecting (its result stream cut by the cancel): the user cancelled, so 130.
      if (interrupted) return EXIT.cancelled;
      throw error;
    }
    reporter.close();
    if (mode(options) === 'tty') for (const [i, o] of outcomes.entries()) out.write(`#${i + 1} ${outcomeLine(o)}\n`);
    const code = worstExit(outcomes.map(exitCodeOf));
    return interrupted ? EXIT.cancelled : code;
  } finally {
    reporter.close();
    process.off('SIGINT', onSigint);
  }
}

function buildProgram(setExit: (code: ExitCode) => void): Command {
  const program = new Command('taskrelay')
    .description('Call tools on a taskrelay gateway and follow their tasks.')
    .addOption(new Option('--url <url>', 'gateway MCP endpoint').env('TASKRELAY_URL').default(DEFAULT_URL))
    .addOption(new Option('--token <token>', 'bearer token').env('TASKRELAY_TOKEN'))
    .option('--json', 'one JSON object per line')
    .showHelpAfterError(false)
    .exitOverride()
    .configureOutput({ writeErr: () => undefined });
  const globals = () => program.opts<GlobalOptions>();
  addToolCommands(program, globals);
  addCallCommands(program, globals, setExit);
  addTaskCommands(program, globals, setExit);
  const writeLine = (line: string) => out.write(`${line}\n`);
  addReplayCommand(program, globals, writeLine);
  addLogsCommand(program, globals, writeLine);
  addWebhookCommands(program, globals, writeLine);
  addScheduleCommands(program, globals, writeLine);
  return program;
}

/** `tools`, and the incident switch: `pause` and `resume`. */
function addToolCommands(program: Command, globals: () => GlobalOptions): void {
  program
    .command('tools')
    .description('list the tools served by live workers')
    .action(async () => {
      const options = globals();
      await withConnection(options, async ({ client }) => {
        const { tools } = await client.request({ method: 'tools/list', params: {} }, ListToolsResultSchema);
        for (const tool of tools) {
          if (options.json) writeJson({ type: 'tool', tool });
          else {
            const support = tool.execution?.taskSupport ?? 'forbidden';
            const controls = controlsText(tool._meta?.[TOOL_CONTROLS_META]);
            out.write(`${tool.name.padEnd(24)} ${support.padEnd(9)} ${controls}${tool.description ?? ''}\n`);
          }
        }
      });
    });

  // The incident switch (docs/CLI.md): an operator pauses a tool's queues; calls are still accepted and queued.
  for (const action of ['pause', 'resume'] as const) {
    program
      .command(`${action} <tool>`)
      .description(
        action === 'pause'
          ? 'pause a tool: its calls are queued, nothing new starts (operator token)'
          : 'resume a paused tool: its queued calls start (operator token)',
      )
      .action(async (tool: string) => {
        const options = globals();
        const view = await adminPost(options, `/api/tools/${encodeURIComponent(tool)}/${action}`);
        if (options.json) writeJson({ type: 'tool', tool: view });
        else
          out.write(
            `${tool}: ${action === 'pause' ? 'paused' : 'resumed'} (${view.waiting} queued, ${view.active} running)\n`,
          );
      });
  }
}

interface CallOptions {
  task?: boolean;
  ttl?: number;
  parallel: number;
  startAt?: string;
}

/** `--start-at`: `30s`, `5m`, `2h`, `1d` from now, as an ISO time; anything else is sent as given (the gateway checks it). */
function startAtArgument(value: string): string {
  const m = /^(\d+)([smhd])$/.exec(value.trim());
  if (!m) return value;
  const unit = { s: 1_000, m: 60_000, h: 3_600_000, d: 86_400_000 }[m[2] as 's' | 'm' | 'h' | 'd'];
  return new Date(Date.now() + Number(m[1]) * unit).toISOString();
}

/** `call` and `watch`: calls and tasks followed to their end, one view each. */
function addCallCommands(program: Command, globals: () => GlobalOptions, setExit: (code: ExitCode) => void): void {
  program
    .command('call')
    .description('call a tool; key=value arguments (values parsed as JSON when they parse; {i} = call number)')
    .argument('<tool>', 'tool name')
    .argument('[args...]', 'key=value arguments')
    .option('--task', 'call as a task (params.task): survives disconnects, cancellable with tasks/cancel')
    .option('--ttl <ms>', 'task ttl in ms (implies --task)', positiveInt('--ttl'))
    .option('--parallel <n>', 'run N calls at once, each with its own bar', positiveInt('--parallel'), 1)
    .addOption(
      new Option('--start-at <time>', 'start at an ISO time, or in 30s / 5m / 2h / 1d (implies --task)').argParser(
        startAtArgument,
      ),
    )
    .action(async (tool: string, pairs: string[], opts: CallOptions) => {
      const options = globals();
      const labels = Array.from({ length: opts.parallel }, () => tool);
      const specs = labels.map((_, i) => ({
        tool,
        args: parseToolArguments(pairs, i + 1),
        task: opts.task === true || opts.ttl !== undefined || opts.startAt !== undefined,
        ttlMs: opts.ttl,
        startAt: opts.startAt,
      }));
      await withConnection(options, async ({ client }) => {
        // A tool that requires a task runs as one, as the Inspector does, instead of failing with -32601.
        if (!specs[0]?.task) {
          const { tools } = await client.request({ method: 'tools/list', params: {} }, ListToolsResultSchema);
          if (tools.find((t) => t.name === tool)?.execution?.taskSupport === 'required') {
            for (const spec of specs) spec.task = true;
          }
        }
        setExit(await runAll(options, labels, (n, view) => startCall(client, specs[n - 1]!, view)));
      });
    });

  program
    .command('watch')
    .description('follow tasks until they end (Ctrl-C stops watching; the tasks go on)')
    .argument('<ids...>', 'task ids')
    .action(async (ids: string[]) => {
      const options = globals();
      await withConnection(options, async ({ client }) => {
        setExit(await runAll(options, ids, (n, view) => watchTask(client, ids[n - 1]!, view)));
      });
    });
}

/** One task at a time, and the caller's list: `get`, `result`, `cancel`, `list`. */
function addTaskCommands(program: Command, globals: () => GlobalOptions, setExit: (code: ExitCode) => void): void {
  program
    .command('get')
    .description("print a task's status")
    .argument('<id>', 'task id')
    .action(async (id: string) => {
      const options = globals();
      await withConnection(options, async ({ client }) =>
        printTask(options, await client.experimental.tasks.getTask(id)),
      );
    });

  program
    .command('result')
    .description("wait for a task's result and print it")
    .argument('<id>', 'task id')
    .action(async (id: string) => {
      const options = globals();
      await withConnection(options, async ({ client }) => {
        // A watch that shows nothing until the end: same exit codes as `call`.
        const outcome = await watchTask(client, id, SILENT_VIEW).done;
        if (options.json) writeJson({ type: 'result', status: outcome.status, taskId: id, result: outcome.result });
        else out.write(`${resultText(outcome.result) || outcomeLine(outcome)}\n`);
        setExit(exitCodeOf(outcome));
      });
    });

  program
    .command('cancel')
    .description('cancel a task')
    .argument('<id>', 'task id')
    .action(async (id: string) => {
      const options = globals();
      await withConnection(options, async ({ client }) => {
        const task = await client.experimental.tasks.cancelTask(id);
        printTask(options, task);
      });
    });

  withFilters(
    program
      .command('list')
      .description(
        "list the caller's tasks; with filters, the gateway's search: an operator's token lists every principal's",
      ),
  )
    .option('--limit <n>', 'with filters: at most N tasks, newest first', positiveInt('--limit'), 100)
    .action(async (opts: Record<string, unknown> & { limit: number }) => {
      const options = globals();
      const filters = filtersOf(opts);
      if (filters !== undefined) {
        await listFiltered(options, filters, opts.limit, (line) => out.write(`${line}\n`));
        return;
      }
      await withConnection(options, async ({ client }) => {
        if (client.getServerCapabilities()?.tasks?.list === undefined) {
          throw new Error(
            'this gateway does not offer tasks/list: it lists tasks only with authentication on (TASKRELAY_AUTH_TOKENS or OAuth), so pass --token; without it, use `taskrelay get ID` for a task you know',
          );
        }
        let cursor: string | undefined;
        do {
          const page = await client.experimental.tasks.listTasks(cursor);
          for (const task of page.tasks) printTask(options, task);
          cursor = page.nextCursor;
        } while (cursor !== undefined);
      });
    });
}

async function main(): Promise<ExitCode> {
  // `taskrelay list | head`: the reader went away; stop quietly, as other Unix tools do.
  for (const stream of [process.stdout, process.stderr]) {
    stream.on('error', (error: NodeJS.ErrnoException) => {
      if (error.code === 'EPIPE') process.exit(EXIT.ok);
      throw error;
    });
  }
  let code: ExitCode = EXIT.ok;
  const program = buildProgram((c) => (code = c));
  if (process.argv.length <= 2) {
    process.stderr.write(`${program.helpInformation()}`);
    return EXIT.usage;
  }
  try {
    await program.parseAsync(process.argv);
  } catch (error) {
    if (error instanceof CommanderError) {
      if (error.code === 'commander.helpDisplayed' || error.code === 'commander.version') return EXIT.ok;
      process.stderr.write(`taskrelay: ${error.message.replace(/^error: /, '')}\n`);
      return EXIT.usage;
    }
    if (error instanceof UsageError) {
      process.stderr.write(`taskrelay: ${error.message}\n`);
      return EXIT.usage;
    }
    const { url, token } = program.opts<GlobalOptions>();
    process.stderr.write(`taskrelay: ${explainFailure(error, { url, token })}\n`);
    return EXIT.failed;
  }
  return code;
}

main().then(
  (code) => process.exit(code),
  (error: unknown) => {
    process.stderr.write(`taskrelay: ${String(error)}\n`);
    process.exit(EXIT.failed);
  },
);
