"""Waitpoints (PROTOCOL.md §32), as the Node worker opens them: a token sealed with the deployment's key (a compact
JWE, ``dir`` + ``A256GCM``, through ``joserfc``, so the Node gateways open it with ``jose``), the waitpoint stored on the
task by the ``waitpointOpen`` script, and the gateways' public URL in front of its token."""

from __future__ import annotations

import base64
import hashlib
import json
import re
import secrets
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Awaitable, Callable

from joserfc import jwe
from joserfc.jwk import OctKey
from redis.asyncio import Redis

from .errors import TaskrelayError
from .keys import Keys
from .store import JobLock, TaskStore
from .protocol import ERROR

WAITPOINT_NAME = re.compile(r"[A-Za-z0-9._:-]{1,64}")
MIN_TIMEOUT_MS = 1_000
MAX_TIMEOUT_MS = 30 * 86_400_000
DEFAULT_TIMEOUT_MS = 86_400_000


def waitpoint_message(name: str) -> str:
    return f"waiting for an external event ({name})"


class WaitpointTokens:
    def __init__(self, key: bytes) -> None:
        self._key = OctKey.import_key(key)

    @classmethod
    async def create(cls, secret: str | None, redis: Redis, keys: Keys) -> "WaitpointTokens":
        """From ``secret`` (SHA-256 of it, as Node does) when given, else the random key stored once in Redis."""
        if secret is not None:
            return cls(hashlib.sha256(secret.encode()).digest())
        fresh = base64.urlsafe_b64encode(secrets.token_bytes(32)).rstrip(b"=").decode()
        await redis.set(keys.waitpoint_key, fresh, nx=True)
        stored = await redis.get(keys.waitpoint_key)
        if stored is None:
            raise RuntimeError(f"the waitpoint key {keys.waitpoint_key} vanished right after it was set")
        text = stored.decode() if isinstance(stored, bytes) else stored
        return cls(base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)))

    def seal(self, task_id: str, name: str) -> str:
        plain = json.dumps({"t": task_id, "n": name, "r": secrets.token_urlsafe(6)}, separators=(",", ":"))
        return jwe.encrypt_compact({"alg": "dir", "enc": "A256GCM"}, plain, self._key)


@dataclass
class Waitpoint:
    """A waitpoint a tool opened (``ctx.waitpoint``): hand ``url`` out, then ``await wp.wait()``."""

    name: str
    url: str
    timeout_at: datetime
    _wait: Callable[[], Awaitable[dict[str, Any]]]

    async def wait(self) -> dict[str, Any]:
        """``{"ok": True, "value": <the body>}`` once the URL was called, ``{"ok": False, "reason": "timeout"}`` once
        its time passed first. Suspends the run while neither happened (raises ``SuspendedError``: let it propagate)."""
        return await self._wait()


class WaitpointOpener:
    """Opens waitpoints for ``ctx.waitpoint``; the key is made at the first one."""

    def __init__(self, redis: Redis, keys: Keys, store: TaskStore, secret: str | None) -> None:
        self._redis = redis
        self._keys = keys
        self._store = store
        self._secret = secret
        self._tokens: WaitpointTokens | None = None

    async def open(self, task_id: str, lock: JobLock, name: str, timeout_ms: int) -> tuple[str, dict[str, Any] | None, str]:
        raw = await self._redis.get(self._keys.public_url)
        if raw is None:
            raise TaskrelayError(ERROR.INTERNAL, "ctx.waitpoint: no gateway has announced its public URL yet")
        base = raw.decode() if isinstance(raw, bytes) else raw
        if self._tokens is None:
            self._tokens = await WaitpointTokens.create(self._secret, self._redis, self._keys)
        outcome, record = await self._store.open_waitpoint(task_id, lock, name, self._tokens.seal(task_id, name), timeout_ms)
        url = f"{base}/waitpoints/{record['token']}" if record else ""
        return outcome, record, url


def as_datetime(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, tz=timezone.utc)


def check_waitpoint_args(name: Any, timeout_ms: Any) -> int:
    if not isinstance(name, str) or not WAITPOINT_NAME.fullmatch(name):
        raise ValueError(f"ctx.waitpoint: the name must be 1-64 of A-Z a-z 0-9 . _ : - (got {name!r})")
    value = DEFAULT_TIMEOUT_MS if timeout_ms is None else timeout_ms
    if not isinstance(value, int) or isinstance(value, bool) or not MIN_TIMEOUT_MS <= value <= MAX_TIMEOUT_MS:
        raise ValueError(f"ctx.waitpoint: timeout_ms must be an integer from 1000 to 30 days (got {timeout_ms!r})")
    return value


__all__ = ["Waitpoint", "WaitpointOpener", "WaitpointTokens", "waitpoint_message", "check_waitpoint_args", "as_datetime"]
