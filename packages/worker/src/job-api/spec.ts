/**
 * The declarative part of a job-API tool, shared by `defineJobApiTool` and the `TASKRELAY_JOB_APIS` file: zod
 * schemas that apply the defaults and check every template and path once, at definition time.
 */
import { z } from 'zod';
import { isKnownToken, stringsIn, tokensOf } from './template.js';

export const TASK_OUTCOMES = ['working', 'completed', 'failed', 'cancelled'] as const;
/** What an external status maps to. */
export type ExternalOutcome = (typeof TASK_OUTCOMES)[number];

const METHODS = ['GET', 'POST', 'PUT', 'PATCH', 'DELETE'] as const;

/** Refuses `{{names}}` a template cannot have. */
function knownTokens(text: string, ctx: z.core.$RefinementCtx<unknown>, path: PropertyKey[] = []): void {
  for (const name of tokensOf(text)) {
    if (!isKnownToken(name)) {
      ctx.addIssue({
        code: 'custom',
        path,
        message: `unknown template {{${name}}} (use {{id}}, {{args}}, {{args.NAME}}, {{taskId}} or {{statusUrl}})`,
      });
    }
  }
}

const template = z.string().superRefine((text, ctx) => knownTokens(text, ctx));

/** A URL template: absolute http(s) once its templates are filled in, or starting with `{{statusUrl}}`. */
const urlTemplate = z
  .string()
  .min(1, { message: 'must not be empty' })
  .superRefine((text, ctx) => {
    knownTokens(text, ctx);
    const lead = /^\{\{\s*statusUrl\s*\}\}/.exec(text)?.[0] ?? '';
    if (tokensOf(text.slice(lead.length)).includes('statusUrl')) {
      ctx.addIssue({ code: 'custom', message: '{{statusUrl}} may only start a URL ({{statusUrl}}/result)' });
    }
    if (lead !== '') return;
    const sample = text.replace(/\{\{[^}]*\}\}/g, 'x');
    if (!/^https?:\/\//i.test(sample) || !URL.canParse(sample)) {
      ctx.addIssue({ code: 'custom', message: `must be an http:// or https:// URL (got "${text}")` });
      return;
    }
    // §23.3: where secrets go is decided by host, so a host must be the file's own, never a value's.
    const authority = /^https?:\/\/[^/?#]*/i.exec(text)?.[0] ?? '';
    if (tokensOf(authority).length > 0) {
      ctx.addIssue({ code: 'custom', message: `must name its host itself: no {{…}} before the path (got "${text}")` });
    }
  });

/** The origin of a URL template whose host is its own (templates only after it); undefined for `{{statusUrl}}…`. */
export function originOf(template: string): string | undefined {
  if (/^\{\{/.test(template)) return undefined;
  try {
    return new URL(template.replace(/\{\{[^}]*\}\}/g, 'x')).origin;
  } catch {
    return undefined;
  }
}

/** Where a value is in a response: a dot path into the JSON body, or `header:NAME`. */
const responsePath = z.string().regex(/^(header:[A-Za-z0-9-]+|\.|[^.\s][^\s]*)$/, {
  message: 'must be a dot path (a.b.0.c), "." or header:NAME',
});
const bodyPath = z.string().regex(/^(\.|[^.\s][^\s]*)$/, { message: 'must be a dot path (a.b.0.c) or "."' });

const headers = z.record(z.string().regex(/^[A-Za-z0-9!#$%&'*+.^_`|~-]+$/, { message: 'bad header name' }), template);
const query = z.record(z.string().min(1), z.union([template, z.number(), z.boolean()]));
const body = z.unknown().superRefine((value, ctx) => {
  for (const { path, text } of stringsIn(value)) knownTokens(text, ctx, path);
});

const request = (defaultMethod: (typeof METHODS)[number]) =>
  z.strictObject({
    method: z
      .string()
      .transform((m) => m.toUpperCase())
      .pipe(z.enum(METHODS, { message: `must be one of ${METHODS.join(', ')}` }))
      .default(defaultMethod),
    url: urlTemplate,
    query: query.optional(),
    headers: headers.optional(),
    body: body.optional(),
  });

export const SubmitSpecSchema = request('POST').extend({
  /** The body; `"{{args}}"` (the arguments as JSON) by default for POST, PUT and PATCH. */
  body: body.optional(),
  /** Where the external id is: a dot path into the submit answer, or `header:NAME`. */
  id: responsePath.optional(),
  /** Extension: where the status URL is (`header:Location` for a 202 + Location API); polls go there. */
  statusUrl: responsePath.optional(),
  /**
   * Send `Idempotency-Key: <taskId>` (true, the default), under another header name (a string), or not at all
   * (false).
   */
  idempotencyKey: z
    .union([z.boolean(), z.string().regex(/^[A-Za-z0-9-]+$/, { message: 'must be a header name' })])
    .default(true),
});

export const PollSpecSchema = request('GET')
  .extend({
    /** Default `{{statusUrl}}` when the submit gives one. */
    url: urlTemplate.optional(),
    /** Between two polls. Default 1000. */
    intervalMs: z.number().int().min(10, { message: 'must be at least 10' }).default(1000),
    /**
     * Extension: intervals at least this long suspend the run (no worker slot held, PROTOCOL.md §12.10); shorter ones
     * wait in the run. Default 5000.
     */
    suspendFromMs: z.number().int().min(0).default(5000),
    /** Extension: a run that has polled this long in-process suspends at its next wait anyway. Default 60000. */
    maxRunMs: z.number().int().min(0).default(60_000),
    /**
     * Extension: fail the task (and cancel the external job) when the job has not ended this long after its submit,
     * across every run. Default: none (the tool's `timeoutMs` bounds each run, not the whole wait).
     */
    maxWaitMs: z.number().int().positive().optional(),
    status: bodyPath,
    statusMap: z.record(z.string(), z.enum(TASK_OUTCOMES, { message: `must be one of ${TASK_OUTCOMES.join(', ')}` })),
    progress: bodyPath.optional(),
    total: bodyPath.optional(),
    message: bodyPath.optional(),
    error: bodyPath.optional(),
  })
  .refine((p) => Object.keys(p.statusMap).length > 0, { message: 'must map at least one status', path: ['statusMap'] });

export const ResultSpecSchema = request('GET').extend({
  /** Absent: the result is read from the last poll answer. */
  url: urlTemplate.optional(),
  /** Where the result is in the answer. Default `.` (all of it). */
  path: bodyPath.default('.'),
  /** Extension: `json`, `text` (any body, as a string) or `auto` (JSON when it parses; the default). */
  format: z.enum(['auto', 'json', 'text']).default('auto'),
});

export const CancelSpecSchema = request('DELETE');

export const HttpSpecSchema = z.strictObject({
  /** Per request. Default 10000. */
  timeoutMs: z.number().int().min(1).default(10_000),
  /** Tries per request on a transient failure, the first included. Default 5. */
  attempts: z.number().int().min(1).max(100).default(5),
  minDelayMs: z.number().int().min(0).default(200),
  maxDelayMs: z.number().int().min(0).default(10_000),
  /**
   * What a 3xx answer does (PROTOCOL.md §23.4): `none` (the default) fails the request, naming the redirect; `follow`
   * follows up to 5 of them, each sent with the file's headers and query only when its host is one the file names.
   */
  redirects: z.enum(['none', 'follow'], { message: 'must be "none" or "follow"' }).default('none'),
  /**
   * Hosts besides those of the file's own URLs that may receive its headers and query parameters (a status or result
   * host the submit answer points to): `host`, `host:port` or an origin (`https://host:port`). Default none.
   */
  trustedHosts: z
    .array(
      z.string().regex(/^(https?:\/\/)?[A-Za-z0-9.-]+(:\d{1,5})?$/, {
        message: 'must be a host, host:port or http(s)://host[:port]',
      }),
    )
    .default([]),
});

export const JobApiSpecSchema = z
  .strictObject({
    headers: headers.optional(),
    submit: SubmitSpecSchema,
    poll: PollSpecSchema,
    result: ResultSpecSchema.partial({ url: true }).optional(),
    cancel: CancelSpecSchema.optional(),
    http: HttpSpecSchema.default({
      timeoutMs: 10_000,
      attempts: 5,
      minDelayMs: 200,
      maxDelayMs: 10_000,
      redirects: 'none',
      trustedHosts: [],
    }),
  })
  .superRefine((spec, ctx) => {
    if (spec.submit.id === undefined && spec.submit.statusUrl === undefined) {
      ctx.addIssue({ code: 'custom', path: ['submit', 'id'], message: 'is required (or submit.statusUrl)' });
    }
    if (spec.poll.url === undefined && spec.submit.statusUrl === undefined) {
      ctx.addIssue({ code: 'custom', path: ['poll', 'url'], message: 'is required (or submit.statusUrl)' });
    }
  });

export type JobApiSpecInput = z.input<typeof JobApiSpecSchema>;
export type JobApiSpec = z.output<typeof JobApiSpecSchema>;
export type RequestSpec = z.output<ReturnType<typeof request>>;

/** One line naming the first bad field: `poll.statusMap.done: must be one of …`. */
export function firstIssue(error: z.ZodError): string {
  const issue = error.issues[0];
  if (!issue) return 'is invalid';
  const path = issue.path.map(String).join('.');
  return path === '' ? issue.message : `${path}: ${issue.message}`;
}
