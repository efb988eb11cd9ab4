/**
 * Runs recorded by the limit fixtures (test/fixtures/limited-tools.mjs, keyed-tools.mjs): each run appends
 * `{tool, e: 'start'|'end', pid, taskId, key?, at}` to one Redis list, one order across every worker process.
 */
import type { Redis } from 'ioredis';

export interface RunEvent {
  tool: string;
  e: 'start' | 'end';
  pid: number;
  taskId: string;
  /** The limit key the run had (keyed-tools.mjs: its tenant). */
  key?: string;
  at: number;
}

/** The recorded events of `tool`, from the list `listKey`. */
export async function runEvents(r: Redis, listKey: string, tool: string): Promise<RunEvent[]> {
  const lines = await r.lrange(listKey, 0, -1);
  return lines.map((l) => JSON.parse(l) as RunEvent).filter((e) => e.tool === tool);
}

/** The most runs open at once, from the start and end records (an end before a start of the same ms). */
export function mostAtOnce(list: readonly RunEvent[]): number {
  let open = 0;
  let most = 0;
  for (const e of [...list].sort((a, b) => a.at - b.at || (a.e === 'end' ? -1 : 1))) {
    open += e.e === 'start' ? 1 : -1;
    most = Math.max(most, open);
  }
  return most;
}
