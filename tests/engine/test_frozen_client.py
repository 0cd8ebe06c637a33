"""`fashiontag run` frozen while a write is in flight (SIGSTOP; in the field a paused container,
a frozen cgroup, a paused or migrated VM, a laptop's suspend), for longer than the request's
deadline and ``--give-up-after``, against a service that answers all along.

The time the client was frozen says nothing of the service: the run must go on once it is
thawed. Before, the write's deadline timer fired at the thaw, the failure counted from the
request's start (before the freeze), past the give-up point at once: exit 1, "service
unreachable for 3s", with the service never down."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
from pathlib import Path

import anyio
import pytest

from fashiontag_pipeline._connect import unanswered
from fashiontag_pipeline.service import ServiceConfig, running_service

from .helpers import ENV, assert_exactly_once, ids_of, run_args, write_csv
from .proxy import BULK, Misbehaviour, misbehaving

#: The client's request deadline, its give-up, and how long it stays frozen (longer than both).
DEADLINE, GIVE_UP, FROZEN = 2.0, 3.0, 5.0


def _thaw(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):  # it ended some other way: the test says how
        os.kill(pid, signal.SIGCONT)


@pytest.mark.parametrize(("method", "rows"), [("POST", 500), ("PUT", 2500)])
async def test_a_run_frozen_past_give_up_with_a_write_in_flight_goes_on(
    tmp_path: Path, method: str, rows: int
) -> None:
    """Frozen as its first create (POST, 500 rows) or its first append (PUT, 2,500 rows: one
    task, two appends) reaches the service: the run finishes (exit 0), every row tagged once,
    each billed once."""
    manifest = write_csv(tmp_path / "m.csv", rows)
    out = tmp_path / "out.jsonl"
    config = tmp_path / "client.toml"
    config.write_text(f"[client]\ntimeout.total = {DEADLINE}\n")
    pid: list[int] = []
    frozen: list[str] = []

    def freeze_at_first(seen: str, path: str) -> None:
        if seen == method and path.startswith(BULK) and not frozen and pid:
            frozen.append(path)
            os.kill(pid[0], signal.SIGSTOP)  # the write is on its way: stop its sender
            asyncio.get_running_loop().call_later(FROZEN, _thaw, pid[0])

    async with running_service(ServiceConfig()) as svc:
        rules = Misbehaviour(on_request=freeze_at_first)
        async with misbehaving(svc.url, rules) as proxy:
            args = run_args(proxy.url, out, str(manifest))
            args += ["--config", str(config), "--give-up-after", str(GIVE_UP)]
            args += ["--rotate-min-images", "5000", "--rotate-images", "5000"]  # one task
            async with await anyio.open_process(args, stderr=subprocess.PIPE, env=ENV) as proc:
                pid.append(proc.pid)
                with anyio.fail_after(30 + FROZEN):
                    code = await proc.wait()
                assert proc.stderr is not None
                err = b""
                async for part in proc.stderr:
                    err += part
        billed = svc.store.image_count
    assert frozen, f"no {method} was sent"
    assert code == 0, err.decode()
    assert billed == rows
    assert_exactly_once(out, out.with_suffix(".rej"), ids_of(rows))


def test_a_deadline_aiohttp_rounded_up_is_no_stall() -> None:
    """aiohttp rounds a deadline of 5 s or more up to its loop clock's next whole second, so a
    70 s request times out up to a second late by design, and a busy loop adds to that: such
    a timeout is no stall (taken for one, its failing restarted from its end and the run gave
    up later than ``--give-up-after``). A deadline that fires seconds late is one."""
    late = unanswered(TimeoutError(), "GET", "/x", write=False, waited=71.5, limit=70.0)
    assert not late.stalled
    frozen = unanswered(TimeoutError(), "POST", "/x", write=True, waited=75.0, limit=70.0)
    assert frozen.stalled
    dropped = unanswered(ConnectionResetError(), "GET", "/x", write=False, waited=80.0, limit=70.0)
    assert not dropped.stalled  # only a deadline can fire late
