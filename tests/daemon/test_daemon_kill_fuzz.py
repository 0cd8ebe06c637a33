"""A seeded kill -9 fuzz of ``fashiontag daemon``: 3-12 manifests dropped into the inbox over
time (CSV, JSONL, gzip; an atomic rename, ``NAME.ready``, a copy that settles; bad rows,
duplicate ids, ``data:`` and local-file rows for single mode, the same content under two
names, a file that is no manifest), the daemon's options drawn (``--reuse`` on SQLite or
PostgreSQL, a shared PostgreSQL ``--state`` with a second daemon, a short request deadline),
the misbehaving proxy and the reference service's faults in front, and the daemon killed
(SIGKILL) at 0-3 points chosen by what it has done (a manifest claimed, a task created, the
first results written, a summary written), each followed by a restart. Every manifest must
end in ``done/`` or ``failed/`` with its outbox folder, each row of it once in its results
and rejects, each result equal to an undisturbed run's, nothing billed twice without a fault
that allows it, nothing left in ``.work/`` nor temp files in the outbox, and a SIGTERM exit 0.

``DAEMON_FUZZ_SEEDS=100-140`` (or ``DAEMON_FUZZ_SEEDS_LIST=3,7``) runs those seeds; the seeds
kept here are representative cases."""

from __future__ import annotations

import collections
import gzip
import json
import os
import random
import re
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import pytest

from fashiontag_pipeline.service import ServiceConfig, running_service
from fashiontag_pipeline.service.faults import FaultSpec

from ..engine.proxy import MisbehavingProxy, Misbehaviour
from ..engine.test_single_mode import data_uri, red_picture
from .helpers import DaemonProcess, read_lines

pytestmark = pytest.mark.skipif(os.name != "posix", reason="signals")

KILLS = ("claimed", "created", "results", "summary", "started")
OUTPUTS = {"results.jsonl", "rejects.jsonl", "summary.json", ".claim"}


@dataclass
class Drop:
    name: str
    data: bytes
    how: str  # atomic | ready | copy
    manifest: bool = True


@dataclass
class Case:
    seed: int
    drops: list[Drop]
    reuse: str | None  # None | sqlite | postgresql
    shared: bool  # --state on PostgreSQL
    second: bool  # a second daemon sharing the work
    deadline: bool
    rules: dict[str, Any] = field(default_factory=dict)
    faults: dict[str, Any] = field(default_factory=dict)
    storm: bool = False
    kills: tuple[str, ...] = ()


def _rows(rnd: random.Random, k: int, n: int, png: str, pic: Path) -> list[tuple[str, str]]:
    rows: list[tuple[str, str]] = []
    bad = rnd.random() < 0.5
    dups = rnd.random() < 0.4
    singles = rnd.random() < 0.3
    for i in range(n):
        ident, url = f"r{i}", f"https://img.example/m{k}/{i}.jpg"
        r = rnd.random()
        if dups and r < 0.03 and i > 5:
            ident = f"r{rnd.randrange(i)}"
        elif bad and r < 0.05:
            url = "ftp://nope/x.jpg"
        elif bad and r < 0.06:
            ident = ""
        rows.append((ident, url))
    if singles:
        for j in range(rnd.choice((1, 3))):
            rows.insert(rnd.randrange(len(rows)), (f"s{j}", png if j % 2 else str(pic)))
    return rows


def _encode(rows: list[tuple[str, str]], fmt: str) -> bytes:
    if fmt == "jsonl":
        text = "".join(json.dumps({"id": i, "url": u}) + "\n" for i, u in rows)
    else:
        text = "id,url,brand\n" + "".join(f'{i},"{u}",acme\n' for i, u in rows)
    return text.encode()


def draw(seed: int, folder: Path) -> Case:
    rnd = random.Random(seed)
    pic = red_picture(folder / "red.png")
    png = data_uri(pic)
    drops: list[Drop] = []
    for k in range(rnd.randrange(3, 13)):
        fmt = rnd.choice(("csv", "jsonl"))
        gz = rnd.random() < 0.25
        data = _encode(_rows(rnd, k, rnd.randrange(20, 700), png, pic), fmt)
        if gz:
            data = gzip.compress(data)
        name = f"m{k}.{fmt}" + (".gz" if gz else "")
        drops.append(Drop(name, data, rnd.choice(("atomic", "ready", "copy"))))
    if rnd.random() < 0.4:  # the same content twice under two names
        twin = rnd.choice(drops)
        stem, _, ext = twin.name.partition(".")
        drops.insert(rnd.randrange(len(drops) + 1), Drop(f"{stem}copy.{ext}", twin.data, "atomic"))
    if rnd.random() < 0.4:  # a manifest that is not one at all
        junk = rnd.choice(
            (
                Drop("junk.csv", b"\x00\x01\xff not, a manifest\n" * 20, "atomic"),
                Drop("junk.jsonl", b"[1, 2]\n{nope\n", "atomic"),
                Drop("notes.txt", b"hello\n", "atomic", manifest=False),
            )
        )
        drops.insert(rnd.randrange(len(drops) + 1), junk)
    shared = rnd.random() < 0.3
    rules: dict[str, Any] = {}
    faults: dict[str, Any] = {}
    pick = rnd.random()
    if pick < 0.15:
        faults["server_errors"] = ((503, 0.05),)
    elif pick < 0.3:
        faults["drop"] = 0.02
    elif pick < 0.4:
        faults["ambiguous"] = 0.03
    elif pick < 0.5:
        rules["forget_when_done"] = {rnd.choice((1, 2))}
    elif pick < 0.6:
        rules["status_lag"] = 0.5
    elif pick < 0.7:
        rules["lose_first_create_answer"] = True
    return Case(
        seed=seed,
        drops=drops,
        reuse=rnd.choice((None, None, "sqlite", "postgresql")),
        shared=shared,
        second=shared and rnd.random() < 0.5,
        deadline=rnd.random() < 0.6,
        rules=rules,
        faults=faults,
        storm=0.7 <= pick < 0.8,
        kills=tuple(
            rnd.choice(KILLS) + rnd.choice(("", "@b"))  # (@b: the second daemon, if any)
            for _ in range(rnd.choice((0, 1, 2, 3)))
        ),
    )


async def _drop(inbox: Path, d: Drop) -> None:
    if d.how == "atomic" or not d.manifest:
        tmp = inbox / f".{d.name}.part"
        tmp.write_bytes(d.data)
        os.rename(tmp, inbox / d.name)
    elif d.how == "ready":
        (inbox / d.name).write_bytes(d.data)
        (inbox / f"{d.name}.ready").write_bytes(b"")
    else:  # copied in parts, left to settle
        await anyio.to_thread.run_sync(_copy_in_parts, inbox / d.name, d.data)


#: The daemons' ``--settle``: a copy's pause between its parts (0.1 s) must stay well below
#: it. With 0.4 s (the helpers' default), a loaded 2-core machine (load 30: the wide fuzz on
#: three workers beside other tests) stalled a pause past it now and then: the daemon claimed
#: half a copy, found it grown after its read and failed it, in the undisturbed run or the
#: disturbed one (the wide fuzz's seeds 76 and 93 in 150), while the other had it done.
SETTLE = 1.5


def _copy_in_parts(path: Path, data: bytes) -> None:
    """Half, a pause, the rest: in a thread of its own (the test's event loop, serving the
    service and the proxy, may stall longer than a pause)."""
    half = len(data) // 2
    with path.open("wb") as f:
        f.write(data[:half])
        f.flush()
        time.sleep(0.1)
        f.write(data[half:])


def _outputs(outbox: Path) -> dict[str, tuple[Path, dict[str, Any]]]:
    """Manifest name -> (its outbox folder, its summary)."""
    out = {}
    for path in outbox.glob("*/summary.json"):
        summary = json.loads(path.read_text())
        assert summary["manifest"] not in out, f"two summaries for {summary['manifest']}"
        out[summary["manifest"]] = (path.parent, summary)
    return out


def _finished(inbox: Path, case: Case) -> bool:
    names = [d.name for d in case.drops if d.manifest]
    return all((inbox / "done" / n).exists() or (inbox / "failed" / n).exists() for n in names)


def _lines(folder: Path) -> tuple[dict[str, Any], collections.Counter[str], list[Any]]:
    results: dict[str, Any] = {}
    for row in read_lines(folder / "results.jsonl"):
        assert row["id"] not in results, f"{row['id']!r} written twice in {folder.name}"
        results[row["id"]] = row["taggingResult"]
    rejects = read_lines(folder / "rejects.jsonl")
    ids = collections.Counter([*results, *(str(r.get("id")) for r in rejects)])
    return results, ids, rejects


def _kill_ready(kind: str, daemon: DaemonProcess, proxy: MisbehavingProxy) -> Callable[[], bool]:
    before_created = len(proxy.created)
    outbox = daemon.outbox
    before_summaries = len(list(outbox.glob("*/summary.json")))

    def claimed() -> bool:
        return '"manifest claimed"' in daemon.stderr_path.read_text(errors="replace")

    def results() -> bool:
        return any(p.stat().st_size > 0 for p in outbox.glob("*/*results*"))

    if kind == "claimed":
        return claimed
    if kind == "started":
        return lambda: '"daemon started"' in daemon.stderr_path.read_text(errors="replace")
    if kind == "created":
        return lambda: len(proxy.created) > before_created
    if kind == "results":
        return results
    return lambda: len(list(outbox.glob("*/summary.json"))) > before_summaries


#: What a daemon restarted after a kill says when a create may have been on its way: it looks
#: for the create's task in the task list before it claims anything (docs/engine.md).
_LOOKS = re.compile(r"a create may have been on its way .*? for up to (\d+) s")


def _look_window(daemons: list[DaemonProcess], seen: set[Path]) -> float:
    """The seconds of such looks said by daemons not counted yet (in ``seen``): the budget of
    the drops is the daemons' work, not that wait (up to 35 s at the defaults, which a kill on
    a loaded machine met: seed 135 timed out so, its manifests left unclaimed)."""
    window = 0.0
    for d in daemons:
        if d.stderr_path in seen or not d.stderr_path.exists():
            continue
        said = _LOOKS.search(d.stderr_path.read_text(errors="replace"))
        if said is not None:
            seen.add(d.stderr_path)
            window += float(said.group(1))
    return window


async def _run(
    root: Path, case: Case, url: str, pg: str | None, disturbed: bool, log: list[str]
) -> dict[str, Any]:
    """Every drop through daemons (killed and restarted when ``disturbed``); the outcome."""
    extra: list[str] = ["--max-pending-rows", "2000"]
    if case.deadline:
        cfg = root / "c.toml"
        cfg.write_text("[client.timeout]\ntotal = 3.0\n\n[engine]\nlist_lag = 0.5\n")
        extra += ["--config", str(cfg)]
    if case.reuse == "sqlite":
        extra += ["--reuse", str(root / "reuse.db")]
    elif case.reuse == "postgresql" and pg:
        extra += ["--reuse", f"{pg}"]
    if case.shared and pg:
        extra += ["--state", pg, "--lease", "2"]
    daemons: list[DaemonProcess] = []
    codes: list[int] = []

    def start() -> DaemonProcess:
        d = DaemonProcess(root, url, extra=extra, settle=SETTLE).start()
        daemons.append(d)
        return d

    a = start()
    b = start() if disturbed and case.second and case.shared else None
    try:
        await a.wait_ready_endpoint()
        kills = list(case.kills) if disturbed else []
        pending = list(case.drops)
        ready: Callable[[], bool] | None = None
        looks: set[Path] = set()
        with anyio.fail_after(50) as budget:
            while not (not pending and _finished(a.inbox, case)):
                budget.deadline += _look_window(daemons, looks)
                if pending:
                    await _drop(a.inbox, pending.pop(0))
                if ready is None and kills:
                    kind, _, target = kills.pop(0).partition("@")
                    victim = b if target and b is not None else a
                    ready = _kill_ready(kind, victim, PROXY[0])
                if ready is not None and ready():
                    await victim.kill()
                    log.append(f"killed ({case.kills})")
                    ready = None
                    if victim is a:
                        a = start()
                    else:
                        b = start()
                for d in (a, b):
                    if d is not None:
                        d.check_alive()
                await anyio.sleep(0.05)
        for d in (a, b):
            if d is not None:
                codes.append(await d.stop())
    finally:
        for d in daemons:
            d.ensure_dead()
    assert all(c == 0 for c in codes), (codes, a.tail())
    return _outputs(a.outbox)


PROXY: list[MisbehavingProxy] = []


def _check(root: Path, case: Case, got: dict[str, Any], plain: dict[str, Any]) -> None:
    inbox, outbox = root / "inbox", root / "outbox"
    work = inbox / ".work"
    left = sorted(p.name for p in work.iterdir()) if work.exists() else []
    assert not left, f"left in .work/: {left}"
    for folder in outbox.iterdir():
        if folder.is_dir():
            # (A mark's temp file left by a kill while it was written: see the report.)
            odd = sorted(
                p.name
                for p in folder.iterdir()
                if p.name not in OUTPUTS and not p.name.startswith(".claim.")
            )
            assert not odd, f"{folder.name}: {odd}"
    by_content = {d.name: d.data for d in case.drops}
    plain_by_data = {by_content[n]: v for n, v in plain.items()}
    for d in case.drops:
        if not d.manifest:
            assert (inbox / d.name).exists()
            continue
        assert d.name in got, f"{d.name} has no summary"
        folder, summary = got[d.name]
        pfolder, psummary = plain_by_data[d.data]
        where = "done" if summary["status"] in ("done", "duplicate") else "failed"
        assert (inbox / where / d.name).exists(), (d.name, summary)
        if summary["status"] == "duplicate":
            continue
        if psummary["status"] == "duplicate":
            continue  # (the other copy's outputs are compared)
        assert summary["status"] == psummary["status"], (d.name, summary, psummary)
        if summary["status"] != "done":
            continue
        results, ids, rejects = _lines(folder)
        presults, pids, _ = _lines(pfolder)
        assert ids == pids, (
            f"{d.name}: missing {sorted((pids - ids).elements())[:5]}, "
            f"extra {sorted((ids - pids).elements())[:5]}"
        )
        wrong = sorted(i for i in results if results[i] != presults.get(i))
        assert not wrong, f"{d.name}: {wrong[:5]} differ from the plain run"
        # (rows_read counts this attempt, as run's does: a claim taken over once the killed
        # daemon had read and settled every row reads none; a CI run met it on seed 118)
        assert summary["rows_read"] in (0, sum(ids.values())), (d.name, summary)
        assert summary["rejected"] == len(rejects), (d.name, summary)


async def fuzz_case(root: Path, case: Case, pg: str | None) -> None:
    log: list[str] = []
    plain_root = root / "plain"
    plain_root.mkdir()
    async with running_service(ServiceConfig()) as svc:
        PROXY[:] = [MisbehavingProxy(svc.url, Misbehaviour())]
        plain_case = Case(case.seed, case.drops, None, False, False, case.deadline)
        plain = await _run(plain_root, plain_case, svc.url, None, False, log)
        plain_billed = svc.store.image_count
    fuzz_root = root / "fuzz"
    fuzz_root.mkdir()
    faults = FaultSpec(**case.faults, seed=case.seed) if case.faults else None
    async with running_service(ServiceConfig(rate=3000.0, faults=faults)) as svc:
        proxy = MisbehavingProxy(svc.url, Misbehaviour(**case.rules))
        if case.storm:
            proxy.rules.storm = 429
            proxy.rules.storm_window = (0.5, 2.0)
        PROXY[:] = [proxy]
        async with proxy.running():
            got = await _run(fuzz_root, case, proxy.url, pg, True, log)
        billed = svc.store.image_count
    _check(fuzz_root, case, got, plain)
    extra = billed - plain_billed
    print(f"seed {case.seed}: billed {billed} plain {plain_billed} log {log}")
    if os.environ.get("DAEMON_FUZZ_LOG"):
        with open(os.environ["DAEMON_FUZZ_LOG"], "a") as f:
            f.write(
                json.dumps(
                    [
                        case.seed,
                        billed,
                        plain_billed,
                        case.kills,
                        repr(case.rules),
                        case.faults,
                        case.reuse,
                        case.shared,
                        case.second,
                    ]
                )
                + "\n"
            )
    # Rows sent again are allowed after a fault of unknown fate or a task the service forgot,
    # and for equal content in flight on two daemons at once (docs/postgresql.md).
    twins = len({d.data for d in case.drops}) < len(case.drops)
    allowed = case.faults or case.rules.get("lose_first_create_answer")
    allowed = allowed or case.rules.get("forget_when_done") or (case.second and twins)
    if case.reuse is None and not allowed:
        assert extra <= 0, f"{extra} rows billed twice"


SEEDS = [int(s) for s in os.environ.get("DAEMON_FUZZ_SEEDS_LIST", "").split(",") if s]
if os.environ.get("DAEMON_FUZZ_SEEDS"):
    lo, _, hi = os.environ["DAEMON_FUZZ_SEEDS"].partition("-")
    SEEDS = list(range(int(lo), int(hi or lo) + 1))
#: Representative seeds: a copy dropped while its content is tagged on one daemon of a shared
#: state (it was tagged and billed twice); two daemons sharing the work, the second killed at
#: a summary and the first at the next (a claim resumed as a duplicate left its epoch files);
#: two daemons on a shared state with --reuse and three kills; a SQLite state with a
#: PostgreSQL --reuse killed three times (a claim, a create, a claim).
KEPT = [9, 118, 148, 135]


@pytest.mark.parametrize("seed", SEEDS or KEPT)
@pytest.mark.timeout(180)  # (the suite's 120 s, and a restarted daemon's look: _look_window)
async def test_daemon_killed_and_restarted(
    tmp_path: Path, seed: int, request: pytest.FixtureRequest
) -> None:
    case = draw(seed, tmp_path)
    print(case.kills, case.rules, case.faults, case.reuse, case.shared, case.second)
    needs_pg = case.shared or case.reuse == "postgresql"
    pg = request.getfixturevalue("postgres_url") if needs_pg else None
    await fuzz_case(tmp_path, case, pg)
    shutil.rmtree(tmp_path / "plain", ignore_errors=True)
