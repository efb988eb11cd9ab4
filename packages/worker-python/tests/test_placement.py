"""The Python placement follows Node's rule (PROTOCOL.md §1.1, placement.ts ``chooseCode``): for the same placed codes,
masters and draws, both choose the same code."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from taskrelay_worker.placement import choose_code, master_of_slot, slot_of_code

REPOSITORY = Path(__file__).resolve().parents[3]

# Three masters as `redis-cli --cluster create` splits the slots, and a fourth range held by the first master again.
MASTERS = {"m1": [(0, 5460), (16000, 16383)], "m2": [(5461, 10922)], "m3": [(10923, 15999)]}
DRAWS = [f"{(i * 7919 + 13) % 0x10000:04x}" for i in range(400)]
CASES = [[], ["0000"], ["0000", "0001", "0002"], [DRAWS[0], DRAWS[1]], ["ffff", "8000", "1234", "abcd"]]

NODE = """
const { chooseCode } = await import(process.argv[1]);
const { masters, draws, cases } = JSON.parse(process.argv[2]);
const map = new Map(Object.entries(masters));
const out = [];
for (const placed of cases) {
  let i = 0;
  const draw = () => draws[i++ % draws.length];
  out.push([chooseCode(placed, map, draw), chooseCode(placed, undefined, draw)]);
}
console.log(JSON.stringify(out));
"""


def _python(placed: list[str]) -> list[str]:
    draws = iter(DRAWS * 2)
    return [choose_code(placed, MASTERS, lambda: next(draws)), choose_code(placed, None, lambda: next(draws))]


@pytest.mark.skipif(shutil.which("node") is None, reason="needs Node (the repository's build)")
def test_python_chooses_the_code_node_chooses() -> None:
    # chooseCode is not in shared's index (its named exports, the store split): the placement module itself.
    shared = REPOSITORY / "packages/shared/dist/placement.js"
    if not shared.is_file():
        pytest.skip("packages/shared is not built (pnpm build)")
    payload = json.dumps({"masters": MASTERS, "draws": DRAWS, "cases": CASES})
    done = subprocess.run(
        ["node", "--input-type=module", "-e", NODE, shared.as_uri(), payload], capture_output=True, text=True, check=True
    )
    assert [_python(placed) for placed in CASES] == json.loads(done.stdout)


def test_a_new_code_goes_to_the_master_with_the_fewest() -> None:
    placed = [c for c in DRAWS if master_of_slot(MASTERS, slot_of_code(c)) == "m1"][:2]
    placed += [c for c in DRAWS if master_of_slot(MASTERS, slot_of_code(c)) == "m2"][:1]
    code = choose_code(placed, MASTERS, iter(DRAWS).__next__)
    assert master_of_slot(MASTERS, slot_of_code(code)) == "m3" and code not in placed
    # Slots as Redis hashes them (CRC16 of the whole code: a code has no braces).
    assert slot_of_code("abcd") == 10294
