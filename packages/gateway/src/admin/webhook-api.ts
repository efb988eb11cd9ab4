/**
 * Dead webhooks for operators (PROTOCOL.md §27.6; docs/HTTP.md), under `/admin/api/webhooks`:
 *
 *   GET  /dead?limit=              the newest dead letters (at most 1,000 are kept)
 *   POST /dead/{id}/resend         send one again
 *   POST /dead/resend              send every dead letter again (newest first)
 *
 * A resend makes the event due at once under its own id, its tries counted from 0; its delivery goes through the same
 * URL checks as the first tries. The POSTs pass the operator routes' guard first (http/auth/admin-writes.ts), and each
 * is logged with the operator.
 */
import express, { type Request, type Router } from 'express';
import { z } from 'zod';
import type { AuditLog, Logger, WebhookOutbox } from '@taskrelay/shared';

const listQuery = z.object({ limit: z.coerce.number().int().min(1).max(1_000).optional() }).strict();

export function createWebhookApi(o: {
  outbox: Pick<WebhookOutbox, 'deadLetters' | 'resend'>;
  audit: AuditLog;
  log: Logger;
  by: (req: Request) => string;
}): Router {
  const router = express.Router();
  router.get('/dead', (req, res, next) => {
    const parsed = listQuery.safeParse(req.query);
    if (!parsed.success) {
      const issue = parsed.error.issues[0];
      const what =
        issue?.code === 'unrecognized_keys' ? `unknown parameter ${issue.keys.join(', ')}` : 'limit must be 1 to 1000';
      res.status(400).json({ error: what });
      return;
    }
    o.outbox.deadLetters(parsed.data.limit ?? 50).then(
      (deadLetters) => res.json({ deadLetters }),
      (error: unknown) => next(error),
    );
  });
  const resend = (id: string | undefined) => (req: Request, res: express.Response, next: express.NextFunction) => {
    const by = o.by(req);
    const run = async () => {
      const resent = await o.outbox.resend(id);
      if (resent.length > 0 || id === undefined) {
        o.log.info({ by, resent: resent.length, id }, 'dead webhooks sent again');
        await o.audit.record({ by, action: 'resend', target: id ?? 'all', outcome: `${resent.length} due again` });
      }
      return resent;
    };
    run().then(
      (resent) => {
        if (id !== undefined && resent.length === 0) {
          res.status(404).json({ error: `no dead webhook ${id} (resent already, or dropped past the newest 1,000)` });
          return;
        }
        res.json({ resent });
      },
      (error: unknown) => next(error),
    );
  };
  router.post('/dead/resend', resend(undefined));
  router.post('/dead/:id/resend', (req, res, next) => resend(String(req.params['id']))(req, res, next));
  return router;
}
