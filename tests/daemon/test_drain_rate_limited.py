"""SIGTERM while every write is refused with 429 (Retry-After: 5): a write refused was not
applied, so it is no write in flight. The daemon sent creates until ``--drain-timeout`` (30 s
by default), then warned "drain timeout: stopping with writes in flight"; it now sends none
after the signal and exits 0 within seconds, and the next start tags every row once."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import anyio

from fashiontag_pipeline.service import ServiceConfig, running_service

from ..engine.proxy import Misbehaviour, misbehaving
from .helpers import DaemonProcess, drop_atomic, read_lines, write_manifest


async def test_sigterm_while_writes_are_rate_limited_drains_at_once(tmp_path: Path) -> None:
    ids = [f"p{i}" for i in range(2000)]
    rules = Misbehaviour(storm=429, storm_ops={"create", "append"}, storm_retry_after="5")
    async with running_service(ServiceConfig()) as svc, misbehaving(svc.url, rules) as proxy:
        daemon = DaemonProcess(tmp_path, proxy.url).start()
        try:
            await daemon.wait_ready_endpoint()
            drop_atomic(daemon.inbox, "m.csv", write_manifest(Path(), ids))
            with anyio.fail_after(30):
                while proxy.storm_answers == 0:
                    daemon.check_alive()
                    await anyio.sleep(0.05)
            await anyio.sleep(1.0)
            daemon.signal(signal.SIGTERM)
            at_signal = proxy.writes
            started = time.monotonic()
            code = await daemon.wait_exit(timeout=60)
            took = time.monotonic() - started
            assert code == 0, daemon.tail()
            assert took < 5, f"exited {took:.1f} s after SIGTERM"
            assert proxy.writes == at_signal, f"{proxy.writes - at_signal} writes after SIGTERM"
            assert not any("drain timeout" in str(line) for line in daemon.logs())
            rules.storm = None
            daemon = DaemonProcess(tmp_path, proxy.url, port=daemon.port).start()
            summary = await daemon.wait_summary("m", timeout=60)
            assert await daemon.stop() == 0
        finally:
            daemon.ensure_dead()
    assert summary["status"] == "done"
    results = read_lines(daemon.outbox / "m" / "results.jsonl")
    assert sorted(r["id"] for r in results) == sorted(ids)
