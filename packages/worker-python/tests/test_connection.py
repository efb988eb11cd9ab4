"""bullmq's blocking wait for a job must outlast redis-py's default 5 s read timeout (engine.bull_connection): with it,
an idle worker's wait timed out, reconnected and backed off, and new jobs waited up to 20 s."""

import asyncio
import shutil
import socket
import subprocess
import time

import pytest
from bullmq.redis_connection import RedisConnection

from taskrelay_worker.engine import bull_connection


def test_the_options_carry_the_url_and_no_read_timeout():
    options = bull_connection("rediss://user:p%40ss@cache.example:6380/2")
    assert options["host"] == "cache.example" and options["port"] == 6380 and options["db"] == 2
    assert options["username"] == "user" and options["password"] == "p@ss" and options["ssl"] is True
    assert options["socket_timeout"] is None
    assert bull_connection("redis://127.0.0.1")["port"] == 6379


@pytest.mark.skipif(shutil.which("redis-server") is None, reason="needs redis-server on PATH")
def test_a_blocking_wait_longer_than_5_s_keeps_its_connection():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen(
        ["redis-server", "--port", str(port), "--save", "", "--appendonly", "no"], stdout=subprocess.DEVNULL
    )
    try:

        async def main():
            connection = RedisConnection(bull_connection(f"redis://127.0.0.1:{port}"))
            for _ in range(50):
                try:
                    await connection.conn.ping()
                    break
                except Exception:  # noqa: BLE001 - the server is starting
                    await asyncio.sleep(0.1)
            before = await connection.conn.client_id()
            started = time.monotonic()
            assert await connection.conn.bzpopmin("taskrelay:test:marker", 6) is None
            assert time.monotonic() - started >= 5.5
            assert await connection.conn.client_id() == before
            await connection.close()

        asyncio.run(main())
    finally:
        server.terminate()
        server.wait()
