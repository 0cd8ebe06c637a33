"""``python -m benchmarks.pg_state``: the engine's CPU per image with its state in PostgreSQL
next to SQLite.

A real PostgreSQL is started the way the tests start one (:class:`tests.postgres.PostgresCluster`:
the pgserver wheel's binaries, a Unix socket, ``fsync=off``); the reference service runs in its
own process (``serve --rate 0 --no-fetch``, a fresh one for every run, as in the ``compare``
scenario). For each size and each round, ``fashiontag run`` runs once with a SQLite state file
and once with ``--state postgresql://...#run`` (a fresh schema each time), and reports per
backend:

* the client's CPU per image (user + sys of the engine process from ``os.wait4``, start-up
  included), wall seconds and peak RSS; median of ``--repeat`` rounds, min-max beside it;
* for PostgreSQL, the server's CPU over the run: every process of the cluster from
  ``/proc/PID/stat`` (the postmaster's own and reaped children's time, plus its live children),
  sampled before and after the run;
* the ratios PostgreSQL / SQLite.

``--breakdown`` adds one instrumented run per backend (the Python API in a child process, the
state wrapped): client thread CPU and wall time spent in each kind of state operation (dedupe
insert, chunk write-ahead, page commit, intake and other commits), with their statement counts.
``--profile`` records the PostgreSQL run with ``py-spy record --native`` and prints the shares
of the state's work in it. Results: ``results/pg-state.json`` / ``pg-state.md`` (other sizes:
``pg-state-N.*``).

    python -m benchmarks.pg_state --rows 20000,200000 --repeat 3 --breakdown --profile
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .ab import _export
from .harness import (
    PY,
    MeasuredRun,
    byte_compile_package,
    manifest,
    manifest_options,
    running_service,
)
from .scenarios import QUICK, Bench, _median

RESULTS = Path(__file__).parent / "results"
ROOT = Path(__file__).resolve().parent.parent
_CLK_TCK = os.sysconf("SC_CLK_TCK")


# --------------------------------------------------------------------------- the server


@contextmanager
def running_cluster() -> Iterator[Any]:
    """A PostgreSQL of the tests' harness for the whole invocation."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from tests.postgres import PostgresCluster

    cluster = PostgresCluster()
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.destroy()


def _stat(pid: int | str) -> list[str] | None:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return raw[raw.rindex(")") + 2 :].split()


def _postmaster(cluster: Any) -> int:
    return int((Path(cluster.data) / "postmaster.pid").read_text().split()[0])


def _children(ppid: int) -> dict[int, float]:
    """CPU seconds (user + sys) of the live children of ``ppid``."""
    out: dict[int, float] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        fields = _stat(entry.name)
        if fields is not None and int(fields[1]) == ppid:
            out[int(entry.name)] = (int(fields[11]) + int(fields[12])) / _CLK_TCK
    return out


def server_cpu_seconds(cluster: Any) -> tuple[float, set[int]]:
    """CPU seconds the whole cluster has used so far: the postmaster's own, its reaped
    children's (backends that ended), and its live children's; with the live children."""
    pm = _postmaster(cluster)
    fields = _stat(pm)
    assert fields is not None, "the postmaster is gone"
    own = sum(int(f) for f in fields[11:15]) / _CLK_TCK  # utime stime cutime cstime
    live = _children(pm)
    return own + sum(live.values()), set(live)


def _settle_backends(cluster: Any, before: set[int], timeout: float = 5.0) -> None:
    """Wait until the client's backend has ended (and been reaped): its CPU then counts in
    the postmaster's children time."""
    deadline = time.monotonic() + timeout
    pm = _postmaster(cluster)
    while time.monotonic() < deadline and set(_children(pm)) - before:
        time.sleep(0.05)


# --------------------------------------------------------------------------- measured runs


def _state_arg(cmd: list[str], location: str) -> list[str]:
    """``cmd`` with its ``--state`` value replaced."""
    out = list(cmd)
    out[out.index("--state") + 1] = location
    return out


@dataclass(frozen=True)
class Variant:
    """One column of the comparison: a backend, and the engine of the checkout or of an
    exported revision (``source``: imported through ``PYTHONPATH`` from a neutral cwd)."""

    name: str
    postgres: bool
    source: Path | None = None


@contextmanager
def _pythonpath(source: Path | None) -> Iterator[None]:
    """Children started inside import the package from ``source`` (when given)."""
    if source is None:
        yield
        return
    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = str(source)
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = old


def _one_run(
    bench: Bench, cluster: Any, variant: Variant, n: int, i: int, m: Path
) -> tuple[MeasuredRun, float | None]:
    tag = f"pgs-{variant.name.replace('@', '-')}-{n}-{i}"
    with running_service(bench.work) as svc, _pythonpath(variant.source):
        cmd, paths = bench.engine_cli(tag, m, svc.url)
        if variant.postgres:
            cmd = _state_arg(cmd, cluster.create_schema("bench") + "#run")
            before, live = server_cpu_seconds(cluster)
        run = bench.measure(f"{variant.name} {n:,} #{i + 1}", (cmd, paths), rows=n, service=svc)
        server = None
        if variant.postgres:
            _settle_backends(cluster, live)
            server = server_cpu_seconds(cluster)[0] - before
            bench.log(f"    server CPU {server:.2f}s ({server / n * 1e6:.1f} us/row)")
    return run, server


#: The ids of the manifests measured (``--ids``: see :func:`~.harness.manifest`).
_MANIFEST: list[tuple[str, bool, bool]] = [("sequential", False, False)]


def measure(
    bench: Bench, cluster: Any, variants: list[Variant], sizes: list[int], repeat: int
) -> list[dict[str, Any]]:
    table: list[dict[str, Any]] = []
    for n in sizes:
        m = manifest(bench.work, n, *_MANIFEST[0])
        runs: dict[str, list[tuple[MeasuredRun, float | None]]] = {v.name: [] for v in variants}
        # Rounds of one run per variant, so all see the same changes in the machine's load.
        for i in range(repeat):
            for variant in variants:
                runs[variant.name].append(_one_run(bench, cluster, variant, n, i, m))
        cells: list[dict[str, Any]] = []
        for variant in variants:
            done = [r for r, _ in runs[variant.name]]
            cpu = [r.cpu_us_per_row for r in done]
            servers = [s for _, s in runs[variant.name] if s is not None]
            cell: dict[str, Any] = {
                "rows": n,
                "backend": variant.name,
                "cpu_us_per_image": round(_median(cpu), 2),
                "cpu_us_min": round(min(cpu), 2),
                "cpu_us_max": round(max(cpu), 2),
                "user_us_per_image": round(_median([r.user_s / n * 1e6 for r in done]), 2),
                "sys_us_per_image": round(_median([r.sys_s / n * 1e6 for r in done]), 2),
                "wall_s": round(_median([r.wall_s for r in done]), 2),
                "peak_rss_mb": round(_median([r.peak_rss_mb for r in done]), 1),
                "service_cpu_us_per_image": round(
                    _median([(r.service_cpu_s or 0) / n * 1e6 for r in done]), 2
                ),
                "server_cpu_us_per_image": round(_median(servers) / n * 1e6, 2)
                if servers
                else None,
                "complete": all(
                    r.ok and (r.summary or {}).get("complete", True) and r.out_lines == n
                    for r in done
                ),
                "runs": [r.to_json(max_samples=1) for r in done],
                "server_cpu_s": [round(s, 3) for s in servers],
            }
            for run in cell["runs"]:
                run.pop("samples", None)
            cells.append(cell)
        sq = cells[0]  # the SQLite state of the checkout
        for cell in cells[1:]:
            for key in ("cpu_us_per_image", "wall_s", "peak_rss_mb"):
                cell[f"{key}_over_sqlite"] = round(cell[key] / sq[key], 3) if sq[key] else None
        table += cells
    return table


# --------------------------------------------------------------------------- breakdown


def breakdown(
    bench: Bench, cluster: Any, variants: list[Variant], n: int, repeat: int
) -> dict[str, Any]:
    """Instrumented runs (``--drive`` in a child process), ``repeat`` rounds of one per
    variant; every figure is the median of the rounds."""
    m = manifest(bench.work, n, *_MANIFEST[0])
    got: dict[str, list[dict[str, Any]]] = {v.name: [] for v in variants}
    for i in range(repeat):
        for variant in variants:
            tag = f"pgs-breakdown-{variant.name.replace('@', '-')}-{n}"
            p = bench.paths(tag)
            state = str(p["state"])
            if variant.postgres:
                state = cluster.create_schema("bench") + "#run"
            report = p["summary"].with_suffix(".kinds.json")
            with running_service(bench.work) as svc:
                cmd = [PY, "-m", "benchmarks.pg_state", "--drive", str(m), "--base-url", svc.url]
                cmd += ["--out", str(p["out"]), "--rejects", str(p["rejects"]), "--state", state]
                cmd += ["--report", str(report)]
                bench.log(f"  instrumented {variant.name} run ({n:,} rows) #{i + 1} ...")
                # The exported revision's own copy of this module drives its own engine.
                with _pythonpath(variant.source):
                    subprocess.run(cmd, check=True, cwd=variant.source or ROOT)
            got[variant.name].append(json.loads(report.read_text()))
            for path in (p["out"], p["rejects"], report):
                path.unlink(missing_ok=True)
    return {name: _median_report(reports) for name, reports in got.items()}


def _median_report(reports: list[dict[str, Any]]) -> dict[str, Any]:
    """The median of each number of several ``--drive`` reports (kinds included)."""
    out: dict[str, Any] = {"rounds": len(reports)}
    for key, value in reports[0].items():
        if key == "kinds":
            kinds: dict[str, dict[str, float]] = {}
            for name in sorted({k for r in reports for k in r["kinds"]}):
                rows = [r["kinds"].get(name, {}) for r in reports]
                fields = sorted({f for row in rows for f in row})
                kinds[name] = {f: _median([row.get(f, 0) for row in rows]) for f in fields}
            out["kinds"] = kinds
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            out[key] = _median([r[key] for r in reports])
        else:
            out[key] = value
    return out


class _Kinds:
    """Thread CPU and wall time per kind of state operation (the innermost one running)."""

    def __init__(self) -> None:
        self.stack = threading.local()
        self.ops: dict[str, list[float]] = collections.defaultdict(lambda: [0, 0.0, 0.0, 0])
        self.sql: dict[str, list[float]] = collections.defaultdict(lambda: [0, 0.0, 0.0])
        self.trips: collections.Counter[str] = collections.Counter()

    def current(self) -> str:
        stack = getattr(self.stack, "kinds", None)
        return stack[-1][0] if stack else "other"

    def wrap(self, fn: Callable[..., Any], kind: Callable[..., str] | str) -> Callable[..., Any]:
        kinds = self

        def wrapped(*args: Any, **kwargs: Any) -> Any:
            name = kind(*args, **kwargs) if callable(kind) else kind
            stack = getattr(kinds.stack, "kinds", None)
            if stack is None:
                stack = kinds.stack.kinds = []
            # [kind, cpu of nested kinds, wall of nested kinds]
            stack.append([name, 0.0, 0.0])
            cpu0, wall0 = time.thread_time(), time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                cpu, wall = time.thread_time() - cpu0, time.perf_counter() - wall0
                _, inner_cpu, inner_wall = stack.pop()
                row = kinds.ops[name]
                row[0] += 1
                row[1] += cpu - inner_cpu
                row[2] += wall - inner_wall
                if stack:
                    stack[-1][1] += cpu
                    stack[-1][2] += wall

        return wrapped


class _CountingDB:
    """The state's connection, counting and timing each statement for the current kind."""

    def __init__(self, db: Any, kinds: _Kinds) -> None:
        self._db = db
        self._kinds = kinds

    def __getattr__(self, name: str) -> Any:
        return getattr(self._db, name)

    def _timed(self, method: str, *args: Any) -> Any:
        cpu0, wall0 = time.thread_time(), time.perf_counter()
        try:
            return getattr(self._db, method)(*args)
        finally:
            row = self._kinds.sql[self._kinds.current()]
            row[0] += 1
            row[1] += time.thread_time() - cpu0
            row[2] += time.perf_counter() - wall0

    def execute(self, *args: Any) -> Any:
        return self._timed("execute", *args)

    def executemany(self, *args: Any) -> Any:
        return self._timed("executemany", *args)


def _drive(args: argparse.Namespace) -> int:
    """The instrumented run (a child of :func:`breakdown`): ``run_pipeline`` with the state
    opened here, its operations wrapped."""
    import anyio

    from fashiontag_pipeline import ClientConfig, Secret
    from fashiontag_pipeline._config import DEV_API_KEY, DEV_BULK_API_KEY
    from fashiontag_pipeline.engine import EngineConfig, run_pipeline
    from fashiontag_pipeline.engine.state import open_state
    from fashiontag_pipeline.engine.state.journal import Journal
    from fashiontag_pipeline.engine.state.store import StateStore

    kinds = _Kinds()

    def apply_kind(journal: Any, page: Any, *rest: Any) -> str:
        if page is not None:
            return "page commit"
        stack = getattr(kinds.stack, "kinds", None)
        return "intake commit" if stack else "other commit"

    Journal._intake = kinds.wrap(Journal._intake, "intake (rest)")  # type: ignore[method-assign]
    Journal._apply = kinds.wrap(Journal._apply, apply_kind)  # type: ignore[method-assign]
    StateStore.dedupe = kinds.wrap(StateStore.dedupe, "dedupe insert")  # type: ignore[method-assign]
    StateStore.insert_chunk = kinds.wrap(  # type: ignore[method-assign]
        StateStore.insert_chunk, "chunk write-ahead"
    )
    StateStore.accepted_rows = kinds.wrap(  # type: ignore[method-assign]
        StateStore.accepted_rows, "accepted_rows query"
    )
    cpu0 = time.process_time()
    if args.state.startswith("postgresql"):
        import psycopg  # what a PostgreSQL state costs at start-up
    imported = time.process_time() - cpu0
    cpu0, wall0 = time.process_time(), time.perf_counter()
    if args.state.startswith("postgresql"):
        import psycopg

        def counted(fn: Callable[..., Any]) -> Callable[..., Any]:
            def call(*a: Any, **k: Any) -> Any:
                kinds.trips[kinds.current()] += 1
                return fn(*a, **k)

            return call

        # Every statement the driver sends (ClientCursor inherits these): the round trips.
        psycopg.Cursor.execute = counted(psycopg.Cursor.execute)  # type: ignore[method-assign]
        psycopg.Cursor.executemany = counted(  # type: ignore[method-assign]
            psycopg.Cursor.executemany
        )
    store = open_state(args.state)
    opened = {"cpu_s": time.process_time() - cpu0, "wall_s": time.perf_counter() - wall0}
    store.db = _CountingDB(store.db, kinds)
    client = ClientConfig(
        base_url=args.base_url,
        api_key=Secret(DEV_API_KEY),
        bulk_api_key=Secret(DEV_BULK_API_KEY),
    )

    async def main() -> Any:
        return await run_pipeline(
            [Path(args.drive)],
            client=client,
            out=Path(args.out),
            rejects=Path(args.rejects),
            state=store,
            engine=EngineConfig(),
        )

    try:
        import uvloop  # noqa: F401

        options = {"use_uvloop": True}
    except ImportError:
        options = {}
    cpu0, wall0 = time.process_time(), time.perf_counter()
    summary = anyio.run(main, backend_options=options)
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    report = {
        "process_cpu_s": round(cpu, 3),
        "wall_s": round(wall, 3),
        "tagged": summary.tagged,
        "complete": summary.complete,
        "import_driver_cpu_s": round(imported, 4),
        "open_cpu_s": round(opened["cpu_s"], 4),
        "open_wall_s": round(opened["wall_s"], 4),
        "kinds": {
            name: {
                "calls": int(op[0]),
                "thread_cpu_s": round(op[1], 4),
                "wall_s": round(op[2], 4),
                "statements": int(kinds.sql[name][0]),
                "driver_calls": kinds.trips[name],
                "sql_thread_cpu_s": round(kinds.sql[name][1], 4),
                "sql_wall_s": round(kinds.sql[name][2], 4),
            }
            for name, op in sorted(kinds.ops.items())
        },
    }
    Path(args.report).write_text(json.dumps(report, indent=2) + "\n")
    return 0


# --------------------------------------------------------------------------- profile

#: Functions that mark a sample as the state's work, innermost first (the first found wins).
_PROFILE_KINDS = (
    ("dedupe", "dedupe insert"),
    ("insert_chunk", "chunk write-ahead"),
    ("accepted_rows", "accepted_rows query"),
    ("_apply", "journal commit (_apply)"),
)


def profile(bench: Bench, cluster: Any, n: int, rate: int) -> dict[str, Any]:
    """``py-spy record --native`` of ``fashiontag run`` with the PostgreSQL state: the shares
    of the samples per kind of state operation, and the top leaves inside them."""
    spy = shutil.which("py-spy") or str(Path(PY).parent / "py-spy")
    if not Path(spy).exists():
        return {"error": "py-spy not found: pip install -e '.[bench]'"}
    m = manifest(bench.work, n, *_MANIFEST[0])
    out_dir = bench.work / "profile"
    out_dir.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {}
    for backend in ("sqlite", "postgresql"):
        speedscope = out_dir / f"pg-state-{backend}.speedscope.json"
        with running_service(bench.work) as svc:
            cmd, p = bench.engine_cli(f"pgs-profile-{backend}-{n}", m, svc.url)
            if backend == "postgresql":
                cmd = _state_arg(cmd, cluster.create_schema("bench") + "#run")
            spy_cmd = [spy, "record", "--native", "-r", str(rate), "-o", str(speedscope)]
            spy_cmd += ["--format", "speedscope", "--", *cmd]
            bench.log(f"  py-spy --native {backend} ({n:,} rows) ...")
            subprocess.run(
                spy_cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
            )
        for path in (p["out"], p["rejects"]):
            path.unlink(missing_ok=True)
        result[backend] = _profile_shares(speedscope)
    return result


#: Leaves that are a thread waiting, not using CPU (py-spy --native counts them).
_WAITS = frozenset({"poll", "epoll_wait", "select", "pthread_cond_timedwait", "pthread_cond_wait"})


def _profile_shares(speedscope: Path, top: int = 12) -> dict[str, Any]:
    doc = json.loads(speedscope.read_text())
    frames = doc["shared"]["frames"]
    total = 0.0
    kinds: collections.Counter[str] = collections.Counter()
    leaves: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    for prof in doc["profiles"]:
        for stack, weight in zip(prof["samples"], prof["weights"], strict=True):
            total += weight
            names = {str(frames[i]["name"]).rsplit(".", 1)[-1] for i in stack}
            kind = "rest of the engine"
            for marker, label in _PROFILE_KINDS:
                if marker in names:
                    kind = label
                    break
            leaf_name = str(frames[stack[-1]]["name"]) if stack else ""
            if leaf_name in _WAITS:
                kind = f"waiting ({leaf_name})"
            kinds[kind] += weight
            if stack:
                leaf = frames[stack[-1]]
                where = Path(str(leaf.get("file", ""))).name
                leaves[kind][f"{leaf['name']} ({where})"] += weight
    return {
        "samples_s": round(total, 3),
        "shares": {k: round(100 * w / total, 2) for k, w in kinds.most_common()},
        "seconds": {k: round(w, 3) for k, w in kinds.most_common()},
        "top_leaves": {
            k: [(round(100 * w / total, 2), name) for name, w in c.most_common(top)]
            for k, c in leaves.items()
            if k != "rest of the engine" and not k.startswith("waiting")
        },
    }


# --------------------------------------------------------------------------- micro

_UPDATE = "UPDATE meta SET value = CAST(CAST(value AS BIGINT) + %s AS TEXT) WHERE key = %s"


def micro(cluster: Any, rounds: int = 3) -> list[dict[str, Any]]:
    """The state's costly statements alone on one connection: this process's CPU (the
    client) and the backend's (``/proc``; 10 ms ticks, hence the sizes), median of
    ``rounds``, per unit."""
    import psycopg

    conn = psycopg.connect(cluster.create_schema("micro"), autocommit=True)
    backend = conn.info.backend_pid

    def server() -> float:
        fields = _stat(backend)
        assert fields is not None
        return (int(fields[11]) + int(fields[12])) / _CLK_TCK

    conn.execute("CREATE TABLE meta (key text PRIMARY KEY, value text)")
    conn.execute("INSERT INTO meta SELECT 'n_' || g, '0' FROM generate_series(0, 4) g")
    conn.execute('CREATE TABLE ids (id text COLLATE "C" PRIMARY KEY, pos bigint NOT NULL)')
    conn.execute("CREATE TABLE bodies (chunk_id bigint PRIMARY KEY, body bytea NOT NULL)")
    conn.execute("CREATE TABLE bodies_ext (chunk_id bigint PRIMARY KEY, body bytea NOT NULL)")
    conn.execute("ALTER TABLE bodies_ext ALTER COLUMN body SET STORAGE EXTERNAL")
    batches = [
        ([f"sku-{b * 2000 + i:09d}" for i in range(2000)], list(range(b * 2000, b * 2000 + 2000)))
        for b in range(100)
    ]
    body = b"".join(
        b'{"id":"sku-%09d","imageUrl":"https://img.example.com/catalog/%d/%d.jpg"},'
        % (i, i % 997, i)
        for i in range(1000)
    )
    params = [(1, f"n_{j % 5}") for j in range(10)]

    def separate() -> None:
        conn.execute("BEGIN")
        for p in params:
            conn.execute(_UPDATE, p)
        conn.execute("COMMIT")

    def pipeline() -> None:
        with conn.pipeline():
            separate()

    client = psycopg.ClientCursor(conn)
    batch = ";".join(["BEGIN", *[_UPDATE] * len(params), "COMMIT"])
    flat = [v for p in params for v in p]

    def ids(sql: str) -> Callable[[], None]:
        def run() -> None:
            conn.execute("TRUNCATE ids")
            for keys, pos in batches:
                conn.execute(sql, (keys, pos))

        return run

    def copy_ids() -> None:
        conn.execute("TRUNCATE ids")
        for keys, pos in batches:
            with conn.cursor().copy("COPY ids FROM STDIN") as cp:
                for row in zip(keys, pos, strict=True):
                    cp.write_row(row)

    def bodies(table: str) -> Callable[[], None]:
        def run() -> None:
            conn.execute(f"TRUNCATE {table}")
            for i in range(200):
                conn.execute(f"INSERT INTO {table} VALUES (%s, %s)", (i, body))

        return run

    unnest = "INSERT INTO ids SELECT * FROM unnest(%{0}::text[], %{0}::bigint[])"
    cases: list[tuple[str, str, int, Callable[[], None]]] = [
        ("transaction of 10 UPDATEs, one execute each", "tx", 500, separate),
        ("the same in pipeline mode", "tx", 500, pipeline),
        ("the same as one client-bound execute", "tx", 500, lambda: client.execute(batch, flat)),
        ("ids, text arrays (%s), ON CONFLICT", "id", 200_000, ids(unnest.format("s") + _OC)),
        ("ids, binary arrays (%b), ON CONFLICT", "id", 200_000, ids(unnest.format("b") + _OC)),
        ("ids, binary arrays, plain INSERT", "id", 200_000, ids(unnest.format("b"))),
        ("ids, COPY", "id", 200_000, copy_ids),
        (f"chunk bodies ({len(body) // 1000} KB), pglz", "chunk", 200, bodies("bodies")),
        ("chunk bodies, STORAGE EXTERNAL", "chunk", 200, bodies("bodies_ext")),
    ]
    out = []
    try:
        for name, unit, count, fn in cases:
            got = []
            for _ in range(rounds):
                s0, c0 = server(), time.process_time()
                if unit == "tx":
                    for _ in range(count):
                        fn()
                else:
                    fn()
                got.append((time.process_time() - c0, server() - s0))
            out.append(
                {
                    "case": name,
                    "unit": unit,
                    "units": count,
                    "client_us_per_unit": round(_median([c for c, _ in got]) / count * 1e6, 3),
                    "server_us_per_unit": round(_median([v for _, v in got]) / count * 1e6, 3),
                }
            )
        sizes = conn.execute(
            "SELECT pg_total_relation_size('bodies'), pg_total_relation_size('bodies_ext')"
        ).fetchone()
        out.append({"case": "chunk bodies table sizes (bytes)", "sizes": list(sizes or ())})
    finally:
        conn.close()
    return out


_OC = " ON CONFLICT DO NOTHING"


# --------------------------------------------------------------------------- report


def _side_by_side(doc: dict[str, Any]) -> list[str]:
    lines = [
        "",
        "CPU = user + sys of the `fashiontag run` process (os.wait4), start-up included; server "
        "= every process of the PostgreSQL cluster (/proc), before/after the run. Median of "
        f"{doc['repeat']} round(s), min-max in brackets; every run against a fresh "
        "`serve --rate 0 --no-fetch` and a fresh state.",
        "",
        "| rows | state | client CPU us/image | user / sys | wall s | peak RSS MiB "
        "| PG server CPU us/image | service CPU us/image |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for c in doc["table"]:
        server = c["server_cpu_us_per_image"]
        lines.append(
            f"| {c['rows']:,} | {c['backend']} | {c['cpu_us_per_image']:.1f} "
            f"({c['cpu_us_min']:.1f}-{c['cpu_us_max']:.1f}) "
            f"| {c['user_us_per_image']:.1f} / {c['sys_us_per_image']:.1f} | {c['wall_s']:.2f} "
            f"| {c['peak_rss_mb']:.0f} | {'-' if server is None else f'{server:.1f}'} "
            f"| {c['service_cpu_us_per_image']:.1f} |"
        )
    lines += [
        "",
        "| rows | state | / SQLite: client CPU | wall | peak RSS |",
        "|---|---|---|---|---|",
    ]
    for c in doc["table"]:
        if "cpu_us_per_image_over_sqlite" in c:
            lines.append(
                f"| {c['rows']:,} | {c['backend']} | {c['cpu_us_per_image_over_sqlite']:.2f}x "
                f"| {c['wall_s_over_sqlite']:.2f}x | {c['peak_rss_mb_over_sqlite']:.2f}x |"
            )
    return lines


def report_md(doc: dict[str, Any]) -> str:
    lines = [
        "# Engine state: PostgreSQL next to SQLite",
        "",
        f"`{doc['command']}` at commit `{doc['commit']}`; {doc['machine']}.",
    ]
    if doc["table"]:
        lines += _side_by_side(doc)
    if doc.get("breakdown"):
        n = doc["breakdown_rows"]
        names = list(doc["breakdown"])
        kinds = [doc["breakdown"][v]["kinds"] for v in names]
        heads = " / ".join(names)
        lines += [
            "",
            f"Where the state's time goes ({n:,} rows, instrumented runs, median of "
            f"{doc['breakdown'][names[0]].get('rounds', 1)} per variant: the "
            "journal thread's CPU and wall time per image in each kind of operation, nested "
            "kinds excluded; statements = the store's execute calls; psycopg executes = what "
            "the driver sent, each a round trip):",
            "",
            f"| kind | calls | statements | psycopg executes | thread CPU us/image ({heads}) "
            f"| wall us/image ({heads}) |",
            "|---|---|---|---|---|---|",
        ]
        every = sorted(
            set().union(*kinds), key=lambda k: -max(x.get(k, {}).get("wall_s", 0) for x in kinds)
        )
        for name in every:
            got = [x.get(name, {}) for x in kinds]

            def cells(key: str, scale: float, fmt: str, got: list[dict[str, Any]] = got) -> str:
                return " / ".join(format(g.get(key, 0) * scale, fmt) for g in got)

            per = 1e6 / n
            lines.append(
                f"| {name} | {cells('calls', 1, ',')} | {cells('statements', 1, ',')} "
                f"| {cells('driver_calls', 1, ',')} "
                f"| {cells('thread_cpu_s', per, '.2f')} | {cells('wall_s', per, '.2f')} |"
            )
        total = [sum(k["thread_cpu_s"] for k in x.values()) / n * 1e6 for x in kinds]
        lines.append(f"| **all state work** | | | | {' / '.join(f'{t:.2f}' for t in total)} | |")
    if doc.get("micro"):
        lines += [
            "",
            "Statements in isolation (`--micro`: one connection, this process's CPU and the "
            "backend's, median of 3):",
            "",
            "| case | client us | server us | per |",
            "|---|---|---|---|",
        ]
        for m in doc["micro"]:
            if "unit" in m:
                lines.append(
                    f"| {m['case']} | {m['client_us_per_unit']:.2f} "
                    f"| {m['server_us_per_unit']:.2f} | {m['unit']} |"
                )
            else:
                lines.append(f"| {m['case']} | {m['sizes']} | | |")
    if doc.get("profile"):
        lines += ["", f"py-spy --native ({doc['profile_rows']:,} rows), share of samples:", ""]
        lines += ["| kind | SQLite | PostgreSQL |", "|---|---|---|"]
        sq, pg = doc["profile"].get("sqlite", {}), doc["profile"].get("postgresql", {})
        keys = list(pg.get("shares", {}))
        for key in keys:
            lines.append(
                f"| {key} | {sq.get('seconds', {}).get(key, 0):.2f} s "
                f"({sq.get('shares', {}).get(key, 0):.1f}%) "
                f"| {pg['seconds'][key]:.2f} s ({pg['shares'][key]:.1f}%) |"
            )
    lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.pg_state", description=__doc__)
    p.add_argument(
        "--rows",
        type=lambda v: [int(x) for x in v.split(",")],
        default=[20_000, 200_000],
        metavar="N[,N...]",
        help="manifest sizes (default 20000,200000)",
    )
    p.add_argument(
        "--repeat", type=int, default=3, help="rounds (median reported; 0: no side by side)"
    )
    p.add_argument("--breakdown", action="store_true", help="instrumented run per backend")
    p.add_argument("--profile", action="store_true", help="py-spy --native of both backends")
    p.add_argument("--detail-rows", type=int, help="rows of --breakdown/--profile (largest)")
    p.add_argument("--work", type=Path, default=RESULTS / "tmp" / "pg-state")
    p.add_argument("--name", help="results file stem (default pg-state or pg-state-N)")
    p.add_argument(
        "--baseline",
        metavar="REV",
        action="append",
        default=[],
        help="also measure the PostgreSQL state with the engine of git revision REV (exported "
        "with git archive; rounds interleaved with the checkout's; repeatable)",
    )
    p.add_argument("--breakdown-repeat", type=int, default=3, help="rounds of --breakdown (median)")
    manifest_options(p)
    p.add_argument("--micro", action="store_true", help="the costly statements in isolation")
    p.add_argument("--drive", help=argparse.SUPPRESS)
    for flag in ("--base-url", "--out", "--rejects", "--state", "--report"):
        p.add_argument(flag, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    _MANIFEST[0] = (args.ids, args.context, args.jsonl)
    if args.drive:
        return _drive(args)
    compiled = byte_compile_package()
    print(f"byte-compiled {compiled}", flush=True)
    bench = Bench(sizes=QUICK, work=args.work, log=lambda s: print(s, flush=True))
    command = "python -m benchmarks.pg_state " + " ".join(
        argv if argv is not None else sys.argv[1:]
    )
    commit = subprocess.run(
        ["git", "rev-parse", "--short=7", "HEAD"], capture_output=True, text=True, cwd=ROOT
    ).stdout.strip()
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=no"],
        capture_output=True,
        text=True,
        cwd=ROOT,
    ).stdout.strip()
    doc: dict[str, Any] = {
        "command": command.strip(),
        "commit": commit + ("+dirty" if dirty else ""),
        "machine": f"{os.cpu_count()} cores, Python {platform.python_version()}, "
        f"load average {os.getloadavg()[0]:.1f} at start",
        "repeat": args.repeat,
    }
    variants = [Variant("sqlite", False), Variant("postgresql", True)]
    for rev in args.baseline:
        snaps = Path(tempfile.gettempdir()) / "fashiontag-bench-snapshots"
        sha, source = _export(rev, snaps, pyc=True)
        variants.append(Variant(f"postgresql@{sha[:7]}", True, source))
        doc.setdefault("baselines", []).append(sha)
    if args.baseline:
        # `-m fashiontag_pipeline` must not find the checkout through the cwd.
        os.chdir(tempfile.mkdtemp(prefix="fashiontag-pgstate-"))
    detail = args.detail_rows or max(args.rows)
    with running_cluster() as cluster:
        # --repeat 0: no side by side (--micro alone, say).
        doc["table"] = (
            measure(bench, cluster, variants, args.rows, args.repeat) if args.repeat else []
        )
        if args.breakdown:
            doc["breakdown_rows"] = detail
            doc["breakdown"] = breakdown(
                bench, cluster, variants, detail, max(1, args.breakdown_repeat)
            )
        if args.profile:
            doc["profile_rows"] = detail
            doc["profile"] = profile(bench, cluster, detail, 250)
        if args.micro:
            bench.log("  statements in isolation ...")
            doc["micro"] = micro(cluster)
    shutil.rmtree(args.work / "runs", ignore_errors=True)
    text = report_md(doc)
    print(text)
    RESULTS.mkdir(parents=True, exist_ok=True)
    stem = args.name or (
        "pg-state" if sorted(args.rows) == [20_000, 200_000] else f"pg-state-{max(args.rows)}"
    )
    (RESULTS / f"{stem}.json").write_text(json.dumps(doc, indent=2) + "\n")
    (RESULTS / f"{stem}.md").write_text(text)
    return 0 if all(c["complete"] for c in doc["table"]) else 1


if __name__ == "__main__":
    raise SystemExit(main())
