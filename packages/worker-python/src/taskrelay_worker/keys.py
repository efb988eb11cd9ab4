"""Redis key and channel names (PROTOCOL.md §1), as ``packages/shared/src/keys.ts`` builds them."""

from __future__ import annotations

import hashlib
from urllib.parse import quote


def encode_uri_component(value: str) -> str:
    """JavaScript's ``encodeURIComponent``: the keys that embed a principal are built with it on the Node side."""
    return quote(value, safe="-_.!~*'()")


def tool_queue(queue_name: str, tool: str) -> str:
    """The queue of one tool (§3.2): ``<TASKRELAY_QUEUE>~<tool>``."""
    return f"{queue_name}~{tool}"


def tool_pool(queue: str, tools: list[str | tuple[str, str]]) -> str:
    """The catalog pool of a worker (§3.2, §24): its queue name and 12 hex digits of SHA-256 over its sorted tools,
    each ``name@version`` when given as ``(name, version)`` (§24.9: a new version is a new pool)."""
    entries = {t if isinstance(t, str) else (f"{t[0]}@{t[1]}" if t[1] else t[0]) for t in tools}
    digest = hashlib.sha256("\n".join(sorted(entries)).encode()).hexdigest()[:12]
    return f"{queue}.{digest}"


def queue_of_bull_name(bull_queue_name: str) -> str:
    return bull_queue_name[2:] if bull_queue_name.startswith("q-") else bull_queue_name


def parse_batch_child_id(job_id: str) -> tuple[str, int] | None:
    """The parent and index of a batch child's job id ``<parent>.<index>`` (§26.2; Node's ``parseBatchChildId``), or
    None for any other id: task ids are hex, so a dot is a child's."""
    parent, dot, index = job_id.rpartition(".")
    if not parent or not dot or not index.isdigit() or str(int(index)) != index:
        return None
    return parent, int(index)


class Keys:
    def __init__(self, prefix: str = "taskrelay") -> None:
        self.prefix = prefix
        self.task_key_prefix = f"{prefix}:task:"
        self.live = f"{prefix}:live"
        self.workers = f"{prefix}:workers"
        self.pools = f"{prefix}:pools"
        self.protocol = f"{prefix}:protocol"
        self.gateway_channel_prefix = f"{prefix}:gateway:"
        self.gateway_channel_suffix = ":events"
        # The gateway's backlog hash (PROTOCOL.md §22.4), as keys.ts names it.
        self.gateway_backlog_prefix = f"{prefix}:gateway:"
        self.gateway_backlog_suffix = ":backlog"
        self.cancel_channel = f"{prefix}:cancel"
        #: BullMQ's ``prefix`` option.
        self.bull_prefix = prefix
        self.webhook_event_prefix = f"{prefix}:webhook:"
        self.webhook_due = f"{prefix}:webhooks:due"
        self.webhook_pending = f"{prefix}:webhooks:pending"
        self.webhook_dead = f"{prefix}:webhooks:dead"
        #: The deployment's retention policy (PROTOCOL.md §30.1), which ending a task reads.
        self.retention = f"{prefix}:config:retention"
        #: Wake-ups of task resources (PROTOCOL.md §34.5).
        self.resources_channel = f"{prefix}:resources"

    def task(self, task_id: str) -> str:
        return f"{self.task_key_prefix}{task_id}"

    @property
    def waitpoint_key(self) -> str:
        """The random key waitpoint tokens are sealed with when no secret is configured (PROTOCOL.md §32.2)."""
        return f"{self.prefix}:waitpoint-key"

    @property
    def public_url(self) -> str:
        """The gateways' public base URL, put in front of a waitpoint's token (§32.2)."""
        return f"{self.prefix}:config:public-url"

    def task_logs(self, task_id: str) -> str:
        """The stream of a task's kept log lines (PROTOCOL.md §30.4)."""
        return f"{self.prefix}:task-logs:{task_id}"

    def worker_catalog(self, worker_id: str) -> str:
        return f"{self.prefix}:worker:{worker_id}:catalog"

    @staticmethod
    def queue_name(queue: str) -> str:
        """BullMQ's name of one of our queues."""
        return f"q-{queue}"

    def bull_queue_key(self, queue: str) -> str:
        return f"{self.bull_prefix}:{self.queue_name(queue)}"

    def bull_job_lock(self, queue: str, job_id: str) -> str:
        return f"{self.bull_queue_key(queue)}:{job_id}:lock"

    def output_text(self, task_id: str) -> str:
        """A task's partial output (PROTOCOL.md §34.2)."""
        return f"{self.prefix}:output:{task_id}"

    def output_blobs(self, task_id: str) -> str:
        """A task's index of values stored apart (§34.3)."""
        return f"{self.prefix}:blobs:{task_id}"

    def output_blob(self, task_id: str, blob_id: str) -> str:
        return f"{self.prefix}:blob:{task_id}:{blob_id}"

    def principal_blob_bytes(self, principal: str) -> str:
        return f"{self.prefix}:principal:{encode_uri_component(principal)}:blob-bytes"

    def principal_open_tasks(self, principal: str) -> str:
        return f"{self.prefix}:principal:{encode_uri_component(principal)}:open"

    def fair_share(self, queue: str, principal: str) -> str:
        return f"{self.prefix}:fair:{queue}:{encode_uri_component(principal)}"

    def tool_limit(self, kind: str, scope: str, key_digest: str) -> tuple[str, str]:
        """A worker-admitted limit's two keys (§3.5): ``slots``/``waiting``, or ``starts``/``hold`` of a rate limit."""
        base = f"{self.prefix}:limit:{kind}:{encode_uri_component(scope)}:{key_digest}"
        return (base, f"{base}:waiting") if kind == "slots" else (base, f"{base}:hold")

    def slot_waiters_by(self, scope: str, key_digest: str) -> str:
        """Hash: the principal of each waiter of a per-key concurrency limit shared across principals (§3.5)."""
        return f"{self.prefix}:limit:slots:{encode_uri_component(scope)}:{key_digest}:waiting:by"
