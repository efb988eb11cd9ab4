#!/usr/bin/env node
// Renders a terminal capture (tmux `capture-pane -p -e`, ANSI colours) to a PNG with headless Chromium, for the
// README's picture of the CLI. Usage: node scripts/render-terminal.mjs <capture.ansi> <out.png> [title]
// The CLI's terminal test writes its capture to .tmp/cli-tty-capture.ansi.
import { readFileSync } from 'node:fs';
import { chromium } from 'playwright-core';

const [input, output, title = '$ taskrelay call build_report report=r{i} items=3000 delayMs={i}0 --task --parallel 3'] =
  process.argv.slice(2);
if (!input || !output) {
  console.error('usage: node scripts/render-terminal.mjs <capture.ansi> <out.png> [title]');
  process.exit(2);
}

const COLOURS = { 31: '#f85149', 32: '#3fb950', 33: '#d29922', 34: '#4aa3ff', 35: '#a371f7', 36: '#39c5cf' };
const escape = (s) => s.replace(/&/g, '&amp;').replace(/</g, '&lt;').replace(/>/g, '&gt;');

const ESC = String.fromCharCode(27);
const ESCAPE_SEQUENCE = new RegExp(`(${ESC}\\[[0-9;?]*[A-Za-z])`);
const SGR = new RegExp(`^${ESC}\\[([0-9;]*)m$`);

/** SGR colour codes to spans; every other escape sequence is dropped. */
function toHtml(text) {
  let html = '';
  let open = false;
  for (const part of text.split(ESCAPE_SEQUENCE)) {
    const sgr = SGR.exec(part);
    if (sgr) {
      if (open) html += '</span>';
      open = false;
      const colour = sgr[1]
        .split(';')
        .map(Number)
        .find((c) => COLOURS[c]);
      if (colour) {
        html += `<span style="color:${COLOURS[colour]}">`;
        open = true;
      }
    } else if (!part.startsWith(ESC)) html += escape(part);
  }
  return open ? `${html}</span>` : html;
}

const lines = readFileSync(input, 'utf8').replace(/\s+$/, '').split('\n');
const page = `<!doctype html><meta charset="utf-8"><style>
  body { margin:0; background:#0d1117; }
  .win { margin:16px; border-radius:8px; background:#161b22; box-shadow:0 4px 16px #0008; display:inline-block; }
  .bar { padding:8px 12px; color:#8b949e; font:12px system-ui, sans-serif; border-bottom:1px solid #30363d; }
  pre { margin:0; padding:12px 16px; color:#c9d1d9; font:13px/1.25 "DejaVu Sans Mono", ui-monospace, monospace; }
</style><div class="win"><div class="bar">${escape(title)}</div><pre>${lines.map(toHtml).join('\n')}</pre></div>`;

const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM_PATH ?? '/usr/bin/chromium',
  args: ['--no-sandbox', '--disable-gpu', '--no-first-run', '--disable-background-networking', '--disable-sync'],
});
const tab = await browser.newPage({ viewport: { width: 1200, height: 400 }, deviceScaleFactor: 1 });
await tab.setContent(page);
await tab.locator('.win').screenshot({ path: output });
await browser.close();
console.log(`wrote ${output}`);
