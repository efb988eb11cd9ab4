"""How ``ctx`` asks the client (PROTOCOL.md §12.2-§12.4): ``elicit``, ``sample`` and ``list_roots``, each a numbered
input request that suspends the run until its answer is stored, asked together when asked in one turn."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from .context_checks import _KEY, question_identity
from .context_types import Suspension, _Ask
from .errors import SuspendedError, TaskrelayError
from .log import Logger
from .protocol import ERROR
from .store import JobLock, TaskRecord, TaskStore


class InputAsks:
    """The asking members of ``ToolContext`` (a mixin: they share the run's lock, suspension and start)."""

    task_id: str
    log: Logger
    suspension: Suspension | None
    _store: TaskStore
    _lock: JobLock
    _caps: Any
    _input_timeout_ms: int

    def _init_asks(self, record: TaskRecord) -> None:
        """The questions the task asked before this run and their answers, by number (§12.3)."""
        self._answered: dict[str, Any] = dict(record.input_responses)
        self._stored = [
            {
                "n": int(n),
                "identity": question_identity(r.get("method", ""), r.get("params") or {}, r.get("key")),
                "key": r.get("key"),
                "position": r.get("position", int(n)),
            }
            for n, r in record.input_requests.items()
            if str(n).isdigit()
        ]
        self._used: set[int] = set()
        self._last_number = max([record.input_floor, *(r["n"] for r in self._stored)])
        self._requests = 0
        self._batch: list[_Ask] = []

    async def elicit(self, message: str, requested_schema: dict[str, Any], *, key: str | None = None) -> dict[str, Any]:
        """Asks the user (MCP elicitation, form mode). The task is ``input_required`` meanwhile and the run
        suspends: the handler runs again from the top when the answer comes, and this call then returns it at once
        (``{"action": "accept", "content": {...}}``, or ``decline`` / ``cancel``). Ask in the same order every run."""
        if not isinstance(message, str) or not message:
            raise ValueError("ctx.elicit: message must be a non-empty string")
        if not isinstance(requested_schema, dict) or requested_schema.get("type") != "object":
            raise ValueError("ctx.elicit: requested_schema must be a JSON Schema object ({'type': 'object', ...})")
        if not isinstance(requested_schema.get("properties"), dict):
            raise ValueError("ctx.elicit: requested_schema.properties must be an object")
        answer = await self._ask(
            "elicitation/create", "elicitation", {"message": message, "requestedSchema": requested_schema}, key
        )
        if not isinstance(answer, dict) or answer.get("action") not in ("accept", "decline", "cancel"):
            raise TaskrelayError(ERROR.INTERNAL, "The stored answer to elicitation/create is malformed")
        return answer

    async def sample(
        self, messages: list[dict[str, Any]], max_tokens: int, *, key: str | None = None, **params: Any
    ) -> dict[str, Any]:
        """Asks the client's model (MCP sampling), like ``elicit``; extra keyword arguments (``systemPrompt``...)
        go into the request as they are."""
        if not isinstance(messages, list) or not messages:
            raise ValueError("ctx.sample: messages must be a non-empty list")
        if not isinstance(max_tokens, int) or max_tokens <= 0:
            raise ValueError("ctx.sample: max_tokens must be a positive whole number")
        answer = await self._ask(
            "sampling/createMessage", "sampling", {"messages": messages, "maxTokens": max_tokens, **params}, key
        )
        if not isinstance(answer, dict) or "model" not in answer:
            raise TaskrelayError(ERROR.INTERNAL, "The stored answer to sampling/createMessage is malformed")
        return answer

    async def list_roots(self, *, key: str | None = None) -> dict[str, Any]:
        """Asks the client for its roots (MCP ``roots/list``), like ``elicit`` (capability ``roots``): the answer is
        ``{"roots": [{"uri": ..., "name"?: ...}, ...]}``, as the client sent it."""
        answer = await self._ask("roots/list", "roots", {}, key)
        roots = answer.get("roots") if isinstance(answer, dict) else None
        if not isinstance(roots, list) or not all(
            isinstance(r, dict) and isinstance(r.get("uri"), str) and isinstance(r.get("name", ""), str) for r in roots
        ):
            raise TaskrelayError(ERROR.INTERNAL, "The stored answer to roots/list is malformed")
        return answer

    # Batch fan-out (PROTOCOL.md §26, §29.4) ------------------------------------------------------------------------
    @property
    def answers(self) -> dict[str, Any]:
        return dict(self._answered)

    async def _ask(self, method: str, capability: str, params: dict[str, Any], key: str | None) -> Any:
        await self._started(True)
        if self.suspension is not None:
            raise SuspendedError()
        if key is not None:
            if not isinstance(key, str) or not _KEY.match(key):
                raise ValueError("key must be 1 to 100 of A-Z a-z 0-9 _ - .")
            if any(entry.key == key for entry in self._batch):
                raise ValueError(f"key {key} is already asked in this turn")
        self._requests += 1
        position = self._requests
        n = self._number_for(position, key, question_identity(method, params, key))
        if str(n) in self._answered:
            return self._answered[str(n)]
        self.throw_if_cancelled()
        if self._caps is not None and capability not in self._caps:
            raise TaskrelayError(
                ERROR.CAPABILITY_MISSING,
                f"The client of this task did not declare the {capability} capability, so it cannot be asked ({method})",
                {"capability": capability},
            )
        future: asyncio.Future = asyncio.get_running_loop().create_future()
        self._batch.append(_Ask(n, position, key, method, params, future))
        if len(self._batch) == 1:
            # Questions asked in the same turn (asyncio.gather) go out together, in one suspend.
            asyncio.get_running_loop().call_soon(lambda: asyncio.ensure_future(self._flush_batch()))
        return await future

    def _number_for(self, position: int, key: str | None, identity: str) -> int:
        """The request number of this ask (§12.3): the stored question it is, when unchanged; else a new one."""
        candidates = [
            r
            for r in self._stored
            if (r["key"] == key if key is not None else r["key"] is None and r["position"] == position)
            and r["n"] not in self._used
        ]
        latest = max(candidates, key=lambda r: r["n"], default=None)
        if latest is not None and latest["identity"] == identity:
            self._used.add(latest["n"])
            return latest["n"]
        if latest is not None:
            self.log.warn(
                "the question asked here changed since its answer was stored (a deploy?): asking it again",
                inputRequest=latest["n"],
                position=position,
            )
        self._last_number += 1
        self._used.add(self._last_number)
        return self._last_number

    async def _flush_batch(self) -> None:
        batch, self._batch = self._batch, []
        if not batch:
            return
        try:
            until = int(time.time() * 1000) + self._input_timeout_ms
            requests = []
            for entry in batch:
                request: dict[str, Any] = {"n": entry.n, "method": entry.method, "params": entry.params}
                if entry.key is not None:
                    request["key"] = entry.key
                request["position"] = entry.position
                requests.append(request)
            outcome, answers = await self._store.suspend(self.task_id, self._lock, until, requests)
            self._settle_suspend(outcome)
            waiting = [entry for entry in batch if str(entry.n) not in answers]
            if waiting:
                self.suspension = Suspension("input", until, waiting[0].n)
                self.log.info(
                    "input requested; run suspends until the answers",
                    inputRequests=[e.n for e in waiting],
                    methods=[e.method for e in waiting],
                )
            for entry in batch:
                if entry.future.done():
                    continue
                if str(entry.n) in answers:
                    self._answered[str(entry.n)] = answers[str(entry.n)]
                    entry.future.set_result(answers[str(entry.n)])
                else:
                    entry.future.set_exception(SuspendedError())
        except BaseException as error:  # noqa: BLE001 - every ask of the batch learns what went wrong
            for entry in batch:
                if not entry.future.done():
                    entry.future.set_exception(error)
