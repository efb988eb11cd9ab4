/**
 * The operator pages under `/admin` (docs/HTTP.md): bull-board at `/admin/queues`, and beside it the live tasks page
 * (`/admin/tasks`, a task's detail at `/admin/tasks/<id>`) fed by two read-only JSON routes under `/admin/api`.
 * Mounted behind the gateway's auth and, with auth on, for operators only (`TASKRELAY_OPERATORS`).
 */
import { createBullBoard } from '@bull-board/api';
import { BullMQAdapter } from '@bull-board/api/bullMQAdapter';
import { ExpressAdapter } from '@bull-board/express';
import express, { type Request, type Response, type Router } from 'express';
import type { AuditLog, Logger, TaskStore, TaskRecord, TaskSearch, WebhookOutbox } from '@taskrelay/shared';
import { tasksPage } from './tasks-page.js';
import { pendingQuestions, type AdminQueries } from './queries.js';
import type { TaskReplay } from '../tasks/replay.js';
import type { SessionRequest } from '../http/auth/admin-sessions.js';
import { createTaskApi } from './task-api.js';
import { createWebhookApi } from './webhook-api.js';

/**
 * bull-board's pages load only what this gateway serves: its own scripts, styles (and the inline styles its React
 * build sets), images and API. Its template links web fonts on an outside host; that link is taken out (the pages fall
 * back to the system fonts), so an operator's browser tells no one else it opened the dashboard.
 */
const BOARD_CSP = [
  "default-src 'self'",
  "script-src 'self'",
  "style-src 'self' 'unsafe-inline'",
  "img-src 'self' data:",
  "font-src 'self'",
  "connect-src 'self'",
  "object-src 'none'",
  "base-uri 'self'",
  "form-action 'self'",
  "frame-ancestors 'none'",
].join('; ');
/** `form-action 'self'`: the Log out button is a form POST to `/admin/logout`. */
const TASKS_PAGE_CSP =
  "default-src 'self'; style-src 'unsafe-inline'; script-src 'unsafe-inline'; object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'";
/**
 * A pool on bull-board under its own name (`default.<digest>`, as on the dashboard, in the logs and in
 * `pools-main.js`), not BullMQ's queue name `q-<pool>`: bull-board keys, lists and links its queues by `getName()`,
 * and has no option to name them otherwise (`displayName` only titles the queue's page). Read-only: a job retried or
 * removed by hand would fight the task store, which is the record.
 */
class PoolAdapter extends BullMQAdapter {
  constructor(
    queue: ConstructorParameters<typeof BullMQAdapter>[0],
    private readonly pool: string,
  ) {
    super(queue, { readOnlyMode: true });
  }

  override getName(): string {
    return this.pool;
  }
}

/** A `<link>` to anything on another host (bull-board's web fonts). */
const OUTSIDE_LINK = /<link\b[^>]*\bhref="(?:https?:)?\/\/[^"]*"[^>]*>\s*/gi;

/** Finished tasks the page keeps showing (read again each poll, so they vanish when their ttl ends). */
const RECENT_TASKS = 200;

export interface AdminRouterOptions {
  queries: AdminQueries;
  log: Logger;
  /** Where the router is mounted. Default `/admin`. */
  basePath?: string;
  /** The webhook outbox: its pending and dead counts and the newest dead letters are shown (PROTOCOL.md §27.6). */
  webhooks?: Pick<WebhookOutbox, 'counts' | 'deadLetters' | 'resend'>;
  /** Search and replay of tasks (PROTOCOL.md §30.2, §30.3), and who the operator of a request is, for the audit. */
  tasks?: {
    search: TaskSearch;
    replay: TaskReplay;
    store: Pick<TaskStore, 'records' | 'logs'>;
    cancel: (taskId: string) => Promise<TaskRecord>;
    by: (req: Request) => string;
  };
  /** Operators' actions, recorded and shown (PROTOCOL.md §30.5). */
  audit?: AuditLog;
}

export function createAdminRouter(options: AdminRouterOptions): Router {
  const { queries, log, audit } = options;
  const base = options.basePath ?? '/admin';
  const router = express.Router();
  mountBoard(router, queries, base);
  router.get('/api/overview', overviewHandler(options));
  mountToolSwitch(router, options);
  if (options.tasks && audit) router.use('/api/tasks', createTaskApi({ ...options.tasks, audit, log }));
  if (options.webhooks && options.tasks && audit) {
    router.use('/api/webhooks', createWebhookApi({ outbox: options.webhooks, audit, log, by: options.tasks.by }));
  }
  router.get('/api/tasks/:id', async (req: Request, res: Response) => {
    const detail = await queries.task(String(req.params['id']));
    if (!detail) {
      res.status(404).json({ error: 'task not found (unknown or expired)' });
      return;
    }
    res.json(detail);
  });

  const page = (req: SessionRequest, res: Response) => {
    res.setHeader('Content-Security-Policy', TASKS_PAGE_CSP);
    // It carries a session's CSRF token: never kept by a cache.
    res.setHeader('Cache-Control', 'no-store');
    res.type('html').send(tasksPage(req.adminSession?.csrf));
  };
  router.get('/tasks', page);
  router.get('/tasks/:id', page);
  router.get('/', (_req, res) => res.redirect(`${base}/tasks`));

  router.use((error: unknown, _req: Request, res: Response, next: (e?: unknown) => void) => {
    if (res.headersSent) return next(error);
    log.warn({ err: error }, 'admin request failed');
    res
      .status(503)
      .json({ error: `admin view unavailable: ${error instanceof Error ? error.message : String(error)}` });
  });
  return router;
}

/** bull-board at `/queues`, read-only, under the pools' own names and without outside links. */
function mountBoard(router: Router, queries: AdminQueries, base: string): void {
  const serverAdapter = new ExpressAdapter().setBasePath(`${base}/queues`);
  const board = createBullBoard({
    queues: [],
    serverAdapter,
    options: { uiConfig: { boardTitle: 'taskrelay queues' } },
  });
  let shownQueues = '';
  /** Queues come and go with their workers and jobs: bull-board shows those the dashboard shows (`queueDepths`). */
  const refreshQueues = async () => {
    const names = await queries.queueNames();
    if (names.join(',') === shownQueues) return;
    shownQueues = names.join(',');
    board.replaceQueues(names.map((name) => new PoolAdapter(queries.queue(name), name)));
  };
  router.use('/queues', (_req, _res, next) => {
    refreshQueues().then(
      () => next(),
      (error: unknown) => next(error),
    );
  });
  router.use('/queues', (_req: Request, res: Response, next: () => void) => {
    res.setHeader('Content-Security-Policy', BOARD_CSP);
    const send = res.send.bind(res);
    res.send = (body?: unknown) => send(typeof body === 'string' ? body.replace(OUTSIDE_LINK, '') : body);
    next();
  });
  router.use('/queues', serverAdapter.getRouter() as Router);
}

/** `GET /api/overview`: what the tasks page shows, read each poll. */
function overviewHandler(options: AdminRouterOptions) {
  const { queries, audit } = options;
  /**
   * Tasks seen live by this page, kept after they end: the live set holds only non-terminal tasks (the page's own
   * list; the index of §30.2 serves the search).
   */
  const recent = new Map<string, true>();
  const remember = (tasks: TaskRecord[]) => {
    for (const t of tasks) {
      recent.delete(t.taskId);
      recent.set(t.taskId, true);
    }
    while (recent.size > RECENT_TASKS) recent.delete(recent.keys().next().value as string);
  };
  const webhookView = async () => {
    if (!options.webhooks) return undefined;
    const [counts, deadLetters] = await Promise.all([options.webhooks.counts(), options.webhooks.deadLetters(50)]);
    return { ...counts, deadLetters };
  };
  return async (_req: Request, res: Response) => {
    const [workers, queues, live, webhooks, tools, pools, actions] = await Promise.all([
      queries.workers(),
      queries.queueDepths(),
      queries.liveTasks(),
      webhookView(),
      queries.tools(),
      queries.pools(),
      audit?.newest(20),
    ]);
    remember(live);
    const liveIds = new Set(live.map((t) => t.taskId));
    const finished = await queries.records([...recent.keys()].filter((id) => !liveIds.has(id)));
    const gone = new Set([...recent.keys()].filter((id) => !liveIds.has(id)));
    for (const t of finished) gone.delete(t.taskId);
    for (const id of gone) recent.delete(id);
    const tasks = [...live, ...finished].sort((a, b) => b.createdAt.localeCompare(a.createdAt)).map(summary);
    // Batches (PROTOCOL.md §26.9): the children's counts of every listed task that fanned out.
    const batches = await queries.batches(tasks.map((t) => t.taskId));
    res.json({
      now: Date.now(),
      workers,
      queues,
      pools,
      tasks,
      batches,
      tools,
      ...(webhooks ? { webhooks } : {}),
      ...(actions ? { audit: actions } : {}),
    });
  };
}

/** Tools and their controls (PROTOCOL.md §3.3): the incident switch is a pause of every queue of the tool. */
function mountToolSwitch(router: Router, options: AdminRouterOptions): void {
  const { queries, log, audit } = options;
  router.get('/api/tools', async (_req: Request, res: Response) => {
    res.json({ tools: await queries.tools() });
  });
  for (const action of ['pause', 'resume'] as const) {
    router.post(`/api/tools/:name/${action}`, async (req: Request, res: Response) => {
      const name = String(req.params['name']);
      const tool = await queries.setPaused(name, action === 'pause');
      if (!tool) {
        res.status(404).json({ error: `unknown tool ${name}: no live worker serves it and no retained pool lists it` });
        return;
      }
      const by = options.tasks?.by(req) ?? 'unknown';
      log.info({ by, tool: name, queues: tool.queues }, action === 'pause' ? 'tool paused' : 'tool resumed');
      await audit?.record({ by, action, target: name, outcome: `${tool.queues.length} queue(s)` });
      res.json({ tool });
    });
  }
}

/** What the list shows of a task: never its arguments or result. */
function summary(t: TaskRecord) {
  const questions = pendingQuestions(t);
  return {
    taskId: t.taskId,
    tool: t.tool,
    queue: t.queue,
    status: t.status,
    statusMessage: t.statusMessage,
    // What it waits to be answered, while `input_required` (tasks/get shows no statusMessage then).
    ...(questions.length > 0 ? { questions } : {}),
    progress: t.progress,
    total: t.total,
    principal: t.principal,
    mode: t.mode,
    attempt: t.attempt,
    createdAt: t.createdAt,
    lastUpdatedAt: t.lastUpdatedAt,
  };
}
