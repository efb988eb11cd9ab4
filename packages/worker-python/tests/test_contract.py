"""One contract for both languages (issue 47, PROTOCOL.md §29.2): the package spells no key, code or message shape by
hand, and a key Python builds is the key Node builds for the same inputs, in both layouts."""

from __future__ import annotations

import ast
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from taskrelay_worker import keys as keys_module
from taskrelay_worker.keys import Keys, fill, shard_of_task_id
from taskrelay_worker.protocol import CANCEL_REASONS, CODES, ERROR_CODES, MANIFEST, message_problem

PACKAGE = Path(keys_module.__file__).parent
REPOSITORY = PACKAGE.parents[3]


def _string_literals(path: Path) -> list[tuple[int, str]]:
    """The string constants of a module, docstrings left out (prose may name a key or a code)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docstrings = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
            docstrings.add(id(body[0].value))
    return [
        (node.lineno, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings
    ]


def _key_fragments() -> set[str]:
    """The fixed pieces of every key template (``:task:``, ``:webhooks:due``...): what a hand-written key contains."""
    out = set()
    for layout in MANIFEST["keys"]["layouts"].values():
        for template in layout.values():
            for piece in re.split(r"<\w+(?::uri)?>|\{home\}|\{|\}", template):
                if piece.startswith(":") and len(piece) >= 4:
                    out.add(piece)
    return out


def hand_written(path: Path) -> list[str]:
    fragments = _key_fragments()
    codes = set(ERROR_CODES) | set(CODES) | set(CANCEL_REASONS)
    found = []
    for line, value in _string_literals(path):
        if value in codes:
            found.append(f"{path.name}:{line}: code {value!r} (use ERROR.*, RESULT.* or CANCEL.* of protocol.py)")
        hit = next((f for f in sorted(fragments) if f in value), None)
        if hit is not None:
            found.append(f"{path.name}:{line}: key piece {hit!r} in {value!r} (use keys.py, filled from the manifest)")
    return found


def _modules() -> list[Path]:
    """Every module of the package, the engine's sub-package included."""
    return sorted(PACKAGE.rglob("*.py"))


def test_no_module_spells_a_key_or_a_code_by_hand() -> None:
    found = [hit for path in _modules() for hit in hand_written(path)]
    assert found == [], "\n".join(found)


def test_the_scan_reaches_the_engine_modules() -> None:
    names = {path.relative_to(PACKAGE).as_posix() for path in _modules()}
    assert {"engine/job_run.py", "engine/child_run.py", "engine/cancel_watch.py"} <= names


def test_the_scan_finds_a_hand_written_key_and_code(tmp_path: Path) -> None:
    module = tmp_path / "bad.py"
    module.write_text('"""A docstring may say :task: and LOCK_LOST."""\nKEY = f"{p}:task:{i}"\nCODE = "LOCK_LOST"\n')
    found = sorted(hand_written(module))
    assert len(found) == 2 and "key piece ':task:'" in found[0] and "code 'LOCK_LOST'" in found[1]


INPUTS = {
    "taskId": "a1b2c3d4e5f60718293a4b5c6d7e8f901234",
    "principal": "alice@example.com/ops:x y<z>é",
    "queue": "default~echo",
    "scope": "shared/limit x",
    "keyDigest": "kd",
    "workerId": "w-1",
    "blobId": "b1",
}

NODE_KEYS = """
const { createKeys } = await import(process.argv[1]);
const v = JSON.parse(process.argv[2]);
const out = {};
for (const [layout, prefix] of [['single', 'taskrelay'], ['single', '{tr}'], ['sharded', 'tr']]) {
  const base = createKeys(prefix, layout);
  const k = base.forTask(v.taskId);
  out[`${layout}:${prefix}`] = {
    task: k.task(v.taskId), taskLogs: k.taskLogs(v.taskId), live: k.live, retention: k.retention,
    bullPrefix: k.bullPrefix, queueName: k.queueName(v.queue), bullJobLock: k.bullJobLock(v.queue, `${v.taskId}.2`),
    fairShare: k.fairShare(v.queue, v.principal), principalOpenTasks: k.principalOpenTasks(v.principal),
    principalBlobBytes: k.principalBlobBytes(v.principal), outputText: k.output(v.taskId).text,
    outputBlob: k.output(v.taskId).blob(v.blobId), batchRunning: k.batch(v.taskId).running,
    versionWait: k.versionWait(v.taskId), webhookDue: k.webhooks.due, webhookEventPrefix: k.webhooks.eventPrefix,
    workers: base.workers, workerCatalog: base.workerCatalog(v.workerId), pools: base.pools, protocol: base.protocol,
    cancelChannel: base.cancelChannel, resourcesChannel: base.resourcesChannel,
    gatewayChannelPrefix: base.gatewayChannelPrefix, gatewayBacklogPrefix: base.gatewayBacklogPrefix,
    toolLimitSlots: base.toolLimit('slots', v.scope, v.keyDigest), toolLimitRate: base.toolLimit('rate', v.scope, v.keyDigest),
    slotWaitersBy: base.slotWaitersBy(v.scope, v.keyDigest), waitpointKey: base.waitpointKey, publicUrl: base.publicUrl,
    placement: base.placement, placementLease: base.placementLease, homeLive: base.live,
  };
}
console.log(JSON.stringify(out));
"""


def _python_keys(layout: str, prefix: str) -> dict[str, object]:
    v = INPUTS
    base = Keys(prefix, layout)
    k = base.for_task(v["taskId"])
    slots = base.tool_limit("slots", v["scope"], v["keyDigest"])
    rate = base.tool_limit("rate", v["scope"], v["keyDigest"])
    return {
        "task": k.task(v["taskId"]),
        "taskLogs": k.task_logs(v["taskId"]),
        "live": k.live,
        "retention": k.retention,
        "bullPrefix": k.bull_prefix,
        "queueName": k.queue_name(v["queue"]),
        # From the home keys: the job id alone names the shard.
        "bullJobLock": base.bull_job_lock(v["queue"], f"{v['taskId']}.2"),
        "fairShare": k.fair_share(v["queue"], v["principal"]),
        "principalOpenTasks": k.principal_open_tasks(v["principal"]),
        "principalBlobBytes": k.principal_blob_bytes(v["principal"]),
        "outputText": base.output_text(v["taskId"]),
        "outputBlob": base.output_blob(v["taskId"], v["blobId"]),
        "batchRunning": base.batch(v["taskId"], "running"),
        "versionWait": base.version_wait(v["taskId"]),
        "webhookDue": k.webhook_due,
        "webhookEventPrefix": k.webhook_event_prefix,
        "workers": base.workers,
        "workerCatalog": base.worker_catalog(v["workerId"]),
        "pools": base.pools,
        "protocol": base.protocol,
        "cancelChannel": base.cancel_channel,
        "resourcesChannel": base.resources_channel,
        "gatewayChannelPrefix": base.gateway_channel_prefix,
        "gatewayBacklogPrefix": base.gateway_backlog_prefix,
        "toolLimitSlots": {"a": slots[0], "b": slots[1]},
        "toolLimitRate": {"a": rate[0], "b": rate[1]},
        "slotWaitersBy": base.slot_waiters_by(v["scope"], v["keyDigest"]),
        "waitpointKey": base.waitpoint_key,
        "publicUrl": base.public_url,
        "placement": base.placement,
        "placementLease": base.placement_lease,
        "homeLive": base.live,
    }


@pytest.mark.skipif(shutil.which("node") is None, reason="needs Node (the repository's build)")
def test_python_builds_the_keys_node_builds_in_both_layouts() -> None:
    protocol = REPOSITORY / "packages/shared/dist/protocol/index.js"
    if not protocol.is_file():
        pytest.skip("packages/shared is not built (pnpm build)")
    done = subprocess.run(
        ["node", "--input-type=module", "-e", NODE_KEYS, protocol.as_uri(), json.dumps(INPUTS)],
        capture_output=True,
        text=True,
        check=True,
    )
    node = json.loads(done.stdout)
    for name, (layout, prefix) in {
        "single:taskrelay": ("single", "taskrelay"),
        "single:{tr}": ("single", "{tr}"),
        "sharded:tr": ("sharded", "tr"),
    }.items():
        assert _python_keys(layout, prefix) == node[name], name
    # The sharded layout really is another layout: task keys under the id's code, the deployment's under {home}.
    assert node["sharded:tr"]["task"].startswith("tr:{a1b2}:task:")
    assert node["sharded:tr"]["workers"] == "tr:{home}:workers"


def test_shard_codes_and_templates() -> None:
    assert shard_of_task_id("a1b2" + "0" * 32) == "a1b2"
    assert shard_of_task_id("A1B2" + "0" * 32) is None
    assert shard_of_task_id("a1b2") is None
    # One pass: a value holding a placeholder is not filled again.
    assert fill("<prefix>:x:<id>", prefix="<id>", id="1") == "<id>:x:1"
    with pytest.raises(KeyError):
        fill("<prefix>:task:<taskId>", prefix="p")


def test_messages_are_checked_against_the_emitted_shapes() -> None:
    assert message_problem("cancelRequest", {"taskId": "t", "reason": CANCEL_REASONS[0]}) is None
    assert "reason" in (message_problem("cancelRequest", {"taskId": "t", "reason": "BECAUSE"}) or "")
    job = {"taskId": "t", "tool": "echo", "arguments": {}}
    assert message_problem("jobData", job) is None
    assert "arguments" in (message_problem("jobData", {**job, "arguments": []}) or "")
    assert message_problem("jobData", {"taskId": "t", "arguments": {}}) is not None


def test_a_tool_descriptor_fits_the_catalog_shape_the_gateway_reads() -> None:
    """What the worker publishes for each tool (§3.1) against the manifest's ``workerCatalog`` shape, options included."""
    from taskrelay_worker import define_tool

    async def run(args, ctx):  # pragma: no cover - never run
        return None

    tools = [
        define_tool(name="plain", description="d", run=run),
        define_tool(
            name="full",
            description="d",
            run=run,
            input_schema={"type": "object", "properties": {"tenant": {"type": "string"}}},
            timeout_ms=1_000,
            attempts=3,
            concurrency={"limit": 2, "key": ["tenant"]},
            priority=1,
            dedupe=True,
            shards=4,
        ),
    ]
    catalog = {
        "workerId": "w",
        "queue": "default.abc",
        "queueName": "default",
        "tools": [t.descriptor() for t in tools],
        "heartbeatAt": 1,
    }
    problem = message_problem("workerCatalog", catalog)
    assert problem is None, problem
    assert tools[1].descriptor()["shards"] == 4 and "shards" not in tools[0].descriptor()
    too_many = {**catalog, "tools": [{**tools[1].descriptor(), "shards": MANIFEST["limits"]["maxToolShards"] + 1}]}
    assert message_problem("workerCatalog", too_many) is not None


def test_define_tool_refuses_shards_out_of_bounds() -> None:
    from taskrelay_worker import define_tool

    async def run(args, ctx):  # pragma: no cover - never run
        return None

    for shards in (0, MANIFEST["limits"]["maxToolShards"] + 1, True, 1.5):
        with pytest.raises(ValueError, match="shards"):
            define_tool(name="t", description="d", run=run, shards=shards)
