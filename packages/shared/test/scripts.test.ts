/**
 * PROTOCOL.md §20 without Redis: the Lua commands load and match their declarations, the result codes have one
 * mapper, every status write goes through the transition table generated from `allowedSources()`, and the hash field
 * names come from TS. The transition check runs in a Lua VM (fengari), so it is the generated Lua that is tested.
 */
import { describe, expect, it } from 'vitest';
// @ts-expect-error fengari ships no types
import { lauxlib, lua, lualib, to_luastring } from 'fengari';
import { ResultCode, decodeReply, resultCodesLua } from '../src/protocol/script-results.js';
import {
  SCRIPTS,
  checkScript,
  foldConstants,
  loadScripts,
  readScripts,
  resolveScript,
  taskFieldsLua,
  transitionsLua,
  type ScriptSpec,
} from '../src/protocol/scripts.js';
import { TASK_FIELDS, TASK_FIELD_PREFIXES } from '../src/protocol/task-fields.js';
import { TASK_STATUSES, canTransition } from '../src/protocol/task-model.js';

/** Runs Lua source and returns the number it leaves on the stack. */
function runLua(source: string): number {
  const L = lauxlib.luaL_newstate();
  lualib.luaL_openlibs(L);
  if (lauxlib.luaL_dostring(L, to_luastring(source)) !== 0) {
    throw new Error(`Lua error: ${String(lua.lua_tojsstring(L, -1))}`);
  }
  return Number(lua.lua_tonumber(L, -1));
}

describe('§20 the Lua commands as files', () => {
  it('loads every declared script, its header listing exactly the declared KEYS and ARGV', () => {
    const sources = loadScripts();
    expect([...sources.keys()].map((s) => s.name).sort()).toEqual(Object.keys(SCRIPTS).sort());
    for (const [, source] of sources) expect(source).not.toMatch(/--- @include/);
  });

  it('refuses a script whose body reads an ARGV its header does not list', () => {
    const s: ScriptSpec = { name: 'x', keys: ['task'], args: ['a', 'b'], codes: [ResultCode.OK] };
    const header = '--[[\n  KEYS[1] task\n\n  ARGV[1] a\n  ARGV[2] b\n]]\n';
    expect(() => checkScript(s, `${header}return {ARGV[1], ARGV[2]}`)).not.toThrow();
    expect(() => checkScript(s, `${header}return ARGV[3]`)).toThrow(/reads ARGV\[3\] but declares 2/);
    expect(() => checkScript({ ...s, args: ['a', 'b', 'c'] }, `${header}return 1`)).toThrow(
      /header lists ARGV 1 a, 2 b, declared 1 a, 2 b, 3 c/,
    );
    expect(() => checkScript({ ...s, args: ['a', 'z'] }, `${header}return 1`)).toThrow(/header lists ARGV/);
  });
});

describe('§20 result codes: one enum, one mapper', () => {
  it('decodes a reply whose code the script declares, with what follows it', () => {
    expect(decodeReply('transition', SCRIPTS.transition.codes, [ResultCode.LOCK_LOST, 'working'])).toEqual({
      code: ResultCode.LOCK_LOST,
      values: ['working'],
    });
  });

  it('refuses a code the script does not declare, an unknown code and a reply that is no list', () => {
    expect(() => decodeReply('list', SCRIPTS.list.codes, [ResultCode.LOCK_LOST])).toThrow(
      /Lua script list answered code -2 \(LOCK_LOST\), not one of its codes \(OK\)/,
    );
    expect(() => decodeReply('list', SCRIPTS.list.codes, [-99])).toThrow(/code -99,/);
    expect(() => decodeReply('list', SCRIPTS.list.codes, 1)).toThrow(/answered nothing/);
    expect(() => decodeReply('list', SCRIPTS.list.codes, ['__lock_lost'])).toThrow(/answered "__lock_lost"/);
  });

  it('gives the Lua side the same numbers', () => {
    for (const [name, value] of Object.entries(ResultCode)) {
      if (typeof value === 'number') expect(runLua(`${resultCodesLua()} return R.${name}`)).toBe(value);
    }
  });
});

describe('§2 every status write goes through the transition table', () => {
  const moveStatus = resolveScript('transition', 7);

  it('allows in Lua exactly the moves the task model allows', () => {
    const code = (from: string | undefined, to: string) =>
      runLua(`${moveStatus.replace(/^[\s\S]*?\]\]/, '').split(/\nlocal (?:h|current) = /)[0]}
        return check_source(${from === undefined ? 'false' : JSON.stringify(from)}, ${JSON.stringify(to)})`);
    for (const from of TASK_STATUSES) {
      for (const to of TASK_STATUSES) {
        const expected = canTransition(from, to)
          ? ResultCode.OK
          : ['completed', 'failed', 'cancelled'].includes(from)
            ? ResultCode.TASK_TERMINAL
            : ResultCode.TRANSITION_REFUSED;
        expect(code(from, to), `${from} → ${to}`).toBe(expected);
      }
    }
    expect(code(undefined, 'failed')).toBe(ResultCode.TASK_MISSING);
    expect(transitionsLua()).toContain(
      'if to == "failed" then return from == "working" or from == "input_required" end',
    );
    // And the terminal set, in the folded script Redis runs as well.
    const terminal = (status: string) =>
      runLua(`${transitionsLua()} return is_terminal(${JSON.stringify(status)}) and 1 or 0`);
    for (const status of TASK_STATUSES)
      expect(terminal(status), status).toBe(['completed', 'failed', 'cancelled'].includes(status) ? 1 : 0);
  });

  it('has no script write the status field but move_status (creation aside)', () => {
    const statusWrite = /redis\.call\('HSET'[^\n]*F\.status\b/;
    for (const [s, source] of readScripts()) {
      const body = source.replace(/local function move_status[\s\S]*?\nend\n/, '');
      if (s.name !== 'create') expect(body, s.name).not.toMatch(statusWrite);
      expect(body, s.name).not.toMatch(/HSET[^\n]*'status'/);
    }
    for (const name of ['transition', 'reap', 'suspend', 'answer'] as const) {
      expect(readScripts().get(SCRIPTS[name]), name).toMatch(/move_status\(KEYS\[1\]|move_status\(taskKey/);
    }
  });
});

describe('§1 hash field names are defined once', () => {
  const names = new Set<string>([...Object.values(TASK_FIELDS), ...Object.values(TASK_FIELD_PREFIXES)]);
  const fieldKeys = new Set<string>([...Object.keys(TASK_FIELDS), ...Object.keys(TASK_FIELD_PREFIXES)]);

  it('leaves no field name as a literal in a hash command of any script', () => {
    const hashCall = /redis\.call\('H[A-Z]+',([^)]*)\)/g;
    for (const [s, source] of readScripts()) {
      for (const call of source.matchAll(hashCall)) {
        for (const literal of (call[1] ?? '').matchAll(/'([^']*)'/g)) {
          expect(names.has(literal[1] ?? ''), `${s.name}: ${call[0]}`).toBe(false);
        }
      }
    }
  });

  it('uses only fields TS defines', () => {
    for (const [s, source] of readScripts()) {
      for (const use of source.matchAll(/\bF\.(\w+)/g))
        expect(fieldKeys.has(use[1] ?? ''), `${s.name}: F.${use[1]}`).toBe(true);
    }
  });
});

describe('§20 the vocabulary tables are folded into the scripts Redis runs (issue 46)', () => {
  const tables = `${resultCodesLua()}${taskFieldsLua()}`;

  it('writes R.NAME and F.name as their values and drops the tables', () => {
    const folded = foldConstants(`${tables}return R.LOCK_LOST * 1000 + #(F.input .. F.status)`);
    expect(folded).not.toMatch(/local [RF] = \{/);
    expect(folded).toContain('"input:" .. "status"');
    expect(runLua(folded)).toBe(ResultCode.LOCK_LOST * 1000 + 'input:status'.length);
  });

  it('refuses a name the table does not hold, at load', () => {
    expect(() => foldConstants(`${tables}return F.noSuchField`, 'x')).toThrow(/x reads F\.noSuchField/);
  });

  it('keeps a table read by a value', () => {
    const folded = foldConstants(`${tables}local name = 'TASK_MISSING'\nreturn R[name] + R.OK`);
    expect(folded).toMatch(/^local R = \{/m);
    expect(folded).not.toMatch(/^local F = \{/m);
    expect(runLua(folded)).toBe(ResultCode.TASK_MISSING + ResultCode.OK);
  });

  it('leaves no script building R, F, B or W on each call', () => {
    for (const [s, source] of loadScripts()) expect(source, s.name).not.toMatch(/^local [RFBW] = \{/m);
  });
});
