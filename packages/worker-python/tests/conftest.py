"""Fixtures shared by the tests that need a real Redis: one ``redis-server`` per test module, on a free port."""

from __future__ import annotations

import socket
import subprocess
import time
from collections.abc import Iterator

import pytest


@pytest.fixture(scope="module")
def redis_url() -> Iterator[str]:
    """A redis-server of the module's own (no persistence), stopped after its last test."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
        stdout=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                time.sleep(0.05)
        yield f"redis://127.0.0.1:{port}"
    finally:
        server.terminate()
        server.wait(timeout=10)
