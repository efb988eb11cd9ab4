"""The run's log lines kept with its task (PROTOCOL.md §30.4): shape, cut, batching and order."""

import asyncio
import json
from datetime import datetime, timezone

from taskrelay_worker.log import Logger
from taskrelay_worker.log_keeper import TaskLogKeeper, kept_line
from taskrelay_worker.store import MAX_KEPT_LOG_LINE_BYTES


class FakeStore:
    def __init__(self, fail_first: bool = False) -> None:
        self.writes: list[list[str]] = []
        self._fail = fail_first

    async def keep_logs(self, task_id: str, lines: list[str]) -> None:
        await asyncio.sleep(0.01)
        if self._fail:
            self._fail = False
            raise ConnectionError("down")
        self.writes.append(lines)


def test_kept_line_has_fields_then_level_message_time_attempt():
    at = datetime(2026, 12, 4, 6, 0, tzinfo=timezone.utc)
    line = json.loads(kept_line("warn", "upstream down", {"report": "q3", "err": ValueError("boom")}, 2, at))
    assert line == {"report": "q3", "err": "boom", "level": "warn", "msg": "upstream down", "time": "2026-12-04T06:00:00.000Z", "attempt": 2}


def test_kept_line_over_the_bound_is_cut_with_a_marker():
    line = kept_line("info", "é" * 3000, {"big": "y" * 5000}, 1)
    assert len(line.encode()) <= MAX_KEPT_LOG_LINE_BYTES
    parsed = json.loads(line)
    assert "big" not in parsed and parsed["msg"].endswith(f"(cut: the line was over {MAX_KEPT_LOG_LINE_BYTES} bytes)")


def test_enabled_lines_of_the_logger_and_its_children_are_kept_in_order_and_a_failed_write_is_dropped(capsys):
    async def run() -> FakeStore:
        store = FakeStore(fail_first=True)
        keeper = TaskLogKeeper(store, "t1", 1, Logger("warn"))
        log = keeper.wrap(Logger("info"))
        log.debug("not enabled")
        log.info("lost with the failed write")
        await keeper.flush()
        child = log.child(step="b")
        for i in range(150):
            child.info(f"line {i}")
        log.warn("last")
        await keeper.flush()
        return store

    store = asyncio.run(run())
    kept = [json.loads(line)["msg"] for batch in store.writes for line in batch]
    assert kept == [f"line {i}" for i in range(150)] + ["last"]
    # A burst of 100 is written at once, the rest on flush.
    assert [len(batch) for batch in store.writes] == [100, 51]
    assert "not enabled" not in capsys.readouterr().out
