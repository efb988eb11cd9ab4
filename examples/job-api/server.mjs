#!/usr/bin/env node
/**
 * A small fake batch-job service, the kind taskrelay's job-API tools wrap (docs/JOB-API.md). No dependencies:
 *
 *   node examples/job-api/server.mjs            # http://127.0.0.1:4000 (PORT=0 picks a free port)
 *
 * Jobs:
 *   POST   /jobs              {steps?, stepMs?, fail?, ...}  → 202 {job:{id,state}} + Location: /jobs/<id>
 *                             an `Idempotency-Key` header already seen returns the same job (no new job)
 *   GET    /jobs/<id>         {state: queued|running|done|error|canceled, progress:{done,total}, note, error?:{message}}
 *   GET    /jobs/<id>/result  {output:{...}} once done (409 before)
 *   GET    /jobs/<id>/log     a line of plain text (a non-JSON result)
 *   DELETE /jobs/<id>         cancels it (409 when it already ended)
 * A job advances one step every `stepMs` (default 200) up to `steps` (default 10), then ends `done`, or `error` with
 * the message in `fail` when given. With `manual: true` it advances only when told (`/_jobs/<id>/advance`). `BATCH_TOKEN` set: every /jobs request needs `Authorization: Bearer <token>`.
 *
 * Control, for tests and demos (no auth):
 *   GET  /_stats      {submits, jobsCreated, cancels, polls, results, requests}  (submits counts every POST /jobs)
 *   POST /_control    {flaky?: ["500","429","timeout","slow","ok",...], slowMs?, hangMs?, reset?: true}
 *                     `flaky` is a pattern cycled over the /jobs requests that follow: "500" answers 503, "429"
 *                     answers 429 with `Retry-After: 1` (a quota), "timeout"
 *                     holds the answer `hangMs` (default 30000) then drops the connection, "slow" answers after
 *                     `slowMs` (default 300), "ok" answers at once. [] turns it off.
 *   POST /_jobs/<id>/advance {steps?}  moves a `manual` job on (default 1 step; it ends `done` at `steps`).
 *   POST /_jobs/<id>/fail {message}    ends a running job `error` now.
 *   <id> may be `latest`: the job created last.
 *
 * Prints one line `fake batch service listening on http://127.0.0.1:<port>` when ready.
 */
import { createServer } from 'node:http';
import { randomUUID } from 'node:crypto';

const port = Number(process.env.PORT ?? 4000);
const token = process.env.BATCH_TOKEN;

const jobs = new Map();
const byIdempotencyKey = new Map();
const stats = { submits: 0, jobsCreated: 0, cancels: 0, polls: 0, results: 0, requests: 0 };
let lastJobId;
let flaky = [];
let flakyIndex = 0;
let slowMs = 300;
let hangMs = 30_000;

function view(job) {
  const now = Date.now();
  if (job.state === 'queued' || job.state === 'running') {
    const done = job.manual ? job.done : Math.min(job.steps, Math.floor((now - job.startedAt) / job.stepMs));
    job.done = done;
    if (done >= job.steps) {
      job.state = job.fail === undefined ? 'done' : 'error';
      if (job.fail !== undefined) job.error = { message: job.fail };
    } else {
      job.state = done === 0 ? 'queued' : 'running';
    }
  }
  const body = {
    id: job.id,
    state: job.state,
    progress: { done: job.done, total: job.steps },
    note: job.state === 'done' ? 'finished' : `step ${job.done} of ${job.steps}`,
  };
  if (job.error) body.error = job.error;
  return body;
}

function send(res, status, body, headers = {}) {
  const text = body === undefined ? '' : JSON.stringify(body);
  res.writeHead(status, { 'content-type': 'application/json', ...headers });
  res.end(text);
}

async function readBody(req) {
  let raw = '';
  for await (const chunk of req) raw += chunk;
  if (raw === '') return {};
  try {
    return JSON.parse(raw);
  } catch {
    return undefined;
  }
}

/** The flaky pattern's verdict for the next /jobs request: true when it answered (or dropped) the request itself. */
async function misbehave(res) {
  if (flaky.length === 0) return false;
  const mode = flaky[flakyIndex % flaky.length];
  flakyIndex += 1;
  if (mode === '500') {
    send(res, 503, { error: { message: 'temporarily unavailable (flaky mode)' } });
    return true;
  }
  if (mode === '429') {
    send(res, 429, { error: { message: 'quota exhausted (flaky mode)' } }, { 'retry-after': '1' });
    return true;
  }
  if (mode === 'timeout') {
    setTimeout(() => res.destroy(), hangMs).unref();
    return true;
  }
  if (mode === 'slow') await new Promise((resolve) => setTimeout(resolve, slowMs));
  return false;
}

async function handle(req, res) {
  const url = new URL(req.url ?? '/', 'http://localhost');
  const parts = url.pathname.split('/').filter(Boolean);

  if (req.method === 'GET' && url.pathname === '/_stats') return send(res, 200, stats);
  if (req.method === 'POST' && url.pathname === '/_control') {
    const body = (await readBody(req)) ?? {};
    if (body.reset) {
      jobs.clear();
      byIdempotencyKey.clear();
      for (const key of Object.keys(stats)) stats[key] = 0;
      flaky = [];
    }
    if (Array.isArray(body.flaky)) {
      flaky = body.flaky.map(String);
      flakyIndex = 0;
    }
    if (typeof body.slowMs === 'number') slowMs = body.slowMs;
    if (typeof body.hangMs === 'number') hangMs = body.hangMs;
    return send(res, 200, { flaky, slowMs, hangMs });
  }
  if (req.method === 'POST' && parts[0] === '_jobs' && parts[2] === 'advance') {
    const job = jobs.get(parts[1] === 'latest' ? lastJobId : parts[1]);
    if (!job) return send(res, 404, { error: { message: `no job ${parts[1]}` } });
    const body = (await readBody(req)) ?? {};
    job.done = Math.min(job.steps, job.done + (Number.isInteger(body.steps) ? body.steps : 1));
    return send(res, 200, view(job));
  }
  if (req.method === 'POST' && parts[0] === '_jobs' && parts[2] === 'fail') {
    const job = jobs.get(parts[1] === 'latest' ? lastJobId : parts[1]);
    if (!job) return send(res, 404, { error: { message: `no job ${parts[1]}` } });
    const body = (await readBody(req)) ?? {};
    view(job);
    if (job.state === 'queued' || job.state === 'running') {
      job.state = 'error';
      job.error = { message: String(body.message ?? 'failed by /_jobs/fail') };
    }
    return send(res, 200, view(job));
  }

  if (parts[0] !== 'jobs') return send(res, 404, { error: { message: `no route ${req.method} ${url.pathname}` } });
  stats.requests += 1;
  if (req.method === 'POST' && parts.length === 1) stats.submits += 1;
  if (token !== undefined && req.headers.authorization !== `Bearer ${token}`) {
    return send(res, 401, { error: { message: 'missing or wrong bearer token' } });
  }
  if (await misbehave(res)) return;

  if (req.method === 'POST' && parts.length === 1) {
    const body = await readBody(req);
    if (body === undefined || typeof body !== 'object' || Array.isArray(body)) {
      return send(res, 400, { error: { message: 'body must be a JSON object' } });
    }
    const steps = body.steps ?? 10;
    if (!Number.isInteger(steps) || steps < 0 || steps > 100_000) {
      return send(res, 422, { error: { message: 'steps must be an integer 0..100000' } });
    }
    const key = req.headers['idempotency-key'];
    const known = typeof key === 'string' ? byIdempotencyKey.get(key) : undefined;
    if (known) {
      return send(res, 202, { job: view(jobs.get(known)) }, { location: `/jobs/${known}` });
    }
    const id = randomUUID();
    const job = {
      id,
      steps,
      stepMs: typeof body.stepMs === 'number' ? body.stepMs : 200,
      fail: typeof body.fail === 'string' ? body.fail : undefined,
      manual: body.manual === true,
      input: body,
      state: 'queued',
      done: 0,
      startedAt: Date.now(),
    };
    jobs.set(id, job);
    lastJobId = id;
    if (typeof key === 'string') byIdempotencyKey.set(key, id);
    stats.jobsCreated += 1;
    return send(res, 202, { job: view(job) }, { location: `/jobs/${id}` });
  }

  const job = jobs.get(parts[1] ?? '');
  if (!job) return send(res, 404, { error: { message: `no job ${parts[1]}` } });
  if (req.method === 'GET' && parts.length === 2) {
    stats.polls += 1;
    return send(res, 200, view(job));
  }
  if (req.method === 'GET' && parts[2] === 'result' && parts.length === 3) {
    stats.results += 1;
    if (view(job).state !== 'done') return send(res, 409, { error: { message: `job ${job.id} is ${job.state}` } });
    return send(res, 200, { output: { jobId: job.id, steps: job.steps, input: job.input } });
  }
  if (req.method === 'GET' && parts[2] === 'log' && parts.length === 3) {
    res.writeHead(200, { 'content-type': 'text/plain; charset=utf-8' });
    res.end(`job ${job.id}: ${view(job).state} after ${job.done} of ${job.steps} steps\n`);
    return undefined;
  }
  if (req.method === 'DELETE' && parts.length === 2) {
    stats.cancels += 1;
    const state = view(job).state;
    if (state !== 'queued' && state !== 'running') {
      return send(res, 409, { error: { message: `job ${job.id} already ${state}` } });
    }
    job.state = 'canceled';
    return send(res, 200, view(job));
  }
  return send(res, 405, { error: { message: `${req.method} not allowed here` } });
}

const server = createServer((req, res) => {
  handle(req, res).catch((error) => send(res, 500, { error: { message: String(error) } }));
});
server.listen(port, '127.0.0.1', () => {
  const address = server.address();
  console.log(`fake batch service listening on http://127.0.0.1:${address.port}`);
});
const stop = () => {
  server.close(() => process.exit(0));
  server.closeAllConnections();
};
process.on('SIGTERM', stop);
process.on('SIGINT', stop);
