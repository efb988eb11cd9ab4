/**
 * Schedules over HTTP (PROTOCOL.md §33.2; docs/HTTP.md), the same routes in two places:
 *
 *   /admin/api/schedules   operators: every principal's schedules; a new one belongs to `principal` (default: the
 *                          operator)
 *   /api/schedules         anyone: their own schedules only; another's answers 404, as another's task does
 *
 *   GET    /                    {schedules: [...]}          (?principal= narrows an operator's list)
 *   POST   /                    the schedule (JSON) → 201 {schedule}; the same id again replaces its definition
 *   GET    /{id}                {schedule}
 *   POST   /{id}/pause          {schedule}
 *   POST   /{id}/resume         {schedule}
 *   DELETE /{id}                {removed: id}
 *
 * Bodies and queries are checked with zod (an unknown field is refused, naming it); writes pass the operator routes'
 * guard first (http/auth/admin-writes.ts: same origin, JSON or the dashboard's CSRF token), and each is logged with who made it and recorded in the operators' audit.
 */
import express, { type NextFunction, type Request, type Response, type Router } from 'express';
import { z } from 'zod';
import { TaskrelayError, type AuditLog, type Logger } from '@taskrelay/shared';
import { scheduleSpecSchema, specProblem } from '../tasks/schedules/schedule-model.js';
import type { ScheduleScope, Schedules } from '../tasks/schedules/schedules.js';
import { bodyRefused } from './task-api.js';

const listQuery = z.object({ principal: z.string().min(1).max(500).optional() }).strict();

export interface ScheduleApiOptions {
  schedules: Pick<Schedules, 'upsert' | 'list' | 'get' | 'setPaused' | 'remove'>;
  /** Whose schedules the caller may see and manage: `{}` for an operator, else its own principal. */
  scope: (req: Request) => ScheduleScope;
  /** The caller's principal. */
  by: (req: Request) => string;
  audit?: AuditLog;
  log: Logger;
}

function statusOf(error: TaskrelayError): number {
  switch (error.code) {
    case 'SCHEDULE_NOT_FOUND':
      return 404;
    case 'SCHEDULE_REFUSED':
    case 'WEBHOOK_REFUSED':
    case 'INVALID_ARGUMENTS':
      return 400;
    case 'TOO_MANY_PENDING_WEBHOOKS':
      return 409;
    default:
      return 503;
  }
}

export function createScheduleApi(o: ScheduleApiOptions): Router {
  const router = express.Router();
  /** Runs `work`, answering its value as JSON, a domain error with its status, anything else to the error handler. */
  const answer =
    (work: (req: Request) => Promise<{ status?: number; body: unknown }>) =>
    (req: Request, res: Response, next: NextFunction) => {
      work(req).then(
        ({ status, body }) => res.status(status ?? 200).json(body),
        (error: unknown) => {
          if (error instanceof TaskrelayError)
            res.status(statusOf(error)).json({ error: error.message, code: error.code });
          else next(error);
        },
      );
    };
  const audited = async (
    req: Request,
    action: 'set' | 'pause' | 'resume' | 'remove',
    target: string,
    outcome: string,
  ) => {
    const by = o.by(req);
    o.log.info({ by, scheduleId: target, action }, `schedule ${action}`);
    await o.audit?.record({ by, action: `schedule-${action}`, target, outcome });
  };
  const badRequest = (message: string) => new TaskrelayError('SCHEDULE_REFUSED', message);

  router.get(
    '/',
    answer(async (req) => {
      const query = listQuery.safeParse(req.query);
      if (!query.success) throw badRequest(specProblem(query.error).replace(/^schedule /, ''));
      const own = o.scope(req).principal;
      const scope = own !== undefined ? { principal: own } : query.data;
      return { body: { schedules: await o.schedules.list(scope) } };
    }),
  );
  router.get(
    '/:id',
    answer(async (req) => ({ body: { schedule: await o.schedules.get(String(req.params['id']), o.scope(req)) } })),
  );
  router.post('/', express.json({ limit: '300kb' }), (req, res, next) => {
    answer(async () => {
      const { principal: asked, ...rest } = (req.body ?? {}) as Record<string, unknown>;
      const own = o.scope(req).principal;
      if (asked !== undefined && (typeof asked !== 'string' || asked.length === 0 || asked.length > 500)) {
        throw badRequest('principal must be a string of 1 to 500 characters');
      }
      if (own !== undefined && asked !== undefined && asked !== own) {
        throw badRequest('principal: only an operator creates a schedule for another principal');
      }
      const spec = scheduleSpecSchema.safeParse(rest);
      if (!spec.success) throw badRequest(specProblem(spec.error));
      const owner = own ?? asked ?? o.by(req);
      const schedule = await o.schedules.upsert(spec.data, owner, 'api');
      await audited(req, 'set', schedule.id, `owned by ${owner}`);
      return { status: 201, body: { schedule } };
    })(req, res, next);
  });
  for (const action of ['pause', 'resume'] as const) {
    router.post(`/:id/${action}`, (req, res, next) => {
      answer(async () => {
        const id = String(req.params['id']);
        const schedule = await o.schedules.setPaused(id, o.scope(req), action === 'pause');
        await audited(req, action, id, schedule.paused ? 'paused' : 'running');
        return { body: { schedule } };
      })(req, res, next);
    });
  }
  router.delete('/:id', (req, res, next) => {
    answer(async () => {
      const id = String(req.params['id']);
      await o.schedules.remove(id, o.scope(req));
      await audited(req, 'remove', id, 'removed');
      return { body: { removed: id } };
    })(req, res, next);
  });
  router.use(bodyRefused);
  return router;
}
