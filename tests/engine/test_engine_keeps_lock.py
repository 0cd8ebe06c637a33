"""A long-lived library engine (``async with Engine(...)`` for a week) keeps its state's
``STATE.lock`` as the daemon does: touched once old, made again (and locked) once removed. Left
as it was when the engine started, a retention job (``find /data -mtime +7 -delete``) took it,
and a second run on the same state took it too (rows sent twice)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

import anyio
import pytest

from fashiontag_pipeline._client import TaggerClient
from fashiontag_pipeline._exceptions import StateInUseError
from fashiontag_pipeline.engine import EngineConfig, statekeep
from fashiontag_pipeline.engine.engine import Engine
from fashiontag_pipeline.engine.state import StateDB
from fashiontag_pipeline.service import ServiceConfig, running_service

from .helpers import client_config

_MONTH = 31 * 86400


async def _until(done: Callable[[], bool], timeout: float) -> None:
    with anyio.move_on_after(timeout):
        while not done():
            await anyio.sleep(0.02)


def _aged(path: Path) -> bool:
    try:
        return time.time() - path.stat().st_mtime > 30 * 86400
    except FileNotFoundError:
        return True


def _second_run_refused(state: Path) -> bool:
    try:
        StateDB(state).close()
    except StateInUseError:
        return True
    return False


async def test_a_long_lived_engine_keeps_its_state_lock(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(statekeep, "KEEP_INTERVAL", 0.05)
    state, lock = tmp_path / "state", tmp_path / "state.lock"
    async with running_service(ServiceConfig()) as svc:
        db = StateDB(state)
        async with TaggerClient(config=client_config(svc.url)) as client:
            engine = Engine(
                client=client,
                db=db,
                state=db.open_engine(),
                config=EngineConfig(poll_min=0.02, poll_max=0.2),
                namespaced=True,
                fail_fast=False,
            )
            async with engine:
                month_ago = time.time() - _MONTH
                os.utime(lock, (month_ago, month_ago))
                await _until(lambda: not _aged(lock), 3.0)
                aged = _aged(lock)
                lock.unlink()  # (a cleanup by name, or by age with a lock left aged)
                await _until(lock.exists, 3.0)
                refused = _second_run_refused(state)
                engine.close()
    # Before: the lock left a month old, and a second run on the state opened it.
    assert (aged, refused) == (False, True)
