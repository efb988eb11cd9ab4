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

    def _write(self, level: str, args: tuple[Any, ...], fields: dict[str, Any]) -> None:
        if not self.enabled(level):
            return
        msg, fields = _message(args, fields)
        line: dict[str, Any] = {"level": LEVELS[level], "time": int(time.time() * 1000), **self._bindings}
        for key, value in fields.items():
            # A field never replaces the line's own (level, time, msg, pid, hostname, the logger's bindings such as
            # taskId, tool and attempt): it is written as `<name>_` beside it (PEP 8's trailing underscore).
            name = f"{key}_" if key in line or key == "msg" else key
            line[name] = _error_fields(value) if isinstance(value, BaseException) else value
        line["msg"] = msg
        stream = self._stream or sys.stdout
        stream.write(json.dumps(line, default=str, ensure_ascii=False, separators=(",", ":")) + "\n")
        stream.flush()
        if self._sink is not None:
            self._sink(level, msg, fields)

    # Each level takes a message and fields, as ``log.info("resized", width=640)``; also, as a Python developer or a
    # pino user would write it: ``log.info("resized %d images", n)`` (%-style arguments, as the logging module) and
    # ``log.info("resized", {"width": 640})`` or ``log.info({"width": 640}, "resized")`` (a dict of fields).

    def trace(self, *args: Any, **fields: Any) -> None:
        self._write("trace", args, fields)

    def debug(self, *args: Any, **fields: Any) -> None:
        self._write("debug", args, fields)

    def info(self, *args: Any, **fields: Any) -> None:
        self._write("info", args, fields)

    def warn(self, *args: Any, **fields: Any) -> None:
        self._write("warn", args, fields)

    #: ``warning`` as the logging module spells it.
    warning = warn

    def error(self, *args: Any, **fields: Any) -> None:
        self._write("error", args, fields)


def _message(args: tuple[Any, ...], fields: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """The message and fields of one call: ``(msg, *format_args)``, ``(msg, {fields})`` or ``({fields}, msg, ...)``."""
    if args and isinstance(args[0], dict):
        fields = {**args[0], **fields}
        args = args[1:]
    elif len(args) == 2 and isinstance(args[1], dict):
        fields = {**args[1], **fields}
        args = args[:1]
    if not args:
        return "", fields
    head, rest = args[0], args[1:]
    if isinstance(head, BaseException) and "err" not in fields:
        fields = {"err": head, **fields}
        return (str(rest[0]) if rest else str(head)), fields
    if not rest:
        return str(head), fields
    try:
        return str(head) % rest, fields
    except (TypeError, ValueError):
        # As the logging module would print it, without raising from a log call.
        return " ".join(str(a) for a in args), fields
