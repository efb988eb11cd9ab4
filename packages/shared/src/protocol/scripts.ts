/**
 * taskrelay's Lua scripts, kept as files the way BullMQ keeps its commands (PROTOCOL.md §20): `commands/<name>-<numKeys>.lua`,
 * each with a header listing every KEYS and ARGV entry and its output, and `--- @include "<name>"` lines for the
 * shared parts. Includes come from `commands/includes/<name>.lua` or are generated here from the TS vocabulary (the
 * transition table, the result codes, the hash field names, BullMQ's key layout), so Lua never restates them.
 *
 * Each script is declared once below with the names of its keys and arguments; callers pass objects, which `call`
 * maps to KEYS and ARGV in that order. Loading checks the file's header and body against the declaration, so a
 * header that lists eleven ARGV while the code reads a twelfth fails at the first load, not in production.
 */
import { createHash } from 'node:crypto';
import { readFileSync } from 'node:fs';
import type { Cluster, Redis } from 'ioredis';
import { TaskrelayError } from './errors.js';
import { BATCH_FIELDS, batchFieldsLua } from './batch-fields.js';
import { bullmqLayoutLua } from './bullmq-layout.js';
import { ResultCode, decodeReply, resultCodesLua, type ScriptReply } from './script-results.js';
import { TASK_FIELDS, TASK_FIELD_PREFIXES } from './task-fields.js';
import { WEBHOOK_EVENT_FIELDS, webhookLimitsLua } from './webhook-limits.js';
import { coalesceWrites } from './write-coalescing.js';
import { TASK_STATUSES, TERMINAL_STATUSES, allowedSources } from './task-model.js';

/** One script: its file is `commands/<name>-<keys.length>.lua`. */
export interface ScriptSpec<K extends string = string, A extends string = string> {
  readonly name: string;
  /** KEYS, in order. */
  readonly keys: readonly K[];
  /** ARGV, in order. */
  readonly args: readonly A[];
  /** The result codes it may answer with. */
  readonly codes: readonly ResultCode[];
}

function spec<const K extends string, const A extends string>(s: ScriptSpec<K, A>): ScriptSpec<K, A> {
  return s;
}

const { OK, TASK_MISSING, LOCK_LOST, TRANSITION_REFUSED, TASK_TERMINAL } = ResultCode;

/** Every script the task store runs. */
export const SCRIPTS = {
  create: spec({
    name: 'create',
    keys: ['task', 'principalIndex', 'live', 'idempotency', 'share', 'openTasks', 'taskIndex', 'arguments'],
    args: [
      'fieldCount',
      'createdAtMs',
      'taskId',
      'firstLookAtMs',
      'indexed',
      'indexCap',
      'indexTtlMs',
      'hasIdempotency',
      'taskKeyPrefix',
      'shareTtlMs',
      'maxPriority',
      'openMax',
      'openTtlMs',
      'priorityBase',
      'dedupeTtlMs',
      'arguments',
      'replayOf',
      'fields',
    ],
    codes: [OK, ResultCode.TASK_EXISTS, ResultCode.IDEMPOTENT_REPLAY, ResultCode.OPEN_CAP],
  }),
  transition: spec({
    name: 'transition',
    keys: ['task', 'live', 'lock', 'webhookDue', 'webhookPending', 'webhookDead', 'retention'],
    args: [
      'to',
      'now',
      'fieldCount',
      'lockToken',
      'channelPrefix',
      'channelSuffix',
      'ackTo',
      'deadlineAt',
      'dropIdempotency',
      'eventOutcome',
      'webhookPrefix',
      'publish',
      'fields',
    ],
    codes: [OK, TASK_MISSING, LOCK_LOST, TASK_TERMINAL, TRANSITION_REFUSED],
  }),
  progress: spec({
    name: 'progress',
    keys: ['task', 'lock'],
    args: [
      'progress',
      'total',
      'message',
      'now',
      'channelPrefix',
      'channelSuffix',
      'lockToken',
      'backlogPrefix',
      'backlogSuffix',
      'publish',
    ],
    codes: [OK, TASK_MISSING, LOCK_LOST, TASK_TERMINAL, ResultCode.PROGRESS_STALE],
  }),
  log: spec({
    name: 'log',
    keys: ['task', 'lock'],
    args: [
      'level',
      'data',
      'logger',
      'channelPrefix',
      'channelSuffix',
      'lockToken',
      'backlogPrefix',
      'backlogSuffix',
      'publish',
    ],
    codes: [OK, TASK_MISSING, LOCK_LOST, TASK_TERMINAL, ResultCode.UNROUTED, ResultCode.CHANNEL_FULL],
  }),
  startRun: spec({
    name: 'startRun',
    keys: ['task', 'lock', 'share'],
    args: ['lockToken', 'deadlineAt', 'now', 'attempt', 'jobId', 'toolVersion', 'deferIfOther', 'reset', 'brief'],
    codes: [OK, TASK_MISSING, LOCK_LOST, ResultCode.VERSION_OTHER],
  }),
  becomeTask: spec({
    name: 'becomeTask',
    keys: ['task', 'principalIndex', 'taskIndex'],
    args: ['ttl', 'indexCap', 'indexTtlMs', 'taskId', 'createdAtMs'],
    codes: [OK, TASK_MISSING, TASK_TERMINAL],
  }),
  routeCall: spec({
    name: 'routeCall',
    keys: ['task'],
    args: ['gatewayId', 'progressToken'],
    codes: [OK, TASK_MISSING, TASK_TERMINAL],
  }),
  watch: spec({
    name: 'watch',
    keys: ['task'],
    args: ['gatewayId', 'inlineMax'],
    codes: [OK, TASK_MISSING],
  }),
  reap: spec({
    name: 'reap',
    keys: ['live', 'lease', 'webhookDue', 'webhookPending', 'webhookDead', 'retention'],
    args: [
      'nowMs',
      'now',
      'batch',
      'lookAgainMs',
      'taskKeyPrefix',
      'queueKeyPrefix',
      'channelPrefix',
      'channelSuffix',
      'holder',
      'leaseMs',
      'webhookPrefix',
      'publish',
    ],
    codes: [OK, ResultCode.LEASE_HELD],
  }),
  backlogAck: spec({
    name: 'backlogAck',
    keys: ['backlog'],
    args: ['read', 'max', 'ttlMs', 'reset'],
    codes: [OK],
  }),
  webhookClaim: spec({
    name: 'webhookClaim',
    keys: ['due'],
    args: [
      'batch',
      'leaseMs',
      'holder',
      'eventPrefix',
      'perPrincipal',
      'inFlight',
      'scan',
      'reserve',
      'blocked',
      'deferMax',
      'probes',
      'trusted',
    ],
    codes: [OK],
  }),
  webhookSettle: spec({
    name: 'webhookSettle',
    keys: ['due', 'pending', 'dead'],
    args: ['eventPrefix', 'id', 'lease', 'outcome', 'delayMs', 'reason'],
    codes: [OK, ResultCode.LEASE_HELD],
  }),
  read: spec({
    name: 'read',
    keys: ['task'],
    args: ['inlineMax'],
    codes: [OK],
  }),
  list: spec({
    name: 'list',
    keys: ['index'],
    args: ['cursorScore', 'cursorId', 'limit'],
    codes: [OK],
  }),
  suspend: spec({
    name: 'suspend',
    keys: ['task', 'lock', 'webhookDue', 'webhookPending', 'webhookDead'],
    args: [
      'lockToken',
      'requests',
      'now',
      'deadlineAt',
      'channelPrefix',
      'channelSuffix',
      'webhookPrefix',
      'statusMessage',
      'publish',
    ],
    codes: [OK, TASK_MISSING, LOCK_LOST, TASK_TERMINAL, TRANSITION_REFUSED],
  }),
  answer: spec({
    name: 'answer',
    keys: ['task'],
    args: ['n', 'answer', 'now', 'deadlineAt', 'channelPrefix', 'channelSuffix', 'publish'],
    codes: [OK, TASK_MISSING, ResultCode.INPUT_NOT_PENDING],
  }),
  setState: spec({
    name: 'setState',
    keys: ['task', 'lock'],
    args: ['lockToken', 'field', 'json'],
    codes: [OK, TASK_MISSING, LOCK_LOST, TASK_TERMINAL],
  }),
  fairEnter: spec({
    name: 'fairEnter',
    keys: ['share'],
    args: ['jobId', 'ttlMs', 'maxPriority', 'priorityBase'],
    codes: [OK],
  }),
  batchCreate: spec({
    name: 'batchCreate',
    keys: ['batch', 'items', 'lock', 'task'],
    args: ['lockToken', 'fields', 'items', 'ttlMs'],
    codes: [OK, ResultCode.BATCH_EXISTS, TASK_MISSING, TASK_TERMINAL, LOCK_LOST],
  }),
  batchStart: spec({
    name: 'batchStart',
    keys: ['task', 'batch', 'outcomes', 'running', 'lock'],
    args: ['lockToken', 'index'],
    codes: [OK, TASK_MISSING, TASK_TERMINAL, ResultCode.OUTCOME_RECORDED, LOCK_LOST],
  }),
  batchRecord: spec({
    name: 'batchRecord',
    keys: ['batch', 'outcomes', 'open', 'running', 'lock', 'principalOpen'],
    args: ['lockToken', 'index', 'childId', 'failed', 'outcome'],
    codes: [OK, ResultCode.OUTCOME_RECORDED, TASK_MISSING, LOCK_LOST],
  }),
  batchRelease: spec({
    name: 'batchRelease',
    keys: ['batch', 'open', 'share', 'principalOpen'],
    args: [
      'parentId',
      'indices',
      'release',
      'concurrency',
      'cap',
      'nowMs',
      'openWorkTtlMs',
      'shareTtlMs',
      'maxPriority',
      'queueKey',
      'priorityBase',
      'enter',
    ],
    codes: [OK],
  }),
  batchClaim: spec({
    name: 'batchClaim',
    keys: ['lock', 'claim'],
    args: ['lockToken', 'outcome', 'ttlMs'],
    codes: [OK, LOCK_LOST],
  }),
  batchPeek: spec({
    name: 'batchPeek',
    keys: ['batch', 'open'],
    args: [],
    codes: [OK, TASK_MISSING],
  }),
  webhookResend: spec({
    name: 'webhookResend',
    keys: ['due', 'pending', 'dead'],
    args: ['eventPrefix', 'id', 'max'],
    codes: [OK],
  }),
  logKeep: spec({
    name: 'logKeep',
    keys: ['task', 'logs'],
    args: ['maxLen', 'lines'],
    codes: [OK, ResultCode.TASK_MISSING],
  }),
  waitpointOpen: spec({
    name: 'waitpointOpen',
    keys: ['task', 'lock'],
    args: ['lockToken', 'field', 'token', 'timeoutMs'],
    codes: [OK, ResultCode.TASK_MISSING, ResultCode.TASK_TERMINAL, ResultCode.LOCK_LOST],
  }),
  waitpointResolve: spec({
    name: 'waitpointResolve',
    keys: ['task'],
    args: ['field', 'token', 'value'],
    codes: [
      OK,
      ResultCode.TASK_MISSING,
      ResultCode.TASK_TERMINAL,
      ResultCode.WAITPOINT_UNKNOWN,
      ResultCode.WAITPOINT_USED,
      ResultCode.WAITPOINT_EXPIRED,
    ],
  }),
  tag: spec({
    name: 'tag',
    keys: ['task', 'lock'],
    args: ['lockToken', 'tags', 'max'],
    codes: [OK, ResultCode.LIMIT_FULL, ResultCode.TASK_MISSING, ResultCode.TASK_TERMINAL, ResultCode.LOCK_LOST],
  }),
  slotTake: spec({
    name: 'slotTake',
    keys: ['slots', 'waiting', 'waitingBy'],
    args: ['holder', 'limit', 'leaseMs', 'waiter', 'mode', 'principal'],
    codes: [OK, ResultCode.LIMIT_FULL],
  }),
  slotRelease: spec({
    name: 'slotRelease',
    keys: ['slots', 'waiting', 'waitingBy'],
    args: ['holder', 'limit', 'waiter'],
    codes: [OK],
  }),
  rateTake: spec({
    name: 'rateTake',
    keys: ['starts', 'hold'],
    args: ['start', 'max', 'perMs'],
    codes: [OK, ResultCode.LIMIT_FULL],
  }),
  rateHold: spec({
    name: 'rateHold',
    keys: ['hold'],
    args: ['ms'],
    codes: [OK],
  }),
  outputWrite: spec({
    name: 'outputWrite',
    keys: ['task', 'lock', 'output'],
    args: ['lockToken', 'mode', 'chunk', 'maxBytes', 'ttlMs', 'channel', 'taskId', 'publish'],
    codes: [OK, TASK_MISSING, TASK_TERMINAL, LOCK_LOST],
  }),
  blobPut: spec({
    name: 'blobPut',
    keys: ['task', 'lock', 'blobs', 'blob', 'principalBytes'],
    args: [
      'lockToken',
      'blobId',
      'chunk',
      'append',
      'meta',
      'taskMax',
      'principalMax',
      'ttlMs',
      'channel',
      'taskId',
      'externalBytes',
      'publish',
    ],
    codes: [OK, ResultCode.LIMIT_FULL, TASK_MISSING, TASK_TERMINAL, LOCK_LOST],
  }),
} as const;

export type ScriptName = keyof typeof SCRIPTS;

/**
 * A script's inputs, by name: what `call` turns into KEYS and ARGV. A list is spread in place, one ARGV entry per
 * item: a script's last argument may be a list (`create`'s hash fields), read with `unpack(ARGV, i, j)`.
 */
export interface ScriptInput<S extends ScriptSpec> {
  keys: Record<S['keys'][number], string>;
  args: Record<S['args'][number], ScriptArg>;
}

type ScriptArg = string | number | Buffer | readonly string[];

function argvOf(names: readonly string[], args: Record<string, ScriptArg>): Array<string | number | Buffer> {
  return names.flatMap((a): Array<string | number | Buffer> => {
    const value = args[a] ?? '';
    return Array.isArray(value) ? [...(value as readonly string[])] : [value as string | number | Buffer];
  });
}

/** Where the script files are: beside this module, in the sources and in dist alike (the build copies them). */
const COMMANDS_DIR = new URL('./commands/', import.meta.url);

/**
 * The transition table and the terminal set as Lua, from `allowedSources()`: what every status write checks. Written
 * as two functions of comparisons, not tables: Lua builds a script's tables on every call, and the seven of a
 * transition table cost Redis about 1.3 µs more per script call than these (measured, issue 46).
 */
export function transitionsLua(): string {
  const lua = (s: string) => JSON.stringify(s);
  const anyOf = (name: string, values: readonly string[]) =>
    values.length === 0 ? 'false' : values.map((v) => `${name} == ${lua(v)}`).join(' or ');
  const moves = TASK_STATUSES.map((to) => `  if to == ${lua(to)} then return ${anyOf('from', allowedSources(to))} end`);
  return [
    `local function is_terminal(status) return ${anyOf('status', TERMINAL_STATUSES)} end`,
    'local function allowed_source(to, from)',
    ...moves,
    '  return false',
    'end',
    '',
  ].join('\n');
}

/** The hash field names as the Lua table `F` (`F.status`, `F.input .. n`). */
export function taskFieldsLua(): string {
  const entries = [...Object.entries(TASK_FIELDS), ...Object.entries(TASK_FIELD_PREFIXES)].map(
    ([name, value]) => `${name} = ${JSON.stringify(value)}`,
  );
  return `local F = {${entries.join(', ')}}\n`;
}

/** Includes made from the TS vocabulary rather than read from a file. */
const GENERATED_INCLUDES: Record<string, () => string> = {
  transitions: transitionsLua,
  resultCodes: resultCodesLua,
  taskFields: taskFieldsLua,
  bullmqLayout: bullmqLayoutLua,
  batchFields: batchFieldsLua,
  webhookLimits: webhookLimitsLua,
};

const INCLUDE = /^--- @include "([A-Za-z0-9_]+)"\s*$/gm;

/** A script's source with its includes in place (each once, in order of first mention, includes of includes too). */
export function resolveScript(name: string, numKeys: number, readInclude = readIncludeFile): string {
  const source = readCommandFile(`${name}-${numKeys}.lua`);
  const seen = new Set<string>();
  const expand = (text: string): string =>
    text.replace(INCLUDE, (_line, include: string) => {
      if (seen.has(include)) return '';
      seen.add(include);
      const generated = GENERATED_INCLUDES[include];
      return expand(generated ? generated() : readInclude(include));
    });
  return expand(source);
}

/**
 * The generated vocabulary tables a script reads only by constant name (`R.OK`, `F.status`, `B.total`, `W.type`),
 * with every value they hold: `foldConstants` writes the value in place of each such read.
 */
function constantTables(): Record<string, Record<string, string | number>> {
  const codes = Object.fromEntries(Object.entries(ResultCode).filter(([, v]) => typeof v === 'number'));
  return {
    R: codes,
    F: { ...TASK_FIELDS, ...TASK_FIELD_PREFIXES },
    B: { ...BATCH_FIELDS },
    W: { ...WEBHOOK_EVENT_FIELDS },
  };
}

/**
 * Writes each `R.NAME`, `F.name`, `B.name` and `W.name` of a resolved script as its literal value, and drops a table
 * no longer read. Lua builds a script's local tables on every call: building `R` and `F` (64 entries) cost 4 to 6 µs
 * of Redis CPU per call, once per script of a task's every step (measured, issue 46). A name the table does not hold
 * is refused here, at load, instead of reading as nil in production.
 */
export function foldConstants(source: string, script = '?'): string {
  let folded = source;
  for (const [table, values] of Object.entries(constantTables())) {
    const declaration = new RegExp(`^local ${table} = \\{.*\\}\\n`, 'm');
    if (!declaration.test(folded)) continue;
    folded = folded.replace(new RegExp(`(?<![\\w.])${table}\\.([A-Za-z_]\\w*)`, 'g'), (_m, name: string) => {
      const value = values[name];
      if (value === undefined)
        throw new TaskrelayError('INTERNAL', `Lua script ${script} reads ${table}.${name}, which is not defined`);
      return typeof value === 'number' ? String(value) : JSON.stringify(value);
    });
    const rest = folded.replace(declaration, '');
    // Read any other way (indexed by a value, passed whole): the table stays.
    const code = rest.replace(/^--\[\[[\s\S]*?\]\]/, '').replace(/--.*$/gm, '');
    if (!new RegExp(`(?<![\\w.'"])${table}(?![\\w'"])`).test(code)) folded = rest;
  }
  return folded;
}

function readCommandFile(file: string): string {
  try {
    return readFileSync(new URL(file, COMMANDS_DIR), 'utf8');
  } catch (error) {
    throw new TaskrelayError(
      'INTERNAL',
      `Lua command ${file} not found in ${COMMANDS_DIR.pathname} (run the build, which copies the commands beside the code)`,
      { cause: error },
    );
  }
}

function readIncludeFile(name: string): string {
  return readCommandFile(`includes/${name}.lua`);
}

/**
 * Checks a script's header and body against its declaration: the header lists `KEYS[i] <name>` and `ARGV[i] <name>`
 * for exactly the declared entries, in order, and the body reads no KEYS or ARGV beyond them.
 */
export function checkScript(s: ScriptSpec, source: string): void {
  const header = /^--\[\[([\s\S]*?)\]\]/.exec(source)?.[1];
  if (header === undefined) throw scriptError(s, 'has no --[[ header ]]');
  const body = source.slice(source.indexOf(']]') + 2);
  for (const [table, names] of [
    ['KEYS', s.keys],
    ['ARGV', s.args],
  ] as const) {
    const listed = [...header.matchAll(new RegExp(`^\\s*${table}\\[(\\d+)\\]\\s+(\\w+)`, 'gm'))].map((m) => ({
      index: Number(m[1]),
      name: m[2] ?? '',
    }));
    const expected = names.map((name, i) => `${i + 1} ${name}`).join(', ');
    const got = listed.map((e) => `${e.index} ${e.name}`).join(', ');
    if (got !== expected)
      throw scriptError(s, `header lists ${table} ${got || 'none'}, declared ${expected || 'none'}`);
    for (const m of body.matchAll(new RegExp(`\\b${table}\\[(\\d+)\\]`, 'g'))) {
      if (Number(m[1]) > names.length)
        throw scriptError(s, `reads ${table}[${m[1] ?? ''}] but declares ${names.length}`);
    }
  }
}

function scriptError(s: ScriptSpec, what: string): TaskrelayError {
  return new TaskrelayError('INTERNAL', `Lua command ${s.name}-${s.keys.length}.lua ${what}`);
}

type Client = Redis | Cluster;
type ScriptCommand = (...args: Array<string | number | Buffer>) => Promise<unknown>;

/** The command name a script is registered under on an ioredis client. */
const commandName = (s: ScriptSpec) => `taskrelay_${s.name}`;

let loaded: Map<ScriptSpec, string> | undefined;

/** Every script's resolved source, read and checked once per process. */
export function loadScripts(): Map<ScriptSpec, string> {
  loaded ??= new Map([...readScripts()].map(([s, source]) => [s, foldConstants(source, s.name)]));
  return loaded;
}

/**
 * Every script as written, its includes in place and checked against its declaration, before `foldConstants`: what
 * the checks of the scripts' own conventions read (`F.status`, `R.OK` by name).
 */
export function readScripts(): Map<ScriptSpec, string> {
  const sources = new Map<ScriptSpec, string>();
  for (const s of Object.values(SCRIPTS) as ScriptSpec[]) {
    const source = resolveScript(s.name, s.keys.length);
    checkScript(s, source);
    sources.set(s, source);
  }
  return sources;
}

/**
 * The generation of the task-store scripts (PROTOCOL.md §29.2): 16 hex digits of SHA-256 over every script's name and
 * resolved source. Two processes of one generation run the same Lua on the same keys; the gateway records its
 * generation in `P:protocol`, and a worker in another language (the Python worker, whose copy of the scripts the build
 * emits with this generation) refuses to start when the deployment runs generations it does not know.
 */
export function scriptsGeneration(): string {
  const hash = createHash('sha256');
  // By code point, as any language sorts: a Python check of the emitted files computes the same digest.
  const entries = [...loadScripts()].sort(([a], [b]) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0));
  for (const [s, source] of entries) hash.update(`${s.name}-${s.keys.length}\n${source}\n`);
  return hash.digest('hex').slice(0, 16);
}

/**
 * A job queue's add script to run right after `create`, in the same EVALSHA (PROTOCOL.md §10.1): BullMQ's
 * `addPrioritizedJob` with the keys and arguments BullMQ itself built for the job. Its msgpacked options get the
 * fair-share priority the create answered, so the job is added exactly as `Queue.add` would add it with that priority.
 */
export interface JobAddScript {
  /** The add script's source (includes resolved), run as a function of its own KEYS and ARGV. */
  lua: string;
  keys: string[];
  /** Its ARGV: msgpacked arguments, the job data (JSON), msgpacked options (their `priority` is replaced). */
  args: [string | Buffer, string, string | Buffer];
}

/**
 * `create` and then, when it created the task, a job add script in one script: the two writes of a new task in one
 * round trip. A create that answers anything but OK adds no job; an add that answers something other than the job's
 * id is returned as the reply's fourth value for the caller to refuse.
 */
export function createWithJobLua(addLua: string): string {
  const create = loadScripts().get(SCRIPTS.create) ?? '';
  const nKeys = SCRIPTS.create.keys.length;
  // The create reads its own KEYS and ARGV by position and its fields by count, so it is passed both tables whole;
  // the add's keys follow the create's, its three arguments end ARGV.
  return [
    'local function taskrelay_create(KEYS, ARGV)',
    create,
    'end',
    'local function job_add(KEYS, ARGV)',
    addLua,
    'end',
    'local jk = {}',
    `for i = ${nKeys + 1}, #KEYS do jk[#jk + 1] = KEYS[i] end`,
    'local reply = taskrelay_create(KEYS, ARGV)',
    `if reply[1] ~= ${ResultCode.OK} then return reply end`,
    'local n = #ARGV',
    'local opts = cmsgpack.unpack(ARGV[n])',
    "opts['priority'] = reply[3]",
    'reply[4] = job_add(jk, {ARGV[n - 2], ARGV[n - 1], cmsgpack.pack(opts)})',
    'return reply',
    '',
  ].join('\n');
}

function positionalOf<S extends ScriptSpec>(
  s: S,
  input: ScriptInput<S>,
): { keys: string[]; args: Array<string | number | Buffer> } {
  const keys = input.keys as Record<string, string>;
  return { keys: s.keys.map((k) => keys[k] ?? ''), args: argvOf(s.args, input.args) };
}

/** The scripts bound to one client: registered as ioredis commands, so they go by SHA (EVALSHA) after the first call. */
export class ScriptRunner {
  constructor(private readonly client: Client) {
    const commands = client as unknown as Record<string, ScriptCommand | undefined>;
    for (const [s, lua] of loadScripts()) {
      if (!commands[commandName(s)]) client.defineCommand(commandName(s), { numberOfKeys: s.keys.length, lua });
    }
  }

  /** Runs `s` with named keys and arguments, and decodes its reply through the one result-code mapper. */
  async call<S extends ScriptSpec>(s: S, input: ScriptInput<S>): Promise<ScriptReply> {
    const { keys, args } = positionalOf(s, input);
    const positional = [...keys, ...args];
    const command = (this.client as unknown as Record<string, ScriptCommand>)[commandName(s)];
    if (!command) throw scriptError(s, 'is not registered on this client');
    coalesceWrites(this.client);
    return decodeReply(s.name, s.codes, await command.apply(this.client, positional));
  }

  private readonly composed = new Map<string, string>();

  /** `create` followed by `job`'s add script in the same EVALSHA (`createWithJobLua`). */
  async callCreateWithJob(input: ScriptInput<typeof SCRIPTS.create>, job: JobAddScript): Promise<ScriptReply> {
    const s = SCRIPTS.create;
    let name = this.composed.get(job.lua);
    if (name === undefined) {
      name = `taskrelay_createWithJob${this.composed.size}`;
      this.client.defineCommand(name, {
        numberOfKeys: s.keys.length + job.keys.length,
        lua: createWithJobLua(job.lua),
      });
      this.composed.set(job.lua, name);
    }
    const keys = input.keys as Record<string, string>;
    const positional = [...s.keys.map((k) => keys[k] ?? ''), ...job.keys, ...argvOf(s.args, input.args), ...job.args];
    const command = (this.client as unknown as Record<string, (...a: unknown[]) => Promise<unknown>>)[name];
    if (!command) throw scriptError(s, 'with a job add is not registered on this client');
    coalesceWrites(this.client);
    return decodeReply(s.name, s.codes, await command.apply(this.client, positional));
  }
}
