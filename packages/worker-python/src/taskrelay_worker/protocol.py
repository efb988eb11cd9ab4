"""The task store's Lua scripts and vocabulary, as the build emitted them (PROTOCOL.md §29.2).

``_generated/`` (made at build, never committed: the Node build and the wheel's build hook write it) holds every script of ``packages/shared/src/protocol/commands`` with its includes resolved, and ``manifest.json``:
each script's keys, arguments and result codes, the hash field names, the cancel reasons, the scripts generation and
the bullmq pair. Nothing here restates the protocol by hand: a script renamed, a key or argument added, or a field
renamed in the TypeScript source reaches this package through the build.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources
from typing import Any

_DIR = resources.files(__package__) / "_generated"


@dataclass(frozen=True)
class ScriptSpec:
    name: str
    keys: tuple[str, ...]
    args: tuple[str, ...]
    codes: tuple[str, ...]
    source: str


def _load_manifest() -> dict[str, Any]:
    return json.loads((_DIR / "manifest.json").read_text(encoding="utf-8"))


MANIFEST: dict[str, Any] = _load_manifest()
#: 16 hex digits naming this build's scripts; the gateway records the generations it runs in ``P:protocol``.
GENERATION: str = MANIFEST["generation"]
#: The bullmq versions this build pairs: Node's and Python's run the same queue scripts on the same keys.
BULLMQ_PAIR: dict[str, str] = MANIFEST["bullmq"]
#: Result code name -> number (``OK`` = 1, ``LOCK_LOST`` = -2, ...).
CODES: dict[str, int] = MANIFEST["resultCodes"]
CODE_NAMES: dict[int, str] = {number: name for name, number in CODES.items()}
#: Task hash field names (``F.status`` in Lua is ``FIELDS["status"]`` here).
FIELDS: dict[str, str] = MANIFEST["fields"]
FIELD_PREFIXES: dict[str, str] = MANIFEST["fieldPrefixes"]
CANCEL_REASONS: tuple[str, ...] = tuple(MANIFEST["cancelReasons"])

SCRIPTS: dict[str, ScriptSpec] = {
    name: ScriptSpec(
        name=name,
        keys=tuple(spec["keys"]),
        args=tuple(spec["args"]),
        codes=tuple(spec["codes"]),
        source=(_DIR / spec["file"]).read_text(encoding="utf-8"),
    )
    for name, spec in MANIFEST["scripts"].items()
}
