/**
 * `POST /waitpoints/<token>` (PROTOCOL.md §32.4): no credentials (the token is the authority), a bounded JSON body,
 * and answers that say nothing of the task. Its own small JSON answers rather than JSON-RPC: the caller is a CI system
 * or another service, not an MCP client.
 */
import express, { type NextFunction, type Request, type Response } from 'express';
import type { Logger } from '@taskrelay/shared';
import type { WaitpointCallbacks } from '../tasks/waitpoints.js';

const ANSWERS = {
  accepted: [202, { accepted: true }],
  unknown: [404, { error: 'unknown waitpoint' }],
  used: [409, { error: 'this waitpoint was called already' }],
  expired: [410, { error: 'this waitpoint no longer waits (timed out, or its work ended)' }],
} as const;

export function waitpointRouter(callbacks: WaitpointCallbacks, maxBytes: number, log: Logger): express.Router {
  const router = express.Router();
  router.post(
    '/:token',
    (req: Request, res: Response, next: NextFunction) => {
      if (!req.is('application/json')) {
        res.status(415).json({ error: 'Content-Type must be application/json' });
        return;
      }
      next();
    },
    express.json({ limit: maxBytes, strict: false, type: 'application/json' }),
    async (req: Request, res: Response) => {
      const [status, body] = ANSWERS[await callbacks.call(String(req.params['token']), JSON.stringify(req.body))];
      res.status(status).json(body);
    },
  );
  router.all('/:token', (_req: Request, res: Response) => {
    res.setHeader('Allow', 'POST');
    res.status(405).json({ error: 'POST a JSON body to a waitpoint' });
  });
  router.use((error: unknown, _req: Request, res: Response, next: NextFunction) => {
    if (res.headersSent) return next(error);
    const { type } = error as { type?: string };
    if (type === 'entity.too.large') {
      res.status(413).json({ error: `the body is larger than ${maxBytes} bytes` });
      return;
    }
    if (type === 'entity.parse.failed') {
      res.status(400).json({ error: 'the body is not valid JSON' });
      return;
    }
    log.error({ err: error }, 'waitpoint callback failed');
    res.status(503).json({ error: 'not stored; try again' });
  });
  return router;
}
