// Emits the task store's Lua scripts, includes resolved, for the Python worker (PROTOCOL.md §29.2): the same sources
// the Node processes load (scripts.ts `loadScripts`), written as files beside a manifest of their keys, arguments and
// result codes, the hash field names and the scripts generation. The Python worker runs these files and never a copy
// kept by hand. The files are not committed: scripts/build.mjs runs this after tsc (it reads the compiled shared
// package), so an editable install (`pip install -e`) finds them, and the wheel's build hook
// (packages/worker-python/hatch_build.py) runs it too, so a wheel always carries the scripts of its checkout.
import { existsSync, mkdirSync, readFileSync, readdirSync, rmSync, writeFileSync } from 'node:fs';

const python = new URL('../worker-python/', import.meta.url);
// A build without the Python package (the Node image copies only the Node packages) has nothing to emit.
if (!existsSync(new URL('pyproject.toml', python))) process.exit(0);

const shared = new URL('./dist/protocol/', import.meta.url);
const { loadScripts, scriptsGeneration, protocolManifest, ResultCode } = await import(new URL('index.js', shared).href);
// The ctx surface, declared once in the worker (packages/worker/src/context-surface.ts): Python's ToolContext is
// checked against it (packages/worker-python/tests/test_context_surface.py).
const { contextManifest } = await import(new URL('../worker/dist/context-surface.js', import.meta.url).href);

const out = new URL('src/taskrelay_worker/_generated/', python);

const nodeBullmq = JSON.parse(readFileSync(new URL('../worker/package.json', import.meta.url), 'utf8')).dependencies
  .bullmq;
const pythonBullmq = /"bullmq==([^"]+)"/.exec(readFileSync(new URL('pyproject.toml', python), 'utf8'))?.[1];
if (!pythonBullmq) throw new Error('packages/worker-python/pyproject.toml pins no bullmq==<version>');

/**
 * Writes `text` unless the file already holds it: the wheel's build hook runs this while tests may be starting Python
 * workers that read these files, so an unchanged file is never rewritten (nor briefly missing).
 */
function writeIfChanged(file, text) {
  const url = new URL(file, out);
  if (existsSync(url) && readFileSync(url, 'utf8') === text) return;
  writeFileSync(url, text);
}

const scripts = {};
mkdirSync(out, { recursive: true });
for (const [spec, source] of loadScripts()) {
  const file = `${spec.name}-${spec.keys.length}.lua`;
  writeIfChanged(file, source);
  scripts[spec.name] = {
    file,
    keys: [...spec.keys],
    args: [...spec.args],
    codes: spec.codes.map((code) => ResultCode[code]),
  };
}
const manifest = {
  generated: 'by packages/shared/emit-python-lua.mjs (the build) from packages/shared/src/protocol: do not edit',
  generation: scriptsGeneration(),
  bullmq: { node: nodeBullmq, python: pythonBullmq },
  // Keys of both layouts, result and error codes, task fields, statuses, cancel reasons, message shapes (§29.2).
  ...protocolManifest(),
  context: contextManifest(),
  scripts: Object.fromEntries(Object.entries(scripts).sort(([a], [b]) => a.localeCompare(b))),
};
writeIfChanged('manifest.json', `${JSON.stringify(manifest, null, 2)}\n`);
// A script renamed or removed leaves its old file: remove what the manifest no longer names.
const named = new Set(Object.values(scripts).map((script) => script.file));
for (const file of readdirSync(out)) if (file.endsWith('.lua') && !named.has(file)) rmSync(new URL(file, out));
