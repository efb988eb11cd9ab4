/**
 * `TASKRELAY_SCHEDULES_FILE` (PROTOCOL.md §33.2; docs/OPERATIONS.md): schedules an operator keeps in a file, applied
 * by every gateway as it starts. YAML (JSON is YAML too):
 *
 *   schedules:
 *     - id: nightly-report
 *       principal: reports          # the owner of the tasks it creates
 *       cron: "0 2 * * *"
 *       tz: Europe/Paris
 *       tool: build_report
 *       arguments: { report: nightly, items: 100 }
 *       overlap: skip
 *
 * A file that cannot be read or does not fit throws a `ConfigError` naming the entry and the field: one line at start.
 */
import { readFile } from 'node:fs/promises';
import { parse as parseYaml } from 'yaml';
import { z } from 'zod';
import { ConfigError } from '@taskrelay/shared';
import { scheduleSpecSchema, specProblem, type ScheduleSpec } from './schedule-model.js';

const fileSchema = z
  .object({
    schedules: z
      .array(z.object({ principal: z.string().min(1).max(500) }).loose(), {
        error: 'must be a list (the file holds a top-level `schedules:` list)',
      })
      .max(1_000),
  })
  .strict();

export interface FileSchedule {
  spec: ScheduleSpec;
  principal: string;
}

export async function readSchedulesFile(path: string): Promise<FileSchedule[]> {
  const fail = (why: string) => new ConfigError(`Invalid TASKRELAY_SCHEDULES_FILE ${path}: ${why}`);
  let text: string;
  try {
    text = await readFile(path, 'utf8');
  } catch (error) {
    throw fail(`cannot be read (${(error as NodeJS.ErrnoException).code ?? String(error)})`);
  }
  let raw: unknown;
  try {
    raw = parseYaml(text);
  } catch (error) {
    throw fail(`not YAML: ${(error as Error).message.split('\n')[0] ?? ''}`);
  }
  const file = fileSchema.safeParse(raw ?? {});
  if (!file.success) throw fail(specProblem(file.error).replace(/^schedule /, ''));
  const seen = new Set<string>();
  return file.data.schedules.map((entry, i) => {
    const { principal, ...rest } = entry;
    const spec = scheduleSpecSchema.safeParse(rest);
    const name = typeof rest['id'] === 'string' ? rest['id'] : `#${i + 1}`;
    if (!spec.success) throw fail(`schedule ${name}: ${specProblem(spec.error)}`);
    if (seen.has(spec.data.id)) throw fail(`schedule ${name}: id listed twice`);
    seen.add(spec.data.id);
    return { spec: spec.data, principal };
  });
}
