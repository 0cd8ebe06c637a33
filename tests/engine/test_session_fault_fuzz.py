"""A seeded kill -9 fuzz over the fifteenth session's fault paths together: a service whose task
ids are JSON integers, PUTs answered 403 (a task closed to writes), result pages answered 403
once the service's clock passes their ``resultExpiredAt``, a task list that hangs past the
request deadline, a poison single-mode image left last, an empty output deleted mid-run and a
stdin run resumed with ``--resume``; on top the reference service's 5xx and drops and the
misbehaving proxy's lost create answers, clock skew, forgotten tasks and lags. A manifest (CSV,
JSONL or stdin) with duplicates, bad rows and rows routed to single mode, ``fashiontag run``
killed (SIGKILL) at 0-3 points chosen by what the run has done, then resumed until exit 0.
Every row must end exactly once, each result equal to a plain run's, and the service's bill
the rows plus the re-sends the summary reports.

``FUZZ_SEEDS=100-160`` runs those seeds (``FUZZ_STATE=postgresql``: their states in PostgreSQL,
``--state URL#fuzz``); the seeds kept here are representative cases."""

from __future__ import annotations

import base64
import collections
import json
import os
import random
import re
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import anyio
import anyio.abc
import pytest
from aiohttp import web

from fashiontag_pipeline._config import DEV_API_KEY, DEV_BULK_API_KEY
from fashiontag_pipeline.service import ServiceConfig, running_service
from fashiontag_pipeline.service.faults import FaultSpec

from .fuzz_state import StateProbe, deleter_of
from .helpers import ENV, run_args
from .proxy import BULK, MisbehavingProxy, Misbehaviour, request_kind
from .test_single_mode import red_picture

SPICES = ("integer_ids", "put_403", "expiry_403", "list_hang", "poison", "delete_empty", "stdin")


@dataclass
class Case:
    seed: int
    rows: int
    fmt: str
    spices: tuple[str, ...]
    rules: dict[str, Any] = field(default_factory=dict)
    faults: dict[str, Any] = field(default_factory=dict)
    kills: tuple[tuple[str, float], ...] = ()
    rotate: int = 1000
    singles: int = 0
    put_403_every: int = 2
    expiry_after_pages: int = 3
    chunk: int = 1000


def draw(seed: int) -> Case:
    rnd = random.Random(seed)
    spices = tuple(sorted(rnd.sample(SPICES, rnd.choice((1, 2)))))
    focus = os.environ.get("FUZZ_FOCUS")
    if focus:
        spices = tuple(sorted({focus, spices[0]}))
    fmt = "stdin" if "stdin" in spices else rnd.choice(("csv", "jsonl"))
    rules: dict[str, Any] = {}
    for knob in rnd.sample(
        ["lose", "clock", "forget", "status_lag", "list_lag", "none"], rnd.choice((1, 2))
    ):
        if knob == "lose":
            rules["lose_first_create_answer"] = True
        elif knob == "clock":
            rules["clock_ahead"] = rnd.choice((-900.0, 120.0, 3600.0))
        elif knob == "forget":
            rules["forget_when_done"] = {rnd.choice((1, 2))}
        elif knob == "status_lag":
            rules["status_lag"] = 0.5
        elif knob == "list_lag":
            rules["list_lag"] = 0.5
    faults: dict[str, Any] = {}
    pick = rnd.random()
    if pick < 0.3:
        faults["server_errors"] = ((503, 0.05),)
    elif pick < 0.5:
        faults["drop"] = 0.02
    elif pick < 0.65:
        faults["ambiguous"] = 0.03
    kinds = ("accepted", "results", "unknown", "event")
    kills = tuple(
        (rnd.choice(kinds), round(rnd.uniform(0.1, 0.9), 2))
        for _ in range(rnd.choice((0, 1, 2, 3)))
    )
    return Case(
        seed=seed,
        rows=rnd.randrange(500, 3001),
        fmt=fmt,
        spices=spices,
        rules=rules,
        faults=faults,
        kills=kills,
        rotate=rnd.choice((500, 1000, 3000)),
        singles=rnd.choice((0, 3, 6)) if "poison" not in spices else 4,
        put_403_every=rnd.choice((2, 3)),
        expiry_after_pages=rnd.choice((2, 5, 12)),
        chunk=rnd.choice((250, 1000)),
    )


class _Clock:
    def __init__(self) -> None:
        self.offset = 0.0

    def __call__(self) -> float:
        return time.time() + self.offset


class SessionFaults(MisbehavingProxy):
    """The misbehaving proxy with this session's faults, each on when its spice is drawn."""

    _TASK_ID = re.compile(rb'"taskId"(\s*):(\s*)"([^"]*)"')

    def __init__(self, case: Case, clock: _Clock, result_ttl: float) -> None:
        super().__init__("", Misbehaviour(**case.rules))
        self.case, self.clock, self.result_ttl = case, clock, result_ttl
        self.events = 0
        self.put_seen = 0
        self.later_pages = 0
        self.list_held = 0
        self.jumped = False
        clock.offset = self.rules.clock_ahead  # (a skewed service: its times and its Date)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        spices = self.case.spices
        if "integer_ids" in spices:
            number, slash, tail = request.path.removeprefix(BULK + "/").partition("/")
            if request.path.startswith(BULK + "/") and number.isdigit():
                path = f"{BULK}/{self.created[int(number) - 1]}{slash}{tail}"
                url = request.rel_url.with_path(path).with_query(request.rel_url.query)
                request = request.clone(rel_url=url)
        kind = request_kind(request.method, request.path)
        if "put_403" in spices and kind == "append":
            self.put_seen += 1
            if self.put_seen % self.case.put_403_every == 0:
                await request.read()
                self.events += 1
                body = {"status": "failure", "error": "task closed to writes"}
                return web.json_response(body, status=403, headers=self._headers())
        if "list_hang" in spices and kind == "list" and self.list_held < 4:
            self.list_held += 1
            self.events += 1
            await anyio.sleep(2.5)
        later = kind == "results" and request.query.get("offset", "0") != "0"
        if "expiry_403" in spices and later and not self.jumped:
            self.later_pages += 1
            if self.later_pages >= self.case.expiry_after_pages:  # the results expire now
                self.events = self.events + 1
                self.jumped = True
                self.clock.offset += 2 * self.result_ttl
                self.rules.clock_ahead = self.clock.offset
        answer = await super().handle(request)
        if "expiry_403" in spices and kind == "results" and answer.status == 410:
            body = {"status": "failure", "error": "forbidden"}
            return web.json_response(body, status=403, headers=self._headers())
        return answer

    def _rewrite(
        self, method: str, path: str, task_id: str | None, status: int, payload: bytes
    ) -> bytes:
        out = super()._rewrite(method, path, task_id, status, payload)
        if "integer_ids" not in self.case.spices:
            return out

        def number(m: re.Match[bytes]) -> bytes:
            ordinal = self.ordinal(m[3].decode())
            return m[0] if ordinal is None else b'"taskId"%s:%s%d' % (m[1], m[2], ordinal)

        return self._TASK_ID.sub(number, out)


def _manifest(case: Case, folder: Path) -> tuple[Path, set[str], bytes | None]:
    """The manifest, the ids routed to single mode, and the poison image's marker."""
    rnd = random.Random(case.seed * 7 + 1)
    rows: list[tuple[str, str]] = []
    for i in range(case.rows):
        ident, url = f"p{i}", f"https://img.example/{i}.jpg"
        r = rnd.random()
        if r < 0.02 and i > 10:
            ident = f"p{rnd.randrange(i)}"  # an exact duplicate of an earlier id
        elif r < 0.035:
            url = "ftp://nope/x.jpg"
        elif r < 0.04:
            ident = ""
        rows.append((ident, url))
    singles: set[str] = set()
    marker = None
    if case.singles:
        png = red_picture(folder / "red.png")
        for j in range(case.singles):
            at = rnd.randrange(len(rows))
            rows.insert(at, (f"s{j}", str(png)))
            singles.add(f"s{j}")
        if "poison" in case.spices:
            poison = red_picture(folder / "poison.jpg")
            marker = base64.b64encode(poison.read_bytes())[-120:]
            rows.append(("zz", str(poison)))
            singles.add("zz")
    if "delete_empty" in case.spices:  # bad rows last: the rejects stay empty a while
        rows.sort(key=lambda r: not r[0] or r[1].startswith("ftp"))
    if case.fmt == "jsonl" or (case.fmt == "stdin" and case.seed % 2):
        path = folder / "m.jsonl"
        path.write_text("".join(json.dumps({"id": i, "url": u}) + "\n" for i, u in rows))
    else:
        path = folder / "m.csv"
        path.write_text(
            "id,url,brand,detection\n" + "".join(f'{i},"{u}",acme,TOP\n' for i, u in rows)
        )
    return path, singles, marker


def _config(case: Case, folder: Path) -> Path:
    path = folder / "c.toml"
    give_up = 4.0 if "poison" in case.spices else 10.0
    total = 1.0 if "list_hang" in case.spices else 5.0
    path.write_text(
        f"[client.timeout]\ntotal = {total}\n\n[engine]\npoll_min = 0.02\npoll_max = 0.2\n"
        f"linger_seconds = 0.2\nrotate_images = {case.rotate}\n"
        f"rotate_min_images = {case.rotate}\nlist_lag = 1.0\ngive_up_after = {give_up}\n"
        f"single_concurrency = 1\nchunk_size = {case.chunk}\nread_again_window = 3.0\n"
    )
    return path


def _lines(out: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    results: dict[str, Any] = {}
    for line in out.read_text().splitlines() if out.exists() else ():
        row = json.loads(line)
        assert row["id"] not in results, f"{row['id']!r} written twice"
        results[row["id"]] = row["taggingResult"]
    rej = out.with_suffix(".rej")
    rejects = [json.loads(line) for line in rej.read_text().splitlines()] if rej.exists() else []
    return results, rejects


def _kill_point(
    kind: str, share: float, case: Case, state: StateProbe, proxy: SessionFaults
) -> Callable[[], bool]:
    before = (proxy.events, len(proxy.lost_answers), proxy.status_lagged, len(proxy.forgotten))
    if kind == "unknown":
        return lambda: state.taken()[2] >= 1
    if kind == "event":
        return lambda: (
            (proxy.events, len(proxy.lost_answers), proxy.status_lagged, len(proxy.forgotten))
            != before
        )
    if kind == "accepted":
        return lambda: state.taken()[0] >= share * case.rows
    return lambda: state.marks()[1] >= share * case.rows * 100


async def _open(
    args: list[str], stdin: Path | None, err: Path, tg: anyio.abc.TaskGroup
) -> tuple[Any, list[BinaryIO]]:
    """The run, its stderr to ``err``; ``stdin`` (if any) fed to it in five parts a moment
    apart (rows that trickle in: writes appended to an open task)."""
    handles = [err.open("wb")]
    proc = await anyio.open_process(
        args, env=ENV, stdin=subprocess.PIPE if stdin else None, stderr=handles[0]
    )
    if stdin is not None:
        tg.start_soon(_feed, proc, stdin.read_bytes())
    return proc, handles


async def _feed(proc: Any, data: bytes) -> None:
    step = len(data) // 5 + 1
    try:
        for at in range(0, len(data), step):
            await proc.stdin.send(data[at : at + step])
            await anyio.sleep(0.3)
        await proc.stdin.aclose()
    except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
        pass  # (killed meanwhile)


async def fuzz_case(tmp_path: Path, case: Case, state_url: str | None = None) -> None:
    manifest, singles, marker = _manifest(case, tmp_path)
    config = _config(case, tmp_path)
    source = "-" if case.fmt == "stdin" else str(manifest)
    stdin = manifest if case.fmt == "stdin" else None
    async with running_service(ServiceConfig()) as svc:
        out = tmp_path / "plain" / "out.jsonl"
        out.parent.mkdir()
        with anyio.fail_after(60), manifest.open("rb") as piped:
            plain = await anyio.run_process(
                run_args(svc.url, out, str(manifest), "--config", str(config)),
                check=False,
                env=ENV,
                stdin=piped,
            )
        assert plain.returncode == 0, plain.stderr.decode()[-1000:]
    expected, expected_rejects = _lines(out)
    plain_lines = collections.Counter([*expected, *(r["id"] for r in expected_rejects)])
    faults = FaultSpec(**case.faults, seed=case.seed) if case.faults else None
    out = tmp_path / "fuzz" / "out.jsonl"
    out.parent.mkdir()
    state, summary = StateProbe(state_url or Path(f"{out}.state")), tmp_path / "summary.json"
    clock = _Clock()
    result_ttl = 60.0
    proxy = SessionFaults(case, clock, result_ttl)
    if marker is not None:
        proxy.rules.fail_single_holding = marker
    codes: list[int] = []
    errors: list[str] = []
    service = ServiceConfig(rate=3000.0, faults=faults, result_ttl=result_ttl, clock=clock)
    deleter = deleter_of(out, state) if "delete_empty" in case.spices else (lambda: None)
    async with running_service(service) as svc, anyio.create_task_group() as tg:
        proxy.upstream = svc.url
        async with proxy.running():
            args = run_args(proxy.url, out, source, "--config", str(config))
            args += ["--summary", str(summary), *state.args]
            for point in [*case.kills, *[None] * 6]:  # the kills, then resumes to the end
                if codes and codes[-1] == 0:
                    break
                ready = _kill_point(*point, case, state, proxy) if point else (lambda: False)
                errfile = tmp_path / f"err{len(codes)}"
                proc, handles = await _open(args, stdin, errfile, tg)
                async with proc:
                    with anyio.fail_after(60):
                        while not ready() and proc.returncode is None:
                            deleter()
                            await anyio.sleep(0.005)
                    if proc.returncode is None:
                        proc.send_signal(signal.SIGKILL)
                    codes.append(await proc.wait())
                for h in handles:
                    h.close()
                if codes[-1] not in (0, -signal.SIGKILL):
                    errors.append(errfile.read_text(errors="replace")[-800:])
                    assert codes[-1] in (1, 3), errors[-1]
                if stdin is not None and "--resume" not in args and state.exists():
                    args.append("--resume")
        billed = svc.store.image_count
    state.close()
    assert codes[-1] == 0, (codes, errors)
    results, rejects = _lines(out)
    fuzz_lines = collections.Counter([*results, *(r["id"] for r in rejects)])
    assert fuzz_lines == plain_lines, (
        f"lines differ: missing {sorted((plain_lines - fuzz_lines).elements())[:5]}, "
        f"extra {sorted((fuzz_lines - plain_lines).elements())[:5]}"
    )
    wrong = sorted(i for i in results if results[i] != expected.get(i))
    assert not wrong, f"{len(wrong)} rows written with another row's result: {wrong[:5]}"
    allowed = {"expired"} if "expiry_403" in case.spices else set()
    if "poison" in case.spices:
        allowed.add("unreturned")
    lost = set(expected) - set(results)  # a result in the plain run, a reject here
    own = [r for r in rejects if r["id"] in lost and not r["reason"].startswith("duplicate id")]
    assert sorted(r["id"] for r in own) == sorted(lost), own[:3]
    assert all(r["stage"] in allowed for r in own), own[:3]
    assert not [r for r in own if r["stage"] == "unreturned" and r["id"] != "zz"], own[:3]
    bulk = [i for i in expected if i not in singles]
    figures = json.loads(summary.read_text())
    resent = figures["resent"]
    assert figures["complete"] and figures["error"] is None, figures
    if os.environ.get("FUZZ_LOG"):
        with open(os.environ["FUZZ_LOG"], "a") as log:
            stages = collections.Counter(r["stage"] for r in rejects)
            seen = (proxy.events, proxy.put_seen, proxy.list_held, proxy.single_failed)
            log.write(json.dumps([case.seed, case.spices, codes, seen, stages, resent]) + "\n")
    secrets = (DEV_API_KEY.encode(), DEV_BULK_API_KEY.encode())
    for path in [*tmp_path.glob("err*"), *out.parent.iterdir(), summary]:
        if path.is_file():
            data = path.read_bytes()
            assert not any(k in data for k in secrets), f"a key in {path.name}"
    unexplained = billed - len(bulk) - resent
    if case.faults or "put_403" in case.spices or "forget_when_done" in case.rules:
        # ``resent`` counts rows sent again: after a write of unknown fate (a 5xx, a drop)
        # that the task turns out not to hold, they were billed once only.
        assert billed >= len(bulk)
        if "forget_when_done" in case.rules and (
            case.rules.get("lose_first_create_answer") or codes[0] < 0
        ):
            # A create of unknown fate (its answer lost, or killed before it came) whose task
            # the service forgot before it was looked for: taken as never applied and sent
            # again, not counted resent (the service's doing).
            return
    assert unexplained <= 0, f"{unexplained} unexplained bills"
    # (The hanging list's case gives every request a 1 s deadline: on a loaded machine a write
    # may outlast it, of unknown fate, its rows counted resent though billed once.)
    exact = not case.faults and "put_403" not in case.spices and "list_hang" not in case.spices
    if exact and "forget_when_done" not in case.rules:
        assert unexplained == 0, f"{-unexplained} rows counted resent, not billed twice"


SEEDS = [int(s) for s in os.environ.get("FUZZ_SEEDS_LIST", "").split(",") if s]
if os.environ.get("FUZZ_SEEDS"):
    lo, _, hi = os.environ["FUZZ_SEEDS"].partition("-")
    SEEDS = list(range(int(lo), int(hi or lo) + 1))
#: Representative seeds: results expiring (403) with PUTs refused 403 and kills; PUTs refused
#: on a stdin run resumed three times; a hanging task list on stdin; an empty output deleted
#: with integer task ids; a stdin run killed three times with an output deleted; results
#: expiring with three kills; a poison image with PUTs refused.
KEPT = [182, 172, 187, 129, 189, 188, 134]


#: Kept on a PostgreSQL state too: PUTs refused on a stdin run resumed three times; results
#: expiring with three kills.
KEPT_PG = [172, 188]
BACKEND = os.environ.get("FUZZ_STATE", "sqlite")
CASES = [pytest.param(s, BACKEND, id=str(s) if BACKEND == "sqlite" else f"{s}-pg") for s in SEEDS]
CASES = CASES or [
    *(pytest.param(s, "sqlite", id=str(s)) for s in KEPT),
    *(pytest.param(s, "postgresql", id=f"{s}-pg") for s in KEPT_PG),
]


@pytest.mark.parametrize(("seed", "backend"), CASES)
async def test_session_fault_paths_killed_and_resumed(
    tmp_path: Path, seed: int, backend: str, request: pytest.FixtureRequest
) -> None:
    case = draw(seed)
    print(case, backend)
    pg = backend == "postgresql"
    await fuzz_case(
        tmp_path, case, f"{request.getfixturevalue('postgres_url')}#fuzz" if pg else None
    )
