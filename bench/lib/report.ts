/**
 * Results of one run: per-repetition values of every metric, the table of rows printed from them (min / median / max
 * over repetitions, a reference and the ratio), the machine, and the JSON file under bench/results/.
 */
import { mkdirSync, writeFileSync } from 'node:fs';
import { cpus, loadavg, release, totalmem } from 'node:os';
import { resolve } from 'node:path';
import * as prettier from 'prettier';
import { BENCH_DIR } from './procs.js';
import { spread, type Spread } from './stats.js';

export interface Machine {
  cpuModel: string;
  cores: number;
  memoryGiB: number;
  node: string;
  redis: string;
  kernel: string;
  loadavgAtStart: number[];
  loadavgAtEnd?: number[];
}

export function machine(redisVersion: string): Machine {
  const list = cpus();
  return {
    cpuModel: list[0]?.model.trim() ?? 'unknown',
    cores: list.length,
    memoryGiB: Math.round((totalmem() / 2 ** 30) * 10) / 10,
    node: process.version,
    redis: redisVersion,
    kernel: release(),
    loadavgAtStart: loadavg().map((v) => Math.round(v * 100) / 100),
  };
}

export interface ScenarioError {
  scenario: string;
  rep: number;
  message: string;
}

export class Results {
  /** metric id → one value per repetition (NaN when that repetition failed). */
  readonly values = new Map<string, number[]>();
  readonly errors: ScenarioError[] = [];

  add(id: string, value: number): void {
    const list = this.values.get(id) ?? [];
    list.push(value);
    this.values.set(id, list);
  }

  addAll(scenario: string, metrics: Record<string, number>): void {
    for (const [key, value] of Object.entries(metrics)) this.add(`${scenario}.${key}`, value);
  }

  get(id: string): Spread | undefined {
    return spread(this.values.get(id) ?? []);
  }
}

/** One printed row: a measured value and, optionally, the reference it is compared with. */
export interface RowSpec {
  group: string;
  label: string;
  unit: string;
  id: string;
  /** The reference row id (the SDK peer, or a floor) and its short name. */
  ref?: { id: string; name: string };
  /** Which way is better for the ratio: `higher` (throughput) or `lower` (latency, CPU, bytes). */
  better?: 'higher' | 'lower';
}

export interface RowResult extends RowSpec {
  value?: Spread;
  reference?: Spread;
  ratio?: number;
}

export function buildRows(results: Results, specs: RowSpec[]): RowResult[] {
  return specs.map((spec) => {
    const value = results.get(spec.id);
    const reference = spec.ref ? results.get(spec.ref.id) : undefined;
    const row: RowResult = { ...spec };
    if (value) row.value = value;
    if (reference) row.reference = reference;
    // A ratio means something only between two positive medians (a per-task heap delta can be noise around 0).
    if (value && reference && value.median > 0 && reference.median > 0) row.ratio = value.median / reference.median;
    return row;
  });
}

function fmt(v: number): string {
  const a = Math.abs(v);
  if (a >= 100_000) return `${(v / 1000).toFixed(0)}k`;
  if (a >= 1000) return v.toFixed(0);
  if (a >= 100) return v.toFixed(0);
  if (a >= 10) return v.toFixed(1);
  if (a >= 1) return v.toFixed(2);
  return v.toFixed(3);
}

function cell(s: Spread | undefined): string {
  if (!s) return '—';
  if (s.reps.length === 1 || s.min === s.max) return fmt(s.median);
  return `${fmt(s.median)} (${fmt(s.min)}–${fmt(s.max)})`;
}

/** The table as text: one line per row, grouped, columns padded. */
export function renderTable(rows: RowResult[]): string {
  const header = ['row', 'unit', 'taskrelay / value: median (min–max)', 'vs', 'reference: median (min–max)', 'ratio'];
  const lines: string[][] = [];
  let group = '';
  const groupLines: number[] = [];
  for (const row of rows) {
    if (row.group !== group) {
      group = row.group;
      groupLines.push(lines.length);
      lines.push([`[${group}]`, '', '', '', '', '']);
    }
    const ratio =
      row.ratio === undefined
        ? ''
        : `${row.ratio.toFixed(2)}${row.better === 'higher' ? ' ↑' : row.better ? ' ↓' : ''}`;
    lines.push([`  ${row.label}`, row.unit, cell(row.value), row.ref?.name ?? '', cell(row.reference), ratio]);
  }
  // A group's line is printed whole, above its rows: it does not widen the columns.
  const rowLines = lines.filter((_, i) => !groupLines.includes(i));
  const widths = header.map((h, i) => Math.max(h.length, ...rowLines.map((l) => l[i]!.length)));
  const pad = (cols: string[]) =>
    cols
      .map((c, i) => (i >= 2 && i !== 3 ? c.padStart(widths[i]!) : c.padEnd(widths[i]!)))
      .join('  ')
      .trimEnd();
  const out = [pad(header), widths.map((w) => '-'.repeat(w)).join('  ')];
  lines.forEach((l, i) => out.push(groupLines.includes(i) ? l[0]! : pad(l)));
  return out.join('\n');
}

/** Writes bench/results/<ISO date>.json, formatted by the repo's prettier config (so `pnpm lint` stays clean). */
export async function writeResults(data: unknown, startedAt: Date): Promise<string> {
  const dir = resolve(BENCH_DIR, 'results');
  mkdirSync(dir, { recursive: true });
  const file = resolve(dir, `${startedAt.toISOString().replace(/:/g, '-')}.json`);
  const options = (await prettier.resolveConfig(file)) ?? {};
  const text = await prettier.format(JSON.stringify(data), { ...options, parser: 'json' });
  writeFileSync(file, text);
  return file;
}
