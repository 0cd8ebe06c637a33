"""A seeded kill -9 fuzz over combinations of ``fashiontag run`` options the suite mostly runs
one at a time: a manifest as CSV, JSONL, either gzipped, piped on stdin (plain or gzip) or two
manifests in one run, with context columns and ``detection`` cells, ``data:`` images (single
mode), duplicate ids, bad rows and ids differing only in case; any of ``--reuse`` (a store
warmed by an earlier run over part of the rows), ``--sink sqlite``, ``--language ko``,
``--detection TOP,SHOES``, ``--restart`` on one of the resumes, a PostgreSQL ``--state`` and a
short request deadline; the service misbehaving (5xx, drops, ambiguous writes, clock skew,
forgotten tasks, status lag, integer task ids, pages answered 403 once expired); the run
killed (SIGKILL) at 0-3 points chosen by what it has done, then resumed until exit 0. Every
row must end exactly once, each result equal to an undisturbed run's with the same options,
rows taken from the store never sent, the bill the rows plus the re-sends the summary
reports, and the summary's counts those of the files.

``COMBO_SEEDS=1-60`` (or ``COMBO_SEEDS_LIST=3,17``) runs those seeds, ``COMBO_LOG=FILE`` appends
each case's exit codes and bill to FILE; the seeds kept here are representative cases."""

from __future__ import annotations

import base64
import collections
import gzip
import json
import os
import random
import signal
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import pytest

from fashiontag_pipeline.service import ServiceConfig, running_service
from fashiontag_pipeline.service.faults import FaultSpec

from .fuzz_state import StateProbe
from .helpers import ENV, run_args
from .test_session_fault_fuzz import Case, SessionFaults, _Clock, _kill_point, _open
from .test_single_mode import red_picture

KINDS = ("csv", "csv.gz", "jsonl", "jsonl.gz", "stdin", "stdin.gz", "two")


@dataclass
class Combo:
    seed: int
    rows: int
    kind: str
    options: tuple[str, ...]
    spices: tuple[str, ...]
    rules: dict[str, Any] = field(default_factory=dict)
    faults: dict[str, Any] = field(default_factory=dict)
    kills: tuple[tuple[str, float], ...] = ()
    restart_at: int | None = None
    singles: int = 0
    chunk: int = 1000


def draw(seed: int) -> Combo:
    rnd = random.Random(seed)
    kind = rnd.choice(KINDS)
    options = tuple(
        o
        for o in ("reuse", "sqlite", "context", "ko", "detection", "summary", "pg", "deadline")
        if rnd.random() < 0.4
    )
    spices = tuple(s for s in ("integer_ids", "expiry_403") if rnd.random() < 0.25)
    rules: dict[str, Any] = {}
    for knob in rnd.sample(["lose", "clock", "forget", "status_lag", "none"], rnd.choice((1, 2))):
        if knob == "lose":
            rules["lose_first_create_answer"] = True
        elif knob == "clock":
            rules["clock_ahead"] = rnd.choice((-900.0, 120.0, 3600.0))
        elif knob == "forget":
            rules["forget_when_done"] = {rnd.choice((1, 2))}
        elif knob == "status_lag":
            rules["status_lag"] = 0.5
    faults: dict[str, Any] = {}
    pick = rnd.random()
    if pick < 0.25:
        faults["server_errors"] = ((503, 0.05),)
    elif pick < 0.4:
        faults["drop"] = 0.02
    elif pick < 0.55:
        faults["ambiguous"] = 0.03
    kinds = ("accepted", "results", "unknown", "event")
    kills = tuple(
        (rnd.choice(kinds), round(rnd.uniform(0.1, 0.9), 2))
        for _ in range(rnd.choice((0, 1, 2, 3)))
    )
    restart_at = rnd.randrange(1, len(kills) + 1) if kills and rnd.random() < 0.2 else None
    return Combo(
        seed=seed,
        rows=rnd.randrange(300, 3001),
        kind=kind,
        options=options,
        spices=spices,
        rules=rules,
        faults=faults,
        kills=kills,
        restart_at=restart_at,
        singles=rnd.choice((0, 0, 3)),
        chunk=rnd.choice((250, 1000)),
    )


def _rows(combo: Combo, folder: Path, prefix: str, n: int) -> list[dict[str, Any]]:
    rnd = random.Random(combo.seed * 7 + len(prefix))
    rows: list[dict[str, Any]] = []
    for i in range(n):
        row: dict[str, Any] = {"id": f"{prefix}{i}", "url": f"https://img.example/{prefix}{i}.jpg"}
        r = rnd.random()
        if r < 0.02 and i > 10:
            row["id"] = f"{prefix}{rnd.randrange(i)}"  # an exact duplicate of an earlier id
        elif r < 0.03 and i > 10:
            row["id"] = f"{prefix.upper()}{rnd.randrange(i)}"  # differs only in case
        elif r < 0.045:
            row["url"] = "ftp://nope/x.jpg"
        elif r < 0.05:
            row["id"] = ""
        if "context" in combo.options:
            row["brand"] = rnd.choice(("acme", "zeta", ""))
            row["gender"] = rnd.choice(("male", "female", ""))
            row["detection"] = rnd.choice(("TOP", "SHOES", "TOP|BOTTOM", ""))
        rows.append(row)
    if combo.singles:
        png = red_picture(folder / "red.png")
        picture = base64.b64encode(png.read_bytes()).decode()
        for j in range(combo.singles):
            image = str(png) if j % 2 else f"data:image/png;base64,{picture}"
            row = {"id": f"{prefix}s{j}", "url": image}
            rows.insert(rnd.randrange(len(rows)), row)
    return rows


def _write(rows: list[dict[str, Any]], path: Path, jsonl: bool, gz: bool) -> Path:
    if jsonl:
        text = "".join(
            json.dumps(
                {k: (v.split("|") if k == "detection" and v else v) for k, v in r.items() if v}
                | {"id": r["id"], "url": r["url"]}
            )
            + "\n"
            for r in rows
        )
    else:
        heads = list(rows[0])
        text = ",".join(heads) + "\n"
        text += "".join(",".join(f'"{r.get(h, "")}"' for h in heads) + "\n" for r in rows)
    data = text.encode()
    path.write_bytes(gzip.compress(data) if gz else data)
    return path


def manifests(combo: Combo, folder: Path) -> list[Path]:
    """The manifests, written in ``folder``; one (the ``warm`` subset excluded) per kind."""
    jsonl = "jsonl" in combo.kind or (combo.kind.startswith("stdin") and combo.seed % 2 == 1)
    gz = combo.kind.endswith(".gz")
    if combo.kind == "two":
        half = combo.rows // 2
        return [
            _write(_rows(combo, folder, "p", half), folder / "a.csv", False, False),
            _write(_rows(combo, folder, "qq", combo.rows - half), folder / "b.jsonl", True, False),
        ]
    name = "m." + ("jsonl" if jsonl else "csv") + (".gz" if gz else "")
    return [_write(_rows(combo, folder, "p", combo.rows), folder / name, jsonl, gz)]


def _config(combo: Combo, folder: Path) -> Path:
    path = folder / "c.toml"
    total = 2.0 if "deadline" in combo.options else 5.0
    path.write_text(
        f"[client.timeout]\ntotal = {total}\n\n[engine]\npoll_min = 0.02\npoll_max = 0.2\n"
        "linger_seconds = 0.2\nrotate_images = 1000\nrotate_min_images = 1000\n"
        f"list_lag = 1.0\ngive_up_after = 10.0\nchunk_size = {combo.chunk}\n"
    )
    return path


def _options(combo: Combo) -> list[str]:
    extra: list[str] = []
    if "sqlite" in combo.options:
        extra += ["--sink", "sqlite"]
    if "ko" in combo.options:
        extra += ["--language", "ko"]
    if "detection" in combo.options:
        extra += ["--detection", "TOP,SHOES"]
    return extra


def outcomes(out: Path, sqlite: bool) -> tuple[dict[str, Any], set[str], list[dict[str, Any]]]:
    """The results by id, the ids written from the store, and the rejects."""
    results: dict[str, Any] = {}
    reused: set[str] = set()
    if sqlite and out.exists():
        db = sqlite3.connect(out)
        for ident, result, again in db.execute("SELECT id, result, reused FROM results"):
            results[ident] = json.loads(result)
            if again:
                reused.add(ident)
        db.close()
    elif out.exists():
        for line in out.read_text().splitlines():
            row = json.loads(line)
            assert row["id"] not in results, f"{row['id']!r} written twice"
            results[row["id"]] = row["taggingResult"]
            if row.get("reused"):
                reused.add(row["id"])
    rej = out.with_suffix(".rej")
    rejects = [json.loads(line) for line in rej.read_text().splitlines()] if rej.exists() else []
    return results, reused, rejects


def _after_reset(ready: Callable[[], bool], state: StateProbe) -> Callable[[], bool]:
    """``ready``, once the ``--restart`` run has discarded the state it found (not at once on
    the old state's figures)."""
    seen: list[bool] = []

    def check() -> bool:
        if not seen:
            if state.taken()[0] == 0:
                seen.append(True)
            return False
        return ready()

    return check


async def combo_case(tmp_path: Path, combo: Combo, state_url: str | None) -> None:
    paths = manifests(combo, tmp_path)
    config = _config(combo, tmp_path)
    piped = combo.kind.startswith("stdin")
    sources = ["-"] if piped else [str(p) for p in paths]
    sqlite = "sqlite" in combo.options
    extra = _options(combo)
    other = False
    async with running_service(ServiceConfig()) as svc:
        out = tmp_path / "plain" / "out.jsonl"
        out.parent.mkdir()
        with anyio.fail_after(60), paths[0].open("rb") as stdin:
            plain = await anyio.run_process(
                run_args(svc.url, out, *sources, "--config", str(config), *extra),
                check=False,
                env=ENV,
                stdin=stdin,
            )
        assert plain.returncode == 0, plain.stderr.decode()[-1000:]
        reuse = str(tmp_path / "store.db")
        if state_url and combo.seed % 2:  # the store in PostgreSQL beside the state
            reuse = state_url.partition("#")[0]
        if "reuse" in combo.options:  # the store warmed by a run over the first rows
            rnd = random.Random(combo.seed)
            part = tmp_path / "warm" / "part.csv"
            part.parent.mkdir()
            head = paths[0].read_bytes()
            head = gzip.decompress(head) if paths[0].suffix == ".gz" else head
            lines = head.splitlines(keepends=True)
            keep = rnd.randrange(len(lines) // 4, len(lines) // 2 + 2)
            part = part.with_suffix(".jsonl" if b"{" in lines[0][:1] else ".csv")
            part.write_bytes(b"".join(lines[:keep]))
            warm_out = part.parent / "out.jsonl"
            warm_extra = list(extra)
            if other := rnd.random() < 0.3:  # a store of another language's answers
                ko = "--language" in warm_extra
                warm_extra = [a for a in warm_extra if a not in ("--language", "ko")]
                warm_extra += [] if ko else ["--language", "ko"]
            with anyio.fail_after(60):
                warm = await anyio.run_process(
                    run_args(
                        svc.url,
                        warm_out,
                        str(part),
                        "--config",
                        str(config),
                        *warm_extra,
                        "--reuse",
                        reuse,
                    ),
                    check=False,
                    env=ENV,
                )
            assert warm.returncode == 0, warm.stderr.decode()[-1000:]
    expected, _, expected_rejects = outcomes(out, sqlite)
    plain_lines = collections.Counter([*expected, *(r["id"] for r in expected_rejects)])
    singles = {i for i in expected if "s" in i.lstrip("pq")}
    faults = FaultSpec(**combo.faults, seed=combo.seed) if combo.faults else None
    out = tmp_path / "fuzz" / ("out.db" if sqlite else "out.jsonl")
    out.parent.mkdir()
    state = StateProbe(state_url or Path(f"{out}.state"))
    summary = tmp_path / "summary.json"
    clock = _Clock()
    result_ttl = 60.0
    case = Case(seed=combo.seed, rows=combo.rows, fmt="csv", spices=combo.spices, rules=combo.rules)
    proxy = SessionFaults(case, clock, result_ttl)
    codes: list[int] = []
    errors: list[str] = []
    service = ServiceConfig(rate=3000.0, faults=faults, result_ttl=result_ttl, clock=clock)
    billed_before = 0
    async with running_service(service) as svc, anyio.create_task_group() as tg:
        proxy.upstream = svc.url
        async with proxy.running():
            args = run_args(proxy.url, out, *sources, "--config", str(config), *extra)
            args += ["--summary", str(summary), *state.args]
            if "reuse" in combo.options:
                args += ["--reuse", reuse]
            for n, point in enumerate([*combo.kills, *[None] * 6]):
                if codes and codes[-1] == 0:
                    break
                ready = _kill_point(*point, case, state, proxy) if point else (lambda: False)
                if point and point[0] == "results" and sqlite:  # (its checkpoint: a rowid)
                    ready = lambda s=point[1]: state.marks()[1] >= s * combo.rows  # noqa: E731
                run = list(args)
                if n == combo.restart_at:
                    run = [a for a in run if a != "--resume"] + ["--restart"]
                    billed_before = svc.store.image_count
                    ready = _after_reset(ready, state)
                errfile = tmp_path / f"err{len(codes)}"
                proc, handles = await _open(run, paths[0] if piped else None, errfile, tg)
                async with proc:
                    with anyio.fail_after(60):
                        while not ready() and proc.returncode is None:
                            await anyio.sleep(0.005)
                    if proc.returncode is None:
                        proc.send_signal(signal.SIGKILL)
                    codes.append(await proc.wait())
                for h in handles:
                    h.close()
                if codes[-1] not in (0, -signal.SIGKILL):
                    errors.append(errfile.read_text(errors="replace")[-800:])
                    assert codes[-1] in (1, 3), errors[-1]
                if piped and "--resume" not in args and state.exists():
                    args.append("--resume")
        billed = svc.store.image_count - billed_before
    state.close()
    assert codes[-1] == 0, (codes, errors)
    results, reused, rejects = outcomes(out, sqlite)
    fuzz_lines = collections.Counter([*results, *(r["id"] for r in rejects)])
    assert fuzz_lines == plain_lines, (
        f"lines differ: missing {sorted((plain_lines - fuzz_lines).elements())[:5]}, "
        f"extra {sorted((fuzz_lines - plain_lines).elements())[:5]}"
    )
    wrong = sorted(i for i in results if results[i] != expected.get(i))
    assert not wrong, f"{len(wrong)} rows written with another result: {wrong[:5]}"
    lost = set(expected) - set(results)
    own = [r for r in rejects if r["id"] in lost and not r["reason"].startswith("duplicate id")]
    assert sorted(r["id"] for r in own) == sorted(lost), own[:3]
    allowed = {"expired"} if "expiry_403" in combo.spices else set()
    assert all(r["stage"] in allowed for r in own), own[:3]
    figures = json.loads(summary.read_text())
    assert figures["complete"] and figures["error"] is None, figures
    written = figures["tagged"] + figures["failed"] + figures["reused"]
    assert (written, figures["rejected"]) == (len(results), len(rejects)), figures
    assert figures["reused"] == len(reused), figures
    assert not reused & singles, "a single-mode row written from the store"
    if "reuse" not in combo.options or (other and combo.restart_at is None):
        assert not reused
    bulk = [i for i in expected if i not in singles and i not in reused]
    unexplained = billed - len(bulk) - figures["resent"]
    if os.environ.get("COMBO_LOG"):
        with open(os.environ["COMBO_LOG"], "a") as log:
            stages = collections.Counter(r["stage"] for r in rejects)
            seen = (proxy.events, len(reused), billed, figures["resent"], unexplained)
            log.write(json.dumps([combo.seed, combo.kind, codes, seen, stages]) + "\n")
    if combo.faults or "forget_when_done" in combo.rules:
        assert billed >= len(bulk)
        if "forget_when_done" in combo.rules:
            return
    assert unexplained <= 0, f"{unexplained} unexplained bills (reused {len(reused)})"
    if not combo.faults and "deadline" not in combo.options:
        assert unexplained == 0, f"{-unexplained} rows counted resent, not billed twice"


SEEDS = [int(s) for s in os.environ.get("COMBO_SEEDS_LIST", "").split(",") if s]
if os.environ.get("COMBO_SEEDS"):
    lo, _, hi = os.environ["COMBO_SEEDS"].partition("-")
    SEEDS = list(range(int(lo), int(hi or lo) + 1))
#: Representative seeds: a reused store with --language ko, --detection and context columns
#: under 5xx and two kills; two manifests with --reuse, --sink sqlite and a PostgreSQL state,
#: killed three times; gzip on stdin with data: images and integer task ids, killed three
#: times; --sink sqlite in Korean with expiring pages and a short deadline; every option on
#: gzip piped into a PostgreSQL state; --sink sqlite with single-mode rows and a --restart.
KEPT = [452, 457, 456, 465, 471, 478]
CASES = SEEDS or KEPT


@pytest.mark.parametrize("seed", CASES)
async def test_option_combinations_killed_and_resumed(
    tmp_path: Path, seed: int, request: pytest.FixtureRequest
) -> None:
    combo = draw(seed)
    print(combo)
    url = None
    if "pg" in combo.options:
        url = f"{request.getfixturevalue('postgres_url')}#combo"
    await combo_case(tmp_path, combo, url)
