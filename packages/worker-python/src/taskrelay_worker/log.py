"""JSON-lines logging with the Node worker's shape (pino): ``level`` as a number, ``time`` in ms, ``msg``."""

from __future__ import annotations

import json
import os
import socket
import sys
import time
import traceback
from typing import Any, Callable, TextIO

#: Called with each enabled line's level, message and own fields (not the logger's bindings).
Sink = Callable[[str, str, dict[str, Any]], None]

LEVELS = {"trace": 10, "debug": 20, "info": 30, "warn": 40, "error": 50, "fatal": 60, "silent": 100}


def _error_fields(error: BaseException) -> dict[str, Any]:
    fields: dict[str, Any] = {"type": type(error).__name__, "message": str(error)}
    stack = "".join(traceback.format_exception(error)).strip()
    if stack:
        fields["stack"] = stack
    code = getattr(error, "code", None)
    if isinstance(code, str):
        fields["code"] = code
    return fields


class Logger:
    def __init__(
        self,
        level: str = "info",
        bindings: dict[str, Any] | None = None,
        stream: TextIO | None = None,
        sink: Sink | None = None,
    ) -> None:
        if level not in LEVELS:
            raise ValueError(f"unknown log level {level}")
        self.level = level
        self._threshold = LEVELS[level]
        self._bindings = {"pid": os.getpid(), "hostname": socket.gethostname(), **(bindings or {})}
        self._stream = stream
        self._sink = sink

    def child(self, **bindings: Any) -> "Logger":
        return Logger(self.level, {**self._bindings, **bindings}, self._stream, self._sink)

    def with_sink(self, sink: Sink) -> "Logger":
        """This logger (same level and bindings), whose enabled lines, and its children's, also go to ``sink``."""
        return Logger(self.level, dict(self._bindings), self._stream, sink)

    def bind(self, **bindings: Any) -> None:
        self._bindings.update(bindings)

    def enabled(self, level: str) -> bool:
        return LEVELS[level] >= self._threshold

    def _write(self, level: str, msg: str, fields: dict[str, Any]) -> None:
        if not self.enabled(level):
            return
        line: dict[str, Any] = {"level": LEVELS[level], "time": int(time.time() * 1000), **self._bindings}
        for key, value in fields.items():
            line[key] = _error_fields(value) if isinstance(value, BaseException) else value
        line["msg"] = msg
        stream = self._stream or sys.stdout
        stream.write(json.dumps(line, default=str, ensure_ascii=False, separators=(",", ":")) + "\n")
        stream.flush()
        if self._sink is not None:
            self._sink(level, msg, fields)

    def trace(self, msg: str, **fields: Any) -> None:
        self._write("trace", msg, fields)

    def debug(self, msg: str, **fields: Any) -> None:
        self._write("debug", msg, fields)

    def info(self, msg: str, **fields: Any) -> None:
        self._write("info", msg, fields)

    def warn(self, msg: str, **fields: Any) -> None:
        self._write("warn", msg, fields)

    def error(self, msg: str, **fields: Any) -> None:
        self._write("error", msg, fields)
