/**
 * Every relative link in README.md and docs/ (docs/design/, docs/architecture/ included) reaches a file, and its
 * `#anchor`, when it has one, a heading of that file (GitHub's slug) or an `<a id>` in it. PROTOCOL.md was split into
 * those folders (issue 47 item 6), and a moved section must not leave a link behind.
 *
 * Written by hand: a link, a heading and GitHub's slug rule are a few lines each, where a Markdown parser and a slugger
 * would be two more dependencies in a lockfile for one test.
 */
import { existsSync, readFileSync, readdirSync, statSync } from 'node:fs';
import { dirname, join, relative, resolve } from 'node:path';
import { describe, expect, it } from 'vitest';

const ROOT = resolve(import.meta.dirname, '..');

function markdownFiles(dir: string): string[] {
  return readdirSync(dir).flatMap((name) => {
    const path = join(dir, name);
    if (statSync(path).isDirectory()) return markdownFiles(path);
    return name.endsWith('.md') ? [path] : [];
  });
}

/** The lines outside fenced code blocks. */
function prose(text: string): string[] {
  let fenced = false;
  return text.split('\n').filter((line) => {
    if (/^\s*```/.test(line)) {
      fenced = !fenced;
      return false;
    }
    return !fenced;
  });
}

/** GitHub's heading anchor: lower case, only letters, numbers, spaces, `-` and `_`, spaces as `-`; repeats get `-n`. */
function anchorsOf(text: string): Set<string> {
  const anchors = new Set<string>();
  const seen = new Map<string, number>();
  for (const line of prose(text)) {
    const heading = /^#{1,6} (.*)$/.exec(line);
    if (heading) {
      const slug = (heading[1] ?? '')
        .trim()
        .toLowerCase()
        .replace(/[^\p{L}\p{N} _-]/gu, '')
        .replace(/ /g, '-');
      const n = seen.get(slug) ?? 0;
      seen.set(slug, n + 1);
      anchors.add(n === 0 ? slug : `${slug}-${n}`);
    }
    for (const id of line.matchAll(/<a id="([^"]+)"/g)) anchors.add(id[1] ?? '');
  }
  return anchors;
}

/** `[text](target)` links, less inline code spans (a link's syntax shown as code is no link). */
function linksOf(text: string): string[] {
  return prose(text).flatMap((line) =>
    [...line.replace(/`[^`]*`/g, '').matchAll(/\]\(([^)\s]+)\)/g)].map((m) => m[1] ?? ''),
  );
}

const FILES = [resolve(ROOT, 'README.md'), ...markdownFiles(resolve(ROOT, 'docs'))];

describe('links in README.md and docs/', () => {
  it('finds the split docs (a check that reads nothing passes nothing)', () => {
    const names = FILES.map((f) => relative(ROOT, f));
    expect(names).toEqual(expect.arrayContaining(['docs/PROTOCOL.md', 'docs/ARCHITECTURE.md']));
    expect(names.some((n) => n.startsWith('docs/design/'))).toBe(true);
    expect(names.some((n) => n.startsWith('docs/architecture/'))).toBe(true);
  });

  it.each(FILES.map((f) => [relative(ROOT, f), f]))(
    '%s: every relative link reaches its file and anchor',
    (_, file) => {
      const broken: string[] = [];
      for (const link of linksOf(readFileSync(file, 'utf8'))) {
        if (/^[a-z][a-z0-9+.-]*:/i.test(link)) continue; // https:, mailto:…
        const [path = '', anchor] = link.split('#');
        const target = path === '' ? file : resolve(dirname(file), decodeURIComponent(path));
        if (!existsSync(target)) {
          broken.push(`${link}: no such file`);
          continue;
        }
        if (anchor && target.endsWith('.md') && !anchorsOf(readFileSync(target, 'utf8')).has(anchor)) {
          broken.push(`${link}: no such anchor in ${relative(ROOT, target)}`);
        }
      }
      expect(broken).toEqual([]);
    },
  );
});
