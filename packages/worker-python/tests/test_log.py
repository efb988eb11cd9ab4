"""``ctx.log``'s calls (docs/PYTHON.md "Logging"): the natural forms work, and a field never replaces the line's own."""

from __future__ import annotations

import io
import json

from taskrelay_worker.log import Logger
from taskrelay_worker.log_keeper import kept_line


def lines_of(call) -> list[dict]:
    out = io.StringIO()
    log = Logger("debug", {"taskId": "t1", "tool": "resize", "attempt": 2}, stream=out)
    call(log)
    return [json.loads(line) for line in out.getvalue().splitlines()]


def test_message_and_keyword_fields():
    [line] = lines_of(lambda log: log.info("resized", width=640))
    assert line["msg"] == "resized" and line["width"] == 640 and line["level"] == 30


def test_percent_arguments_as_the_logging_module():
    [line] = lines_of(lambda log: log.info("resized %d images to %s", 3, "640px"))
    assert line["msg"] == "resized 3 images to 640px"


def test_a_dict_of_fields_after_or_before_the_message():
    after, before = lines_of(lambda log: (log.info("resized", {"width": 640}), log.warning({"width": 8}, "small")))
    assert (after["msg"], after["width"]) == ("resized", 640)
    assert (before["msg"], before["width"], before["level"]) == ("small", 8, 40)


def test_arguments_that_do_not_format_are_joined_not_raised():
    [line] = lines_of(lambda log: log.info("resized", 3, "images"))
    assert line["msg"] == "resized 3 images"


def test_an_exception_first_is_the_err_field():
    [line] = lines_of(lambda log: log.error(ValueError("boom"), "resize failed"))
    assert line["msg"] == "resize failed" and line["err"]["message"] == "boom"


def test_a_field_named_like_the_lines_own_is_written_beside_it():
    [line] = lines_of(lambda log: log.info("step", attempt=7, tool="mine", name="thumb", msg="x", level="high"))
    assert (line["attempt"], line["attempt_"]) == (2, 7)
    assert (line["tool"], line["tool_"]) == ("resize", "mine")
    assert (line["msg"], line["msg_"]) == ("step", "x")
    assert (line["level"], line["level_"]) == (30, "high")
    assert line["name"] == "thumb"


def test_a_kept_line_keeps_a_field_named_attempt():
    line = json.loads(kept_line("info", "step", {"attempt": 7, "n": 1}, 2))
    assert (line["attempt"], line["attempt_"], line["n"]) == (2, 7, 1)
