"""A run's output and the values it stores apart from its result (PROTOCOL.md §34), as the Node worker's
``output.ts``: ``ctx.output.write`` / ``set`` (the partial output resource), ``ctx.artifact`` (files returned as
``resource_link``), and the result's blocks above the inline threshold moved out by reference when the run completes.
The same Lua scripts (``outputWrite``, ``blobPut``) write them."""

from __future__ import annotations

import asyncio
import base64
import json
import re
import secrets
from dataclasses import dataclass
from typing import Any, AsyncIterable
from urllib.parse import quote

from .store import JobLock, TaskStore
from .protocol import RESULT

_PUT_CHUNK_BYTES = 4 * 1024 * 1024
_MIME = re.compile(r"^[\w.+-]+/[\w.+-]+(\s*;.*)?$")
_TEXT_MIME = re.compile(r"^text/|^application/(json|xml|yaml|x-ndjson)")


class StoredBytesLimitError(ValueError):
    """A stored-bytes bound would be passed (PROTOCOL.md §34.4)."""


@dataclass(frozen=True)
class OutputLimits:
    inline_result_bytes: int = 1024 * 1024
    max_output_bytes: int = 1024 * 1024
    blob_ttl_ms: int = 86_400_000
    max_task_bytes: int = 64 * 1024 * 1024
    max_principal_bytes: int = 1024 * 1024 * 1024


def blob_uri(task_id: str, blob_id: str) -> str:
    return f"taskrelay://tasks/{quote(task_id, safe='')}/blobs/{quote(blob_id, safe='')}"


class TaskOutput:
    """``ctx.output``: ``await write(chunk)`` appends, ``await set(snapshot)`` replaces (PROTOCOL.md §34.2)."""

    def __init__(self, run: "RunOutput") -> None:
        self._run = run

    async def write(self, chunk: str) -> None:
        await self._run.write("append", chunk)

    async def set(self, snapshot: str) -> None:  # noqa: A003 - the Node API's name
        await self._run.write("set", snapshot)


class RunOutput:
    def __init__(
        self, store: TaskStore, limits: OutputLimits, task_id: str, principal: str, lock: JobLock | None, job_id: str, log: Any
    ) -> None:
        self._store = store
        self._limits = limits
        self._task_id = task_id
        self._principal = principal
        self._lock = lock
        self._job_id = job_id
        self._log = log
        self._order = asyncio.Lock()
        self._artifacts: list[dict[str, Any]] = []
        self.output = TaskOutput(self)

    def _lock_key(self) -> str:
        keys = self._store.keys
        if self._lock is None or self._lock.shard is not None:
            return keys.task(self._task_id)
        return keys.bull_job_lock(self._lock.queue, self._job_id)

    async def _lock_token(self) -> str | None:
        """The token the write's script checks, or '' (unchecked) for a lock on another shard than the task's (a batch
        child's in the sharded layout, §26.10), read here instead; None when that lock is not the run's any more."""
        if self._lock is None:
            return ""
        if self._lock.shard is None:
            return self._lock.token
        keys = self._store.keys.for_shard(self._lock.shard)
        held = await self._store.redis.get(keys.bull_job_lock_here(self._lock.queue, self._job_id))
        held = held.decode() if isinstance(held, bytes) else held
        return "" if held == self._lock.token else None

    async def write(self, mode: str, text: Any) -> None:
        if not isinstance(text, str):
            raise TypeError(f"ctx.output.{'write' if mode == 'append' else 'set'} takes a str")
        keys = self._store.keys
        async with self._order:
            token = await self._lock_token()
            if token is None:
                self._log.debug("output write dropped", outcome=RESULT.LOCK_LOST)
                return
            code, _ = await self._store.call(
                "outputWrite",
                {"task": keys.task(self._task_id), "lock": self._lock_key(), "output": keys.output_text(self._task_id)},
                {
                    "lockToken": token,
                    "mode": mode,
                    "chunk": text,
                    "maxBytes": str(self._limits.max_output_bytes),
                    "ttlMs": str(self._limits.blob_ttl_ms),
                    "channel": keys.for_task(self._task_id).resources_channel,
                    "taskId": self._task_id,
                    "publish": keys.publish_command,
                },
            )
        if code != RESULT.OK:
            self._log.debug("output write dropped", outcome=code)

    async def artifact(self, name: str, data: bytes | str | AsyncIterable[bytes | str], mime_type: str) -> dict[str, Any]:
        if not isinstance(name, str) or not 1 <= len(name) <= 200:
            raise TypeError("ctx.artifact: name must be a str of 1 to 200 characters")
        if not isinstance(mime_type, str) or not _MIME.match(mime_type):
            raise TypeError("ctx.artifact: mime_type must be a MIME type such as text/plain or image/png")
        meta = {"name": name, "mimeType": mime_type, "text": bool(_TEXT_MIME.match(mime_type)), "kind": "artifact"}
        link = await self._store_value(_chunks(data), meta, notify=True)
        self._artifacts.append(link)
        return link

    async def finish(self, result: dict[str, Any], inline_at_most: int | None = None) -> dict[str, Any]:
        """The result as stored: artifacts appended, large blocks moved out, then the whole if still large (§34.3)."""
        inline = min(self._limits.inline_result_bytes, inline_at_most or self._limits.inline_result_bytes)
        content = result.get("content") or []
        placed = {block.get("uri") for block in content if isinstance(block, dict)}
        moved_content = [await self._move_block(block, i, inline) for i, block in enumerate(content)]
        moved_content += [link for link in self._artifacts if link["uri"] not in placed]
        moved = {**result, "content": moved_content}
        encoded = json.dumps(moved, ensure_ascii=False, separators=(",", ":")).encode()
        if len(encoded) <= inline:
            return moved
        meta = {"name": "result.json", "mimeType": "application/json", "text": True, "kind": "result"}
        link = await self._store_value(_one(encoded), meta, notify=False)
        return {"content": [link], "isError": True} if moved.get("isError") is True else {"content": [link]}

    async def _move_block(self, block: Any, i: int, inline: int) -> Any:
        if not isinstance(block, dict):
            return block
        kind = block.get("type")
        if kind == "text" and isinstance(block.get("text"), str):
            data = block["text"].encode()
            if len(data) <= inline:
                return block
            meta = {"name": f"result-{i}.txt", "mimeType": "text/plain; charset=utf-8", "text": True, "kind": "result"}
            return await self._store_value(_one(data), meta, notify=False)
        if kind in ("image", "audio") and isinstance(block.get("data"), str):
            if len(block["data"]) <= inline:
                return block
            mime = block.get("mimeType") if isinstance(block.get("mimeType"), str) else "application/octet-stream"
            meta = {"name": f"result-{i}.bin", "mimeType": mime, "text": False, "kind": "result"}
            return await self._store_value(_one(base64.b64decode(block["data"])), meta, notify=False)
        return block

    async def _store_value(self, chunks: AsyncIterable[bytes], meta: dict[str, Any], notify: bool) -> dict[str, Any]:
        keys = self._store.keys
        blob_id = secrets.token_hex(12)
        size = 0
        first = True

        async def put(piece: bytes) -> None:
            nonlocal first, size
            token = await self._lock_token()
            code, values = (RESULT.LOCK_LOST, []) if token is None else await self._store.call(
                "blobPut",
                {
                    "task": keys.task(self._task_id),
                    "lock": self._lock_key(),
                    "blobs": keys.output_blobs(self._task_id),
                    "blob": keys.output_blob(self._task_id, blob_id),
                    "principalBytes": keys.for_task(self._task_id).principal_blob_bytes(self._principal),
                },
                {
                    "lockToken": token,
                    "blobId": blob_id,
                    "chunk": piece,
                    "append": "0" if first else "1",
                    "meta": json.dumps(meta) if first else "",
                    "taskMax": str(self._limits.max_task_bytes),
                    "principalMax": str(self._limits.max_principal_bytes),
                    "ttlMs": str(self._limits.blob_ttl_ms),
                    "channel": keys.for_task(self._task_id).resources_channel if notify else "",
                    "taskId": self._task_id,
                    "publish": keys.publish_command,
                },
            )
            if code == RESULT.LIMIT_FULL:
                bound = values[0].decode() if isinstance(values[0], bytes) else str(values[0])
                limit = self._limits.max_task_bytes if bound == "task" else self._limits.max_principal_bytes
                raise StoredBytesLimitError(
                    f"A {bound} may store at most {limit} bytes of results and artifacts "
                    f"(TASKRELAY_MAX_ARTIFACT_BYTES_PER_{bound.upper()})"
                )
            if code != RESULT.OK:
                raise RuntimeError(f"cannot store {meta['name']}: {code.lower()}")
            first = False
            size += len(piece)

        async for chunk in chunks:
            for at in range(0, len(chunk), _PUT_CHUNK_BYTES):
                await put(chunk[at : at + _PUT_CHUNK_BYTES])
        if first:
            await put(b"")
        return {"type": "resource_link", "uri": blob_uri(self._task_id, blob_id), "name": meta["name"], "mimeType": meta["mimeType"], "size": size}


async def _one(data: bytes) -> AsyncIterable[bytes]:
    yield data


async def _chunks(data: Any) -> AsyncIterable[bytes]:
    if isinstance(data, str):
        yield data.encode()
    elif isinstance(data, (bytes, bytearray, memoryview)):
        yield bytes(data)
    elif hasattr(data, "__aiter__"):
        async for chunk in data:
            if isinstance(chunk, str):
                yield chunk.encode()
            elif isinstance(chunk, (bytes, bytearray, memoryview)):
                yield bytes(chunk)
            else:
                raise TypeError("ctx.artifact: a stream must yield bytes or str chunks")
    else:
        raise TypeError("ctx.artifact: data must be bytes, a str or an async iterable of them")
