/**
 * Finding and replaying ended work over HTTP (PROTOCOL.md §30.2, §30.3; docs/HTTP.md):
 *
 *   GET  /admin/api/tasks?status=&tool=&principal=&tag=&since=&until=&cursor=&limit=   operators: every principal
 *   GET  /api/tasks?…                                                                   anyone: their own tasks
 *   POST /admin/api/tasks/{id}/replay   {"redrive"?}
 *   POST /admin/api/tasks/replay        {the filters, "redrive"?, "dryRun"?, "again"?}
 *   GET  /admin/api/tasks/{id}/logs?after=&limit=                                      operators: any task's
 *   GET  /api/tasks/{id}/logs?…                                                         anyone: their own task's
 *
 * Every query and body is checked with zod; an unknown parameter is refused with 400 naming it (a typo must not widen
 * a search or a bulk replay). Who may POST, and with what, is the operator routes' guard's (http/auth/admin-writes.ts).
 */
import express, { type NextFunction, type Request, type RequestHandler, type Response, type Router } from 'express';
import { z } from 'zod';
import {
  SEARCH_MAX_LIMIT,
  type AuditLog,
  type TaskRecord,
  TASK_STATUSES,
  TaskrelayError,
  type Logger,
  type TaskStore,
  type TaskFilter,
  type TaskSearch,
  type TaskStatus,
} from '@taskrelay/shared';
import type { TaskReplay } from '../tasks/replay.js';

/** A time filter: ISO 8601, or ms since the epoch. */
const time = z
  .string()
  .trim()
  .min(1)
  .transform((text, ctx) => {
    const ms = /^\d+$/.test(text) ? Number(text) : Date.parse(text);
    if (!Number.isFinite(ms)) {
      ctx.addIssue({ code: 'custom', message: `must be an ISO 8601 time or ms since the epoch; got ${text}` });
      return z.NEVER;
    }
    return ms;
  });

const statuses = z
  .string()
  .trim()
  .transform((text, ctx) => {
    const list = text
      .split(',')
      .map((s) => s.trim())
      .filter(Boolean);
    const bad = list.find((s) => !(TASK_STATUSES as readonly string[]).includes(s));
    if (bad !== undefined) {
      ctx.addIssue({ code: 'custom', message: `must be one or more of ${TASK_STATUSES.join(', ')}; got ${bad}` });
      return z.NEVER;
    }
    return list as TaskStatus[];
  });

const filterShape = {
  status: statuses.optional(),
  tool: z.string().trim().min(1).max(200).optional(),
  principal: z.string().trim().min(1).max(500).optional(),
  tag: z.string().trim().min(1).max(64).optional(),
  since: time.optional(),
  until: time.optional(),
};
const searchQuery = z
  .object({
    ...filterShape,
    cursor: z.string().max(200).optional(),
    limit: z.coerce.number().int().min(1).max(SEARCH_MAX_LIMIT).optional(),
  })
  .strict();
const replayOneBody = z.object({ redrive: z.boolean().optional() }).strict();
const logsQuery = z
  .object({
    after: z
      .string()
      .regex(/^\d{1,15}-\d{1,10}$/, 'must be a line id from an earlier answer')
      .optional(),
    limit: z.coerce.number().int().min(1).max(1_000).optional(),
  })
  .strict();
const replayManyBody = z
  .object({
    ...filterShape,
    // A body's status may be a list too.
    status: z.union([statuses, z.array(z.enum(TASK_STATUSES))]).optional(),
    redrive: z.boolean().optional(),
    dryRun: z.boolean().optional(),
    again: z.boolean().optional(),
  })
  .strict();

/** The first problem of a zod error, as one line naming the parameter. */
function problem(error: z.ZodError): string {
  const issue = error.issues[0];
  if (!issue) return 'invalid request';
  if (issue.code === 'unrecognized_keys') return `unknown parameter ${issue.keys.join(', ')}`;
  return `${issue.path.join('.') || 'request'} ${issue.message}`;
}

function filterOf(p: { [K in keyof TaskFilter]?: TaskFilter[K] }): TaskFilter {
  return Object.fromEntries(Object.entries(p).filter(([, v]) => v !== undefined));
}

/** HTTP status of a domain error here: what is missing 404, what cannot be replayed 409, a bad request 400. */
function statusOf(error: TaskrelayError): number {
  switch (error.code) {
    case 'TASK_NOT_FOUND':
      return 404;
    case 'REPLAY_REFUSED':
    case 'TASK_TERMINAL':
    case 'TOO_MANY_OPEN_TASKS':
      return 409;
    case 'INVALID_ARGUMENTS':
    case 'WEBHOOK_REFUSED':
      return 400;
    default:
      return 503;
  }
}

/** Answers a domain error as JSON with its HTTP status; anything else goes to the router's error handler. */
function answerError(res: Response, next: NextFunction, error: unknown): void {
  if (error instanceof TaskrelayError) {
    res.status(statusOf(error)).json({ error: error.message, code: error.code });
    return;
  }
  next(error);
}

/**
 * `GET …/tasks`: one page of the search. `scope` says whose tasks the caller may see: every principal's (an
 * operator, or anyone with authentication off), or only its own (the filter's principal is forced to it).
 */
export function searchHandler(search: TaskSearch, scope: (req: Request) => { principal?: string }): RequestHandler {
  return (req, res, next) => {
    const parsed = searchQuery.safeParse(req.query);
    if (!parsed.success) {
      res.status(400).json({ error: problem(parsed.error) });
      return;
    }
    const { cursor, limit, ...rest } = parsed.data;
    const own = scope(req).principal;
    const filter = filterOf({ ...rest, ...(own === undefined ? {} : { principal: own }) });
    search
      .search(filter, { ...(cursor === undefined ? {} : { cursor }), ...(limit === undefined ? {} : { limit }) })
      .then(
        (page) => res.json(page),
        (error: unknown) => answerError(res, next, error),
      );
  };
}

/**
 * `GET …/tasks/{id}/logs`: the task's kept log lines (PROTOCOL.md §30.4), oldest first, after `after`. `scope` says
 * whose tasks the caller may read: any (an operator), or only its own (another's answers 404, as `tasks/get` does).
 */
export function logsHandler(
  store: Pick<TaskStore, 'records' | 'logs'>,
  scope: (req: Request) => { principal?: string },
): RequestHandler {
  return (req, res, next) => {
    const parsed = logsQuery.safeParse(req.query);
    if (!parsed.success) {
      res.status(400).json({ error: problem(parsed.error) });
      return;
    }
    const taskId = String(req.params['id']);
    const own = scope(req).principal;
    const read = async () => {
      const record = await store.records.get(taskId);
      if (!record || (own !== undefined && record.principal !== own)) {
        throw new TaskrelayError('TASK_NOT_FOUND', `Task ${taskId} not found (unknown, expired, or not yours)`);
      }
      const lines = await store.logs.read(taskId, parsed.data.after, parsed.data.limit ?? 200);
      return { taskId, status: record.status, lines, last: lines.at(-1)?.id ?? parsed.data.after ?? null };
    };
    read().then(
      (body) => res.json(body),
      (error: unknown) => answerError(res, next, error),
    );
  };
}

/** The operators' routes under `/admin/api/tasks`: search, and replay one or many (audited by `by`). */
export function createTaskApi(o: {
  search: TaskSearch;
  replay: TaskReplay;
  store: Pick<TaskStore, 'records' | 'logs'>;
  /** An operator's cancel of any principal's task. */
  cancel: (taskId: string) => Promise<TaskRecord>;
  audit: AuditLog;
  log: Logger;
  by: (req: Request) => string;
}): Router {
  const router = express.Router();
  const body = express.json({ limit: '16kb' });
  router.get(
    '/',
    searchHandler(o.search, () => ({})),
  );
  router.get(
    '/:id/logs',
    logsHandler(o.store, () => ({})),
  );
  router.post('/replay', body, (req, res, next) => {
    const parsed = replayManyBody.safeParse(req.body ?? {});
    if (!parsed.success) {
      res.status(400).json({ error: problem(parsed.error) });
      return;
    }
    const { redrive, dryRun, again, ...rest } = parsed.data;
    const by = o.by(req);
    const filter = filterOf(rest);
    const run = async () => {
      const opts = { by, redrive: redrive === true, dryRun: dryRun === true, again: again === true };
      const outcome = await o.replay.replayMany(filter, opts);
      if (!opts.dryRun) {
        const target = JSON.stringify(rest);
        await o.audit.record({
          by,
          action: 'replay-many',
          target,
          outcome: `${outcome.replayed.length} of ${outcome.matched} replayed`,
        });
      }
      return outcome;
    };
    run().then(
      (outcome) => res.json(outcome),
      (error: unknown) => answerError(res, next, error),
    );
  });
  router.post('/:id/cancel', (req, res, next) => {
    const taskId = String(req.params['id']);
    const by = o.by(req);
    const run = async () => {
      const task = await o.cancel(taskId);
      o.log.info({ by, taskId }, 'task cancelled by an operator');
      await o.audit.record({ by, action: 'cancel', target: taskId, outcome: task.status });
      return task;
    };
    run().then(
      (task) => res.json({ task }),
      (error: unknown) => answerError(res, next, error),
    );
  });
  router.post('/:id/replay', body, (req, res, next) => {
    const parsed = replayOneBody.safeParse(req.body ?? {});
    if (!parsed.success) {
      res.status(400).json({ error: problem(parsed.error) });
      return;
    }
    const taskId = String(req.params['id']);
    const by = o.by(req);
    const run = async () => {
      const task = await o.replay.replay(taskId, { by, redrive: parsed.data.redrive === true });
      const how = parsed.data.redrive === true ? ' (redrive)' : '';
      await o.audit.record({ by, action: 'replay', target: taskId, outcome: `as ${task.taskId}${how}` });
      return task;
    };
    run().then(
      (task) => res.status(201).json({ task }),
      (error: unknown) => answerError(res, next, error),
    );
  });
  router.use(bodyRefused);
  return router;
}

/** A body that is not JSON, or too big: the request's fault, said in one line (the admin APIs' last handler). */
export function bodyRefused(error: unknown, _req: Request, res: Response, next: NextFunction): void {
  const status = (error as { status?: unknown } | null)?.status;
  if (typeof status === 'number' && status >= 400 && status < 500) {
    res.status(status).json({ error: `request body refused: ${(error as Error).message}` });
    return;
  }
  next(error);
}
