"""Logs: JSON lines on stderr with ts/level/event and fields, the package's stdlib loggers in
the same form, text on a terminal, stdout empty, and a canary key never written anywhere."""

from __future__ import annotations

import io
import json
import logging
import re
from collections.abc import Iterator

import pytest

from fashiontag_pipeline._config import Secret
from fashiontag_pipeline.daemon.logs import RetryLineLimiter, configure_logging

CANARY = "canary-KEY-5f2b9c1e7d"
QUOTED_CANARY = 'canary"KEY\\with-escapes'
TS = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")


@pytest.fixture(autouse=True)
def restore_root_logger() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    for handler in list(root.handlers):
        root.removeHandler(handler)
        if handler not in handlers:
            handler.close()
    for handler in handlers:
        root.addHandler(handler)
    root.setLevel(level)
    logging.captureWarnings(False)


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def lines(stream: io.StringIO) -> list[dict[str, object]]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]


def test_json_lines_with_fields_and_package_loggers_in_the_same_form() -> None:
    stream = io.StringIO()
    configure_logging(log_format="json", stream=stream)
    logging.getLogger("fashiontag_pipeline.daemon").info(
        "manifest claimed", extra={"manifest": "cat.csv", "task_id": "t-1", "rows": 1200}
    )
    logging.getLogger("fashiontag_pipeline.engine").warning("task %s lost", "t-2")
    first, second = lines(stream)
    assert TS.match(str(first["ts"]))
    assert first["level"] == "info" and first["event"] == "manifest claimed"
    assert (first["manifest"], first["task_id"], first["rows"]) == ("cat.csv", "t-1", 1200)
    assert first["logger"] == "fashiontag_pipeline.daemon"
    assert second["level"] == "warning" and second["event"] == "task t-2 lost"
    assert second["logger"] == "fashiontag_pipeline.engine"


def test_stdout_stays_empty(capsys: pytest.CaptureFixture[str]) -> None:
    configure_logging(log_format="auto")  # stderr is not a terminal here: JSON
    logging.getLogger("fashiontag_pipeline.client").error("service unreachable")
    captured = capsys.readouterr()
    assert captured.out == ""
    [record] = [json.loads(line) for line in captured.err.splitlines()]
    assert record["event"] == "service unreachable"


def test_text_on_a_terminal() -> None:
    stream = Terminal()
    configure_logging(log_format="auto", stream=stream)
    logging.getLogger("fashiontag_pipeline.daemon").info("scanning", extra={"manifest": "a.csv"})
    line = stream.getvalue().strip()
    assert not line.startswith("{")
    assert "info" in line and "scanning" in line and "manifest=a.csv" in line


@pytest.mark.parametrize("log_format", ["json", "text"])
def test_a_configured_key_never_reaches_a_log(log_format: str) -> None:
    stream = io.StringIO()
    configure_logging(
        log_format=log_format,  # type: ignore[arg-type]
        stream=stream,
        secrets=[Secret(CANARY), QUOTED_CANARY, None, ""],
    )
    log = logging.getLogger("fashiontag_pipeline.client")
    log.warning("request with key %s refused", CANARY)
    log.warning("header", extra={"headers": {"X-Api-Key": CANARY}, "keys": [QUOTED_CANARY]})
    log.warning("a Secret object: %r", Secret(CANARY))
    try:
        raise RuntimeError(f"boom {CANARY} {QUOTED_CANARY}")
    except RuntimeError:
        log.exception("failed")
    text = stream.getvalue()
    assert text.count("\n") >= 4
    assert CANARY not in text
    assert QUOTED_CANARY not in text
    assert json.dumps(QUOTED_CANARY)[1:-1] not in text
    assert "********" in text
    if log_format == "json":
        records = lines(stream)
        assert records[0]["event"] == "request with key ******** refused"
        assert records[1]["headers"] == {"X-Api-Key": "********"}
        assert "RuntimeError" in str(records[3]["exc"])


def test_configuring_again_replaces_the_handler() -> None:
    first, second = io.StringIO(), io.StringIO()
    configure_logging(log_format="json", stream=first)
    configure_logging(log_format="json", stream=second)
    logging.getLogger("fashiontag_pipeline.daemon").warning("once")
    assert first.getvalue() == ""
    assert len(lines(second)) == 1


def test_retry_lines_are_bounded_and_counted() -> None:
    """The client's line per request retried (INFO) passes a few times a minute per logger;
    the rest are counted; warnings always pass, and "answers again" when a failure line of
    its logger passed since the last one."""
    now = [0.0]
    limiter = RetryLineLimiter(clock=lambda: now[0])
    client = logging.getLogger("fashiontag_pipeline.client")

    def passes(level: int, msg: str, logger: logging.Logger = client) -> bool:
        return limiter.filter(logger.makeRecord(logger.name, level, "f", 1, msg, (), None))

    assert [passes(logging.INFO, "%s; %s") for _ in range(5)] == [True, True] + [False] * 3
    assert passes(logging.WARNING, "%s; %s")
    assert passes(logging.INFO, "the service at %s answers again")
    assert passes(logging.INFO, "manifest claimed", logging.getLogger("fashiontag_pipeline.daemon"))
    assert limiter.take_left_out() == 3 and limiter.take_left_out() == 0
    # A streak whose failure lines were all left out ends unsaid (not counted: no retry).
    assert not passes(logging.INFO, "%s; %s")
    assert not passes(logging.INFO, "the service at %s answers again")
    assert limiter.take_left_out() == 1
    now[0] += 60.0
    assert passes(logging.INFO, "%s; %s")
    assert passes(logging.INFO, "the service at %s answers again")
    assert not passes(logging.INFO, "the service at %s answers again")
