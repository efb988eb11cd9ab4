/**
 * A schedule as its creator writes it (PROTOCOL.md §33.2): the same zod schema checks the admin API's body, the CLI's
 * request and each entry of `TASKRELAY_SCHEDULES_FILE`, so the three accept exactly the same thing.
 */
import { defaultRepeatStrategy } from 'bullmq';
import { z } from 'zod';

/**
 * What a firing does while the schedule's previous run has not ended:
 * - `skip`: nothing (the firing is counted as skipped);
 * - `queue`: waits until the previous run has ended, then starts; at most one firing waits, later ones are skipped;
 * - `cancel`: cancels the previous run, then starts.
 */
export const OVERLAP_POLICIES = ['skip', 'queue', 'cancel'] as const;
export type OverlapPolicy = (typeof OVERLAP_POLICIES)[number];

/** A schedule's id: its name, chosen by its creator, and the tag `schedule:<id>` its tasks carry (tags are ≤ 64). */
export const SCHEDULE_ID_PATTERN = /^[A-Za-z0-9_.-]{1,48}$/;
/** The shortest `every`: a schedule is not a busy loop. */
export const MIN_EVERY_MS = 1_000;
/** The most schedules one principal may own. */
export const MAX_SCHEDULES_PER_PRINCIPAL = 100;

function knownTimeZone(tz: string): boolean {
  try {
    new Intl.DateTimeFormat('en', { timeZone: tz });
    return true;
  } catch {
    return false;
  }
}

export const scheduleSpecSchema = z
  .object({
    /** 1..48 of `A-Z a-z 0-9 _ . -`. */
    id: z.string().regex(SCHEDULE_ID_PATTERN, 'must be 1 to 48 of A-Z a-z 0-9 _ . -'),
    /** The tool each firing calls. */
    tool: z.string().min(1).max(200),
    /** Its arguments, checked against the tool's schema when created and at each firing. Default `{}`. */
    arguments: z.record(z.string(), z.unknown()).default({}),
    /** A cron pattern (5 fields, or 6 with seconds first), read by BullMQ's job scheduler. */
    cron: z.string().trim().min(1).max(200).optional(),
    /** The time zone of `cron` (IANA, e.g. `Europe/Paris`). Default `UTC`. */
    tz: z
      .string()
      .min(1)
      .max(100)
      .refine(knownTimeZone, { message: 'must be an IANA time zone such as Europe/Paris' })
      .optional(),
    /** Instead of `cron`: a firing every this many ms (at least 1000). */
    every: z
      .number()
      .int()
      .min(MIN_EVERY_MS)
      .max(366 * 86_400_000)
      .optional(),
    /** What a firing does while the previous run has not ended. Default `skip`. */
    overlap: z.enum(OVERLAP_POLICIES).default('skip'),
    /** A completion webhook for every task it creates (docs/WEBHOOKS.md), checked as a call's is. */
    webhook: z.string().min(1).max(2048).optional(),
  })
  .strict()
  .refine((s) => (s.cron === undefined) !== (s.every === undefined), {
    message: 'give exactly one of cron and every',
    path: ['cron'],
  })
  .refine((s) => s.tz === undefined || s.cron !== undefined, { message: 'tz goes with cron', path: ['tz'] })
  .superRefine((s, ctx) => {
    if (s.cron === undefined) return;
    const problem = cronProblem(s.cron, s.tz);
    if (problem !== undefined) ctx.addIssue({ code: 'custom', message: problem, path: ['cron'] });
  });

/**
 * What is wrong with a cron pattern, read the way BullMQ's job scheduler reads it (its `defaultRepeatStrategy`, over
 * cron-parser): the gateway parses no cron of its own, and a pattern it accepts is one BullMQ fires.
 */
function cronProblem(pattern: string, tz: string | undefined): string | undefined {
  try {
    const next = defaultRepeatStrategy(Date.now(), { pattern, tz: tz ?? 'UTC' });
    return next === undefined ? 'never matches a time' : undefined;
  } catch (error) {
    return `is not a cron pattern BullMQ reads: ${error instanceof Error ? error.message : String(error)}`;
  }
}

export type ScheduleSpec = z.output<typeof scheduleSpecSchema>;

/** A file entry, and an operator's request: the same, with the principal that owns the schedule. */
export const ownedScheduleSchema = z.object({ principal: z.string().min(1).max(500).optional() }).loose();

/** A schedule as it is listed: what it was given, whose it is, and what it has done. */
export interface ScheduleView extends ScheduleSpec {
  principal: string;
  paused: boolean;
  /** `api` (the admin API or the CLI) or `file` (`TASKRELAY_SCHEDULES_FILE`). */
  source: 'api' | 'file';
  createdAt: string;
  /** When BullMQ's job scheduler fires it next (absent while paused). */
  next?: string;
  /** The task of its latest firing that created one. */
  lastTaskId?: string;
  lastFiredAt?: string;
  /** Firings that created a task. */
  runs: number;
  /** Firings that created none: skipped by the overlap policy, or refused (see `lastError`). */
  skipped: number;
  /** Why its latest refused firing created no task (an unknown tool, arguments that no longer fit…). */
  lastError?: string;
}

/** The first problem of a zod error as one line naming the field. */
export function specProblem(error: z.ZodError): string {
  const issue = error.issues[0];
  if (!issue) return 'invalid schedule';
  if (issue.code === 'unrecognized_keys') return `unknown field ${issue.keys.join(', ')}`;
  return `${issue.path.join('.') || 'schedule'} ${issue.message}`;
}
