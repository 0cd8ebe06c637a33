"""Task and result expiry as a service that is not the reference one may have them.

The spec says a task expires 10 minutes after its creation, each PUT extending it, and that
results cannot be read after ``resultExpiredAt``; DESIGN.md fixes the rest for the reference
service (times in RFC 3339, a PUT after expiry 410). Each test stages a fair reading of the
spec that differs (times written as epoch numbers, a task's status answered 410 once it has
expired) in front of the reference service with a short TTL, drives ``fashiontag run`` over
HTTP, and checks the promises: every row once in the outputs, none billed twice (the service's
own count of images taken), exit code and summary right, no hang.
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import pytest

from fashiontag_pipeline._models import parse_time
from fashiontag_pipeline.service import ServiceConfig, running_service

from .helpers import ENV, Outcomes, ids_of, read_outcomes, run_args
from .proxy import MisbehavingProxy
from .test_other_readings import Rewriting

#: The time fields of the spec's answers (create/append, task list, status).
TIME_FIELDS = ("taskExpiredAt", "taskExpireAt", "resultExpiredAt", "createDate")


@dataclass
class Run:
    code: int
    summary: dict[str, Any]
    outcomes: Outcomes
    #: Images the service took (billed), over the whole run.
    billed: int
    stderr: str


async def trickle(
    tmp_path: Path,
    proxy: MisbehavingProxy,
    config: ServiceConfig,
    rows: int,
    pause: float,
    *flags: str,
) -> Run:
    """``fashiontag run -`` through ``proxy`` in front of the reference service (``config``),
    fed ``rows`` rows on stdin, one every ``pause`` seconds (a producer slower than the task
    expiry)."""
    out, summary = tmp_path / "out.jsonl", tmp_path / "summary.json"
    async with running_service(config) as svc:
        proxy.upstream = svc.url
        async with proxy.running():
            args = [*run_args(proxy.url, out), "-", "--summary", str(summary)]
            args += ["--expiry-margin", "0.5", "--linger", "0.2", "--rotate-seconds", "60"]
            args += ["--give-up-after", "4", *flags]
            async with await anyio.open_process(
                [*args], stdin=subprocess.PIPE, stderr=subprocess.PIPE, env=ENV
            ) as proc:
                assert proc.stdin is not None and proc.stderr is not None
                await proc.stdin.send(b"id,url\n")
                for i in range(rows):
                    await proc.stdin.send(b"c%d,https://img.example/%d.jpg\n" % (i, i))
                    await anyio.sleep(pause)
                await proc.stdin.aclose()
                with anyio.fail_after(30):
                    err = b"".join([chunk async for chunk in proc.stderr])
                    code = await proc.wait()
        billed = svc.store.image_count
    written = json.loads(summary.read_text()) if summary.exists() else {}
    return Run(code, written, read_outcomes(out, out.with_suffix(".rej")), billed, err.decode())


def _stamp(value: str) -> float:
    """Epoch seconds of a time the reference service wrote."""
    moment = parse_time(value)
    assert moment is not None
    return moment.timestamp()


def _times_in(data: Any, convert: Any) -> None:
    """Every time field of ``data`` (nested anywhere) passed through ``convert``."""
    if isinstance(data, dict):
        for key, value in data.items():
            if key in TIME_FIELDS and isinstance(value, str):
                data[key] = convert(value)
            else:
                _times_in(value, convert)
    elif isinstance(data, list):
        for value in data:
            _times_in(value, convert)


@pytest.mark.parametrize("unit", [1, 1000], ids=["seconds", "milliseconds"])
async def test_times_written_as_epoch_numbers(tmp_path: Path, unit: int) -> None:
    """Every time of the answers is a JSON number of epoch seconds or milliseconds (what a
    Java service writes by default), tasks live 1 s, and the producer pauses longer: the
    expiry is read from the numbers (no write meets an expired task), each row once, none
    billed twice. Before, the first task list was unreadable: exit 1, nothing sent, every
    night the same."""

    def numbers(kind: str, data: Any) -> Any:
        _times_in(data, lambda value: round(_stamp(value) * unit))
        return data

    run = await trickle(tmp_path, Rewriting(numbers), ServiceConfig(task_ttl=1.0), 3, 1.6)
    assert run.code == 0, run.stderr
    assert set(run.outcomes.ids) == ids_of(3, "c") and len(run.outcomes.ids) == 3
    assert not run.outcomes.rejects
    assert run.billed == 3
    assert run.summary["expired_writes"] == 0
    assert run.summary["tasks"] == 3 and run.summary["complete"]
