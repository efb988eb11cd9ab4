/**
 * The fields of a batch hash (`P:batch:<taskId>`, PROTOCOL.md §26.2), named once. The Lua scripts get them as the
 * table `B` of a generated include (scripts.ts), as they get the task fields as `F`.
 */
export const BATCH_FIELDS = {
  /** The children's tool. */
  childTool: 'childTool',
  /** The pool the children's jobs go to (§3.2). */
  childPool: 'childPool',
  /** The pool of the parent's own job: where a child promotes it. */
  parentPool: 'parentPool',
  /** How many children (items). */
  size: 'size',
  /** Children whose jobs were added so far: indices `0 .. released − 1`. */
  released: 'released',
  /** Children recorded as completed / failed. */
  completed: 'completed',
  failed: 'failed',
  /** `1` when the first failure ends the batch. */
  failFast: 'failFast',
  /** Children in flight at most, as the tool asked. */
  concurrency: 'concurrency',
  /** Children in flight at most for the current release (the concurrency, or less under the open-work cap). */
  window: 'window',
  /** Whose batch it is (the parent's principal): the children's fair share and open-work cap (§25). */
  owner: 'owner',
  /** `1` once the batch stopped (fail-fast tripped): no child starts any more. */
  stopped: 'stopped',
  /**
   * The sharded layout (§26.10): the child tool's placed shard codes, comma-joined; child `i` queues on code
   * `i mod N`. Absent in the single layout.
   */
  childCodes: 'childCodes',
  /** When the batch was made (ms since epoch). */
  createdAtMs: 'createdAtMs',
} as const;

export type BatchField = (typeof BATCH_FIELDS)[keyof typeof BATCH_FIELDS];

/** The batch fields as the Lua table `B`. */
export function batchFieldsLua(): string {
  const entries = Object.entries(BATCH_FIELDS).map(([name, value]) => `${name} = ${JSON.stringify(value)}`);
  return `local B = {${entries.join(', ')}}\n`;
}
