"""The emitted scripts are the build's, whole and unedited (PROTOCOL.md §29.2)."""

import hashlib
from importlib import metadata, resources

from taskrelay_worker.protocol import BULLMQ_PAIR, CODES, FIELDS, GENERATION, MANIFEST, SCRIPTS


def test_generation_is_the_digest_of_the_emitted_scripts():
    # scriptsGeneration() in packages/shared/src/protocol/scripts.ts: by name, in code point order, name-keys then source.
    digest = hashlib.sha256()
    for name in sorted(SCRIPTS):
        spec = SCRIPTS[name]
        digest.update(f"{name}-{len(spec.keys)}\n{spec.source}\n".encode())
    assert digest.hexdigest()[:16] == GENERATION


def test_every_script_is_resolved_and_declares_its_keys_and_args():
    for name, spec in SCRIPTS.items():
        assert "--- @include" not in spec.source, f"{name} has an unresolved include"
        header = spec.source.split("]]", 1)[0]
        for i, key in enumerate(spec.keys, start=1):
            assert f"KEYS[{i}] {key}" in " ".join(header.split()), f"{name} does not list KEYS[{i}] {key}"
        for i, arg in enumerate(spec.args, start=1):
            assert f"ARGV[{i}] {arg}" in " ".join(header.split()), f"{name} does not list ARGV[{i}] {arg}"
        assert set(spec.codes) <= set(CODES)


def test_the_worker_scripts_are_there():
    for name in ("startRun", "transition", "progress", "log", "suspend", "setState"):
        assert name in SCRIPTS
    assert FIELDS["status"] == "status"
    assert MANIFEST["cancelReasons"] == ["CLIENT_CANCELLED", "TIMEOUT", "WORKER_SHUTDOWN", "GATEWAY_SHUTDOWN", "LOCK_LOST"]


def test_bullmq_is_the_version_paired_with_node():
    assert metadata.version("bullmq") == BULLMQ_PAIR["python"]
    assert resources.files("bullmq").joinpath("commands/moveJobFromActiveToWait-9.lua").is_file()


def test_a_pool_is_named_as_the_node_worker_names_it():
    from taskrelay_worker.keys import tool_pool

    # Node: toolPool('default', [{ name: 'train', version: 'v1' }, { name: 'b' }]) (PROTOCOL.md §24.9).
    assert tool_pool("default", [("train", "v1"), ("b", "")]) == "default.629d9ad52315"
    assert tool_pool("default", [("train", "v1")]) != tool_pool("default", [("train", "v2")])
