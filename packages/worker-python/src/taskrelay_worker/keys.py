"""Redis key and channel names (PROTOCOL.md §1, §1.1), filled from the templates the build writes into the manifest.

``packages/shared/src/protocol/keys.ts`` builds every key; the build turns each one into a template
(``<prefix>:task:<taskId>``, ``<prefix>:principal:<principal:uri>:open``) for both layouts, so this module holds no key
string of its own: a key renamed in TypeScript reaches Python through the build (``tests/test_contract.py`` fails when
a module spells one by hand). ``<name>`` is filled with the value as it is, ``<name:uri>`` as JavaScript's
``encodeURIComponent`` writes it.

In the sharded layout (§1.1) a home key is under ``<prefix>:{home}`` and a shard key under ``<prefix>:{<code>}``: the
code is that of the task id a key is about (its first 4 characters, when hex), or of the tool shard (``for_shard``).
"""

from __future__ import annotations

import hashlib
import re
from urllib.parse import quote

from .protocol import MANIFEST

_KEYS = MANIFEST["keys"]
#: The hash tag of the sharded layout's deployment-wide keys.
HOME_TAG: str = _KEYS["homeTag"]
SHARD_CODE_LENGTH: int = _KEYS["shardCodeLength"]
_SHARD_CODE = re.compile(_KEYS["shardCodePattern"])
_HOLE = re.compile(r"<(\w+)(:uri)?>")
LAYOUTS: tuple[str, ...] = tuple(_KEYS["layouts"])


def encode_uri_component(value: str) -> str:
    """JavaScript's ``encodeURIComponent``: the keys that embed a principal are built with it on the Node side."""
    return quote(value, safe="-_.!~*'()")


def fill(template: str, **values: object) -> str:
    """One template filled in one pass (a value holding ``<x>`` is never filled again), as ``fillTemplate`` in TS."""

    def hole(match: re.Match[str]) -> str:
        name, uri = match.group(1), match.group(2)
        if name not in values:
            raise KeyError(f"key template {template} needs <{name}>")
        value = str(values[name])
        return encode_uri_component(value) if uri else value

    return _HOLE.sub(hole, template)


def is_shard_code(code: str) -> bool:
    return bool(_SHARD_CODE.fullmatch(code))


def shard_of_task_id(task_id: str) -> str | None:
    """The shard code a task id (or a batch child's ``<parent>.<index>``) of the sharded layout starts with, if any."""
    code = task_id[:SHARD_CODE_LENGTH]
    return code if len(task_id) > SHARD_CODE_LENGTH and is_shard_code(code) else None


def tool_queue(queue_name: str, tool: str) -> str:
    """The queue of one tool (§3.2)."""
    return fill(_KEYS["names"]["toolQueue"], queueName=queue_name, tool=tool)


def placement_field(queue: str, index: int) -> str:
    """The placement registry's field of shard ``index`` of a tool queue (§1.1)."""
    return fill(_KEYS["names"]["placementField"], queue=queue, index=index)


def batch_child_id(parent_id: str, index: int) -> str:
    """A batch child's job id (§26)."""
    return fill(_KEYS["names"]["batchChildId"], parentId=parent_id, index=index)


def tool_pool(queue: str, tools: list[str | tuple[str, str]]) -> str:
    """The catalog pool of a worker (§3.2, §24): its queue name and 12 hex digits of SHA-256 over its sorted tools,
    each ``name@version`` when given as ``(name, version)`` (§24.9: a new version is a new pool)."""
    entries = {t if isinstance(t, str) else (f"{t[0]}@{t[1]}" if t[1] else t[0]) for t in tools}
    digest = hashlib.sha256("\n".join(sorted(entries)).encode()).hexdigest()[:12]
    return f"{queue}.{digest}"


def queue_of_bull_name(bull_queue_name: str) -> str:
    """Our name of a queue from its BullMQ name: the ``queueName`` template's fixed head removed."""
    head = _KEYS["layouts"]["single"]["queueName"].split("<", 1)[0]
    return bull_queue_name[len(head) :] if bull_queue_name.startswith(head) else bull_queue_name


def parse_batch_child_id(job_id: str) -> tuple[str, int] | None:
    """The parent and index of a batch child's job id ``<parent>.<index>`` (§26.2; Node's ``parseBatchChildId``), or
    None for any other id: task ids are hex, so a dot is a child's."""
    parent, dot, index = job_id.rpartition(".")
    if not parent or not dot or not index.isdigit() or str(int(index)) != index:
        return None
    return parent, int(index)


class Keys:
    """The keys of one layout. In the sharded layout this object holds the home keys and fills a shard key with the
    code of the task id it is about; ``for_task``/``for_shard`` give the keys of one shard, whose per-shard names
    (``live``, ``retention``, the webhook outbox, ``bull_prefix``) are that shard's. In the single layout both return
    this object itself."""

    def __init__(self, prefix: str = "taskrelay", layout: str = "single", code: str | None = None) -> None:
        if layout not in _KEYS["layouts"]:
            raise ValueError(f"unknown key layout {layout!r} (one of {', '.join(LAYOUTS)})")
        self.prefix = prefix
        self.layout = layout
        #: The shard these keys are of; None: the single layout, or the sharded layout's home keys.
        self.code = code
        self._templates: dict[str, str] = _KEYS["layouts"][layout]
        self._shards: dict[str, Keys] = {}

    # Layout --------------------------------------------------------------------------------------------------------

    def _key(self, name: str, *, task_id: str | None = None, **values: object) -> str:
        code = self.code
        if task_id is not None and self.layout == "sharded":
            code = shard_of_task_id(task_id) or code
        return fill(self._templates[name], prefix=self.prefix, code=code if code is not None else HOME_TAG, **values)

    def for_shard(self, code: str) -> Keys:
        if self.layout == "single":
            return self
        keys = self._shards.get(code)
        if keys is None:
            keys = self._shards[code] = Keys(self.prefix, self.layout, code)
        return keys

    def for_task(self, task_id: str) -> Keys:
        """The keys of the shard a task id names; an id naming no shard gets these keys (its task is not found)."""
        code = shard_of_task_id(task_id) if self.layout == "sharded" else None
        return self if code is None else self.for_shard(code)

    def shard_of(self, task_id: str) -> str | None:
        return shard_of_task_id(task_id) if self.layout == "sharded" else None

    # Keys of a task (the shard of its id) ---------------------------------------------------------------------------

    def task(self, task_id: str) -> str:
        return self._key("task", task_id=task_id, taskId=task_id)

    def task_logs(self, task_id: str) -> str:
        """The stream of a task's kept log lines (PROTOCOL.md §30.4)."""
        return self._key("taskLogs", task_id=task_id, taskId=task_id)

    def version_wait(self, task_id: str) -> str:
        """When a run first deferred a task to a worker of its recorded tool version (§12.11)."""
        return self._key("versionWait", task_id=task_id, taskId=task_id)

    def bull_job_lock(self, queue: str, job_id: str) -> str:
        return self._key("bullJobLock", task_id=job_id, queue=queue, jobId=job_id)

    def bull_job_lock_here(self, queue: str, job_id: str) -> str:
        """The lock of a job in this shard's queue, whatever shard its id names (a batch child's, §26.10)."""
        return self._key("bullJobLock", queue=queue, jobId=job_id)

    def output_text(self, task_id: str) -> str:
        """A task's partial output (PROTOCOL.md §34.2)."""
        return self._key("output.text", task_id=task_id, taskId=task_id)

    def output_blobs(self, task_id: str) -> str:
        """A task's index of values stored apart (§34.3)."""
        return self._key("output.blobs", task_id=task_id, taskId=task_id)

    def output_blob(self, task_id: str, blob_id: str) -> str:
        return self._key("output.blob", task_id=task_id, taskId=task_id, blobId=blob_id)

    def batch_claim(self, child_id: str) -> str:
        """A batch child's outcome claimed on this shard, the first of its two record steps (sharded layout, §26.10)."""
        return self._key("batchClaim", childId=child_id)

    def batch(self, parent_id: str, member: str = "hash", *, here: bool = False) -> str:
        """One key of a batch (§26.2): ``hash``, ``items``, ``outcomes``, ``open`` or ``running``; ``here``: named on
        this shard, not the parent's (a re-add on a child's shard touches none of them, §26.10)."""
        return self._key(f"batch.{member}", task_id=None if here else parent_id, taskId=parent_id)

    # Keys of a shard (this object's) --------------------------------------------------------------------------------

    @property
    def task_key_prefix(self) -> str:
        return self._key("taskKeyPrefix")

    @property
    def live(self) -> str:
        return self._key("live")

    @property
    def retention(self) -> str:
        """The deployment's retention policy (PROTOCOL.md §30.1), which ending a task reads (a shard has its copy)."""
        return self._key("retention")

    @property
    def bull_prefix(self) -> str:
        """BullMQ's ``prefix`` option."""
        return self._key("bullPrefix")

    @property
    def webhook_event_prefix(self) -> str:
        return self._key("webhooks.eventPrefix")

    @property
    def webhook_due(self) -> str:
        return self._key("webhooks.due")

    @property
    def webhook_pending(self) -> str:
        return self._key("webhooks.pending")

    @property
    def webhook_dead(self) -> str:
        return self._key("webhooks.dead")

    def principal_blob_bytes(self, principal: str) -> str:
        return self._key("principalBlobBytes", principal=principal)

    def principal_open_tasks(self, principal: str) -> str:
        return self._key("principalOpenTasks", principal=principal)

    def fair_share(self, queue: str, principal: str) -> str:
        return self._key("fairShare", queue=queue, principal=principal)

    def queue_name(self, queue: str) -> str:
        """BullMQ's name of one of our queues."""
        return self._key("queueName", queue=queue)

    def bull_queue_key(self, queue: str) -> str:
        return f"{self._key('bullQueueKeyPrefix')}{queue}"

    # Home keys (the deployment's) -----------------------------------------------------------------------------------

    @property
    def workers(self) -> str:
        return self._key("workers")

    @property
    def pools(self) -> str:
        return self._key("pools")

    @property
    def protocol(self) -> str:
        return self._key("protocol")

    @property
    def placement(self) -> str:
        """The placement registry of the sharded layout (§1.1): ``<queue>~<tool>#<i>`` → shard code."""
        return self._key("placement")

    @property
    def placement_lease(self) -> str:
        return self._key("placementLease")

    @property
    def publish_command(self) -> str:
        """The publish command the scripts take (their ``publish`` argument, PROTOCOL.md §1.2): ``SPUBLISH`` on the
        sharded layout's channels, which hash with the task's shard; ``PUBLISH`` in the single layout."""
        return "SPUBLISH" if self.layout == "sharded" else "PUBLISH"

    @property
    def gateway_channel_prefix(self) -> str:
        return self._key("gatewayChannelPrefix")

    @property
    def gateway_channel_suffix(self) -> str:
        return self._key("gatewayChannelSuffix")

    @property
    def gateway_backlog_prefix(self) -> str:
        """The gateway's backlog hash (PROTOCOL.md §22.4), before the gateway id."""
        return self._key("gatewayBacklogPrefix")

    @property
    def gateway_backlog_suffix(self) -> str:
        return self._key("gatewayBacklogSuffix")

    @property
    def cancel_channel(self) -> str:
        return self._key("cancelChannel")

    @property
    def resources_channel(self) -> str:
        """Wake-ups of task resources (PROTOCOL.md §34.5)."""
        return self._key("resourcesChannel")

    @property
    def waitpoint_key(self) -> str:
        """The random key waitpoint tokens are sealed with when no secret is configured (PROTOCOL.md §32.2)."""
        return self._key("waitpointKey")

    @property
    def public_url(self) -> str:
        """The gateways' public base URL, put in front of a waitpoint's token (§32.2)."""
        return self._key("publicUrl")

    def worker_catalog(self, worker_id: str) -> str:
        return self._key("workerCatalog", workerId=worker_id)

    def tool_limit(self, kind: str, scope: str, key_digest: str) -> tuple[str, str]:
        """A worker-admitted limit's two keys (§3.5): ``slots``/``waiting``, or ``starts``/``hold`` of a rate limit."""
        return (
            self._key(f"toolLimit.{kind}.a", scope=scope, keyDigest=key_digest),
            self._key(f"toolLimit.{kind}.b", scope=scope, keyDigest=key_digest),
        )

    def slot_waiters_by(self, scope: str, key_digest: str) -> str:
        """Hash: the principal of each waiter of a per-key concurrency limit shared across principals (§3.5)."""
        return self._key("slotWaitersBy", scope=scope, keyDigest=key_digest)

    def gateway_channel(self, gateway_id: str) -> str:
        return self._key("gatewayChannel", gatewayId=gateway_id)
