"""The kill fuzz of ``test_daemon_kill_fuzz`` widened: what a case may draw beyond kills.

A case draws the same manifests and options as there, then events, each fired when its
condition is met (a manifest claimed, a task created, results written, a summary written, a
manifest taken over by the other daemon, a create sent and held unanswered): a SIGKILL and
restart of either daemon, a SIGSTOP of one past its lease (``--lease 2``) and a SIGCONT later
(the other takes its manifests over), a SIGTERM whose drain goes on while manifests are
dropped, then a restart, and a restart of the reference service on the same port (its tasks
forgotten, or remembered by ``serve --state``). ``NAME.ready`` markers may come before their
file (older than it: they do not count, the file settles). A 429 storm or a status lag may
come on top of the drawn fault. The checks are those of the kill fuzz.

``DAEMON_WIDE_SEEDS=1-40`` runs those seeds; the seeds kept here are representative."""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import anyio
import pytest

from fashiontag_pipeline.service import RunningService, ServiceConfig, running_service
from fashiontag_pipeline.service.faults import FaultSpec

from ..engine.proxy import MisbehavingProxy, Misbehaviour
from . import test_daemon_kill_fuzz as base
from .helpers import DaemonProcess

pytestmark = pytest.mark.skipif(os.name != "posix", reason="signals")

CONDITIONS = ("claimed", "created", "results", "summary", "takeover")
ACTIONS = ("kill", "kill", "pause", "drain", "service", "stopkill")


@dataclass
class Event:
    action: str  # kill | pause | drain | service | stopkill
    condition: str  # one of CONDITIONS, or held
    target: str = "a"  # a | b


@dataclass
class Wide:
    case: base.Case
    events: list[Event] = field(default_factory=list)
    remember: bool = False  # the service restarted with its --state
    early_ready: bool = False


def draw_wide(seed: int, folder: Path) -> Wide:
    case = base.draw(seed, folder)
    rnd = random.Random(f"wide-{seed}")
    if rnd.random() < 0.5:  # two daemons on a shared state
        case = replace(case, shared=True, second=True)
    if rnd.random() < 0.15:
        case.storm = True
    if rnd.random() < 0.15:
        case.rules["status_lag"] = 0.5
    early = rnd.random() < 0.4
    if early:
        for d in case.drops:
            if d.how == "ready" and rnd.random() < 0.6:
                d.how = "early"
    events: list[Event] = []
    if not case.second and rnd.random() < 0.2:
        events.append(Event("kill", "held"))
    for _ in range(rnd.choice((1, 2, 3, 4))):
        action = rnd.choice(ACTIONS)
        if action == "pause" and not case.second:
            action = "kill"
        cond = rnd.choice(CONDITIONS)
        if cond == "takeover" and not case.second:
            cond = "claimed"
        target = rnd.choice(("a", "b")) if case.second else "a"
        events.append(Event(action, cond, target))
    return Wide(case, events, remember=rnd.random() < 0.5, early_ready=early)


async def _drop(inbox: Path, d: base.Drop) -> None:
    if d.how == "early":  # the marker first, then the file (the marker is older: it settles)
        (inbox / f"{d.name}.ready").write_bytes(b"")
        await anyio.sleep(0.02)
        (inbox / d.name).write_bytes(d.data)
        return
    await base._drop(inbox, d)


class Service:
    """The reference service, restarted on its port on demand; what it billed over its lives."""

    def __init__(self, config: ServiceConfig) -> None:
        self.config = config
        self.billed_before = 0
        self.restarts = 0
        self.svc: RunningService | None = None
        self._stack = contextlib.AsyncExitStack()
        self.port = 0

    async def start(self) -> None:
        self._stack = contextlib.AsyncExitStack()
        self.svc = await self._stack.enter_async_context(
            running_service(self.config, port=self.port)
        )
        self.port = self.svc.port

    async def restart(self, down: float) -> None:
        assert self.svc is not None
        if self.config.state_path is None:
            self.billed_before += self.svc.store.image_count
        await self._stack.aclose()
        await anyio.sleep(down)
        self.restarts += 1
        await self.start()

    @property
    def billed(self) -> int:
        assert self.svc is not None
        return self.billed_before + self.svc.store.image_count

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[Service]:
        await self.start()
        try:
            yield self
        finally:
            await self._stack.aclose()


def _up(d: DaemonProcess) -> bool:
    return '"daemon started"' in d.stderr_path.read_text(errors="replace")


def _ready(
    ev: Event, victim: DaemonProcess, proxy: MisbehavingProxy, held: list[float]
) -> Callable[[], bool]:
    if ev.condition == "held":
        return lambda: bool(held) and time.monotonic() - held[0] > 0.3
    if ev.condition == "takeover":
        before = victim.stderr_path.read_text(errors="replace").count('"manifest taken over"')
        return lambda: (
            victim.stderr_path.read_text(errors="replace").count('"manifest taken over"') > before
        )
    return base._kill_ready(ev.condition, victim, proxy)


async def _run_wide(
    root: Path,
    wide: Wide,
    service: Service,
    proxy: MisbehavingProxy,
    pg: str | None,
    log: list[str],
    held: list[float],
) -> dict[str, Any]:
    case = wide.case
    extra: list[str] = ["--max-pending-rows", "2000"]
    if case.deadline:
        cfg = root / "c.toml"
        cfg.write_text("[client.timeout]\ntotal = 3.0\n\n[engine]\nlist_lag = 0.5\n")
        extra += ["--config", str(cfg)]
    if case.reuse == "sqlite":
        extra += ["--reuse", str(root / "reuse.db")]
    elif case.reuse == "postgresql" and pg:
        extra += ["--reuse", pg]
    if case.shared and pg:
        extra += ["--state", pg, "--lease", "2"]
    all_daemons: list[DaemonProcess] = []
    live: dict[str, DaemonProcess] = {}
    codes: list[int] = []

    def start(name: str) -> None:
        d = DaemonProcess(root, proxy.url, extra=extra, settle=base.SETTLE).start()
        all_daemons.append(d)
        live[name] = d

    start("a")
    if case.second:
        start("b")
    paused: dict[str, float] = {}
    draining: dict[str, DaemonProcess] = {}
    try:
        await live["a"].wait_ready_endpoint()
        events = list(wide.events)
        pending = list(case.drops)
        cur: Event | None = None
        ready: Callable[[], bool] | None = None
        with anyio.fail_after(120):
            while pending or not base._finished(live["a"].inbox, case) or paused or draining:
                if pending:
                    await _drop(live["a"].inbox, pending.pop(0))
                if cur is None and events:
                    cur = events.pop(0)
                    if cur.target not in live:
                        cur.target = "a"
                busy = cur is not None and (cur.target in paused or cur.target in draining)
                if cur is not None and ready is None and not busy:
                    ready = _ready(cur, live[cur.target], proxy, held)
                if (
                    cur is not None
                    and ready is not None
                    and not busy
                    and _up(live[cur.target])
                    and ready()
                ):
                    victim = live[cur.target]
                    log.append(f"{cur.action} {cur.target} at {cur.condition}")
                    if cur.action == "kill":
                        await victim.kill()
                        start(cur.target)
                    elif cur.action == "pause" and cur.target not in paused:
                        victim.signal(signal.SIGSTOP)
                        paused[cur.target] = time.monotonic()
                    elif cur.action == "drain":
                        victim.signal(signal.SIGTERM)
                        draining[cur.target] = victim
                    elif cur.action == "stopkill":  # a stop that timed out (TimeoutStopSec)
                        victim.signal(signal.SIGTERM)
                        await anyio.sleep(random.Random(case.seed).choice((0.05, 0.3, 1.0)))
                        if victim.proc is not None and victim.proc.poll() is None:
                            await victim.kill()
                        start(cur.target)
                    elif cur.action == "service":
                        await service.restart(random.Random(case.seed).choice((0.0, 0.5, 1.5)))
                    cur, ready = None, None
                for name, since in list(paused.items()):
                    if time.monotonic() - since > 3.5:
                        live[name].signal(signal.SIGCONT)
                        del paused[name]
                for name, d in list(draining.items()):
                    assert d.proc is not None
                    code = d.proc.poll()
                    if code is not None:
                        text = d.stderr_path.read_text(errors="replace")
                        odd = [t for t in text.splitlines() if not t.startswith("{")]
                        assert code == 0, (code, "\n".join(odd[-60:]) or d.tail())
                        del draining[name]
                        start(name)
                for name, d in live.items():
                    if name not in draining:
                        d.check_alive()
                await anyio.sleep(0.05)
        if cur is not None or events:
            log.append(f"not fired: {[cur, *events]}")
        for d in live.values():
            codes.append(await d.stop())
    finally:
        for name in paused:
            live[name].signal(signal.SIGCONT)
        keep = os.environ.get("DAEMON_WIDE_TB")
        for d in all_daemons if keep else ():
            if "Traceback" in d.stderr_path.read_text(errors="replace"):
                shutil.copy(d.stderr_path, Path(keep) / f"{case.seed}-{d.stderr_path.name}")
        for d in all_daemons:
            d.ensure_dead()
    assert all(c == 0 for c in codes), (codes, live["a"].tail())
    return base._outputs(live["a"].outbox)


async def wide_case(root: Path, wide: Wide, pg: str | None) -> None:
    case = wide.case
    log: list[str] = []
    plain_root = root / "plain"
    plain_root.mkdir()
    async with running_service(ServiceConfig()) as svc:
        base.PROXY[:] = [MisbehavingProxy(svc.url, Misbehaviour())]
        plain_case = base.Case(case.seed, case.drops, None, False, False, case.deadline)
        plain = await base._run(plain_root, plain_case, svc.url, None, False, log)
        plain_billed = svc.store.image_count
    fuzz_root = root / "fuzz"
    fuzz_root.mkdir()
    faults = FaultSpec(**case.faults, seed=case.seed) if case.faults else None
    state = fuzz_root / "service.state" if wide.remember else None
    held: list[float] = []
    rules = Misbehaviour(**case.rules)
    if any(e.condition == "held" for e in wide.events):
        rules.hold_first_create = True

        def seen(method: str, path: str) -> None:
            if method == "POST" and path.endswith("/bulk") and not held:
                held.append(time.monotonic())

        rules.on_request = seen
    async with Service(
        ServiceConfig(rate=3000.0, faults=faults, state_path=state)
    ).running() as service:
        assert service.svc is not None
        proxy = MisbehavingProxy(service.svc.url, rules)
        if case.storm:
            proxy.rules.storm = 429
            proxy.rules.storm_window = (0.5, 2.0)
        async with proxy.running():
            got = await _run_wide(fuzz_root, wide, service, proxy, pg, log, held)
        billed = service.billed
    print(f"seed {case.seed}: billed {billed} plain {plain_billed} log {log}")
    if os.environ.get("DAEMON_WIDE_LOG"):
        with open(os.environ["DAEMON_WIDE_LOG"], "a") as f:
            print(case.seed, billed, plain_billed, case.reuse, case.second, log, file=f)
    base._check(fuzz_root, case, got, plain)
    extra = billed - plain_billed
    twins = len({d.data for d in case.drops}) < len(case.drops)
    allowed = case.faults or case.rules.get("lose_first_create_answer") or held
    allowed = allowed or case.rules.get("forget_when_done") or (case.second and twins)
    allowed = allowed or (service.restarts and not wide.remember)
    if case.reuse is None and not allowed:
        assert extra <= 0, f"{extra} rows billed twice"


SEEDS = [int(s) for s in os.environ.get("DAEMON_WIDE_SEEDS_LIST", "").split(",") if s]
if os.environ.get("DAEMON_WIDE_SEEDS"):
    lo, _, hi = os.environ["DAEMON_WIDE_SEEDS"].partition("-")
    SEEDS = list(range(int(lo), int(hi or lo) + 1))
#: Representative seeds: two daemons on a shared state, one drained while a summary was
#: written and paused past its lease while results were written (the other took over), the
#: other killed at a claim, under a status lag; two daemons, the service restarted with its
#: state remembered at a summary, one daemon paused twice past its lease (nothing billed twice).
KEPT = [206, 277]


@pytest.mark.parametrize("seed", SEEDS or KEPT)
async def test_daemon_widely_disturbed(
    tmp_path: Path, seed: int, request: pytest.FixtureRequest
) -> None:
    wide = draw_wide(seed, tmp_path)
    c = wide.case
    print(wide.events, c.rules, c.faults, c.reuse, c.shared, c.second, wide.remember, c.storm)
    needs_pg = c.shared or c.reuse == "postgresql"
    pg = request.getfixturevalue("postgres_url") if needs_pg else None
    await wide_case(tmp_path, wide, pg)
