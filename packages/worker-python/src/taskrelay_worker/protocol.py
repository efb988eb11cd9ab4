"""The task store's Lua scripts and vocabulary, as the build emitted them (PROTOCOL.md §29.2).

``_generated/`` (made at build, never committed: the Node build and the wheel's build hook write it) holds every script of ``packages/shared/src/protocol/commands`` with its includes resolved, and ``manifest.json``:
each script's keys, arguments and result codes, the hash field names, the cancel reasons, the scripts generation and
the bullmq pair, the key templates of both layouts (read by ``keys.py``), the error codes and the message shapes as
JSON Schema. Nothing here restates the protocol by hand: a script renamed, a key or argument added, or a field
renamed in the TypeScript source reaches this package through the build.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources
from types import SimpleNamespace
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import best_match

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
#: Batch hash field names (``BATCH_FIELDS`` in batch-fields.ts; ``B.size`` in Lua is ``BATCH_FIELDS["size"]`` here).
BATCH_FIELDS: dict[str, str] = MANIFEST["batchFields"]
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

#: Every error code a task's ``error.code`` may carry (``ERROR_CODES``): ``ERROR.TOOL_FAILED`` is ``"TOOL_FAILED"``.
#: An attribute, not a string: a code renamed in TypeScript fails here at import, not on the wire.
ERROR_CODES: tuple[str, ...] = tuple(MANIFEST["errorCodes"])
ERROR = SimpleNamespace(**{code: code for code in ERROR_CODES})
#: Result code names as attributes: ``RESULT.LOCK_LOST`` is ``"LOCK_LOST"`` (what ``TaskStore.call`` answers).
RESULT = SimpleNamespace(**{name: name for name in CODES})
#: Cancel reasons as attributes: ``CANCEL.CLIENT_CANCELLED`` is ``"CLIENT_CANCELLED"``.
CANCEL = SimpleNamespace(**{reason: reason for reason in CANCEL_REASONS})
TASK_STATUSES: tuple[str, ...] = tuple(MANIFEST["taskStatuses"])
#: The JSON-RPC error numbers, by name (``JSON_RPC`` in errors.ts).
JSON_RPC: dict[str, int] = MANIFEST["jsonRpc"]
MAX_TOOL_SHARDS: int = MANIFEST["limits"]["maxToolShards"]

#: The message shapes (``messages.ts``) as JSON Schema, by name: ``jobData``, ``cancelRequest``, ``workerCatalog``...
MESSAGE_SCHEMAS: dict[str, dict[str, Any]] = MANIFEST["messages"]
# jsonschema (a well-kept validator) rather than pydantic models generated at build: the manifest's schemas are the
# check itself, read at run time, so the wheel's build hook stays a copy and no generated Python is ever written.
_VALIDATORS = {name: Draft202012Validator(schema) for name, schema in MESSAGE_SCHEMAS.items()}


def message_problem(name: str, value: Any) -> str | None:
    """What is wrong with a message of shape ``name`` (one line naming the first bad field), or None when it fits."""
    error = best_match(_VALIDATORS[name].iter_errors(value))
    if error is None:
        return None
    where = ".".join(str(p) for p in error.absolute_path)
    return f"{where}: {error.message}" if where else error.message
