"""The benchmark scenarios of issue 5 and the budgets of DESIGN section 5.

Every scenario starts its own reference service process(es) and measures the engine (CLI and
Python API) and the naive baseline in child processes, one at a time, each against a fresh
service so that no run inherits another's tasks. Each returns its figures, its measured runs
and its budget verdicts.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .harness import (
    PY,
    MeasuredRun,
    manifest,
    run_measured,
    running_foreign_proxy,
    running_service,
)

__all__ = ["FULL", "QUICK", "SCENARIOS", "Bench", "Sizes"]

NAIVE = Path(__file__).parent / "baselines" / "naive.py"
ASYNC_SCRIPT = Path(__file__).parent / "baselines" / "async_script.py"
#: The faults of the reliability tests (DESIGN 4.1 ``--faults``).
RELIABILITY_FAULTS = "500=0.05,429=0.02,drop=0.01,ambiguous=0.02"

# DESIGN section 5.
BUDGET_CPU_US = 10.0
BUDGET_CPU_RATIO = 3.0
BUDGET_MAKESPAN = 1.05
BUDGET_RSS_FLAT = 1.2
BUDGET_RSS_MB = 200.0


@dataclass(frozen=True)
class Sizes:
    """Row counts and rates of one mode."""

    cpu_rows: int
    makespan_rows: int
    rate: int
    memory_rows: tuple[int, ...]
    service_rows: int
    faults_rows: int
    #: rows per task for the rotation scenario (``ttfr``), as engine flags allow
    rotate_rows: int
    #: manifest sizes of the side-by-side scenario (``compare``)
    compare_rows: tuple[int, ...] = (20_000, 200_000)


QUICK = Sizes(
    cpu_rows=100_000,
    makespan_rows=20_000,
    rate=2000,
    memory_rows=(100_000, 1_000_000),
    service_rows=50_000,
    faults_rows=50_000,
    rotate_rows=2_000,
)
FULL = Sizes(
    cpu_rows=200_000,
    makespan_rows=100_000,
    rate=2000,
    memory_rows=(100_000, 1_000_000, 10_000_000),
    service_rows=200_000,
    faults_rows=200_000,
    rotate_rows=10_000,
)


@dataclass
class Outcome:
    """What a scenario produced."""

    figures: dict[str, Any] = field(default_factory=dict)
    runs: list[MeasuredRun] = field(default_factory=list)
    budgets: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def budget(self, name: str, figure: str, met: bool | None) -> None:
        self.budgets.append({"budget": name, "figure": figure, "met": met})


@dataclass
class Bench:
    """Shared state of one harness invocation."""

    sizes: Sizes
    work: Path
    engine_args: list[str] = field(default_factory=list)
    rotation_args: list[str] | None = None
    with_baseline: bool = True
    keep_outputs: bool = False
    #: measured runs per client and size in ``compare`` (the median is reported)
    repeat: int = 1
    log: Callable[[str], None] = print
    #: runs shared between scenarios (e.g. the baseline of ``makespan`` used by ``ttfr``)
    cache: dict[str, MeasuredRun] = field(default_factory=dict)

    # ------------------------------------------------------------------ commands

    def paths(self, tag: str) -> dict[str, Path]:
        d = self.work / "runs"
        d.mkdir(parents=True, exist_ok=True)
        p = {
            "out": d / f"{tag}.results.jsonl",
            "rejects": d / f"{tag}.rejects.jsonl",
            "state": d / f"{tag}.state.sqlite",
            "summary": d / f"{tag}.summary.json",
        }
        for path in [*p.values(), *(d.glob(f"{tag}.state.sqlite*"))]:
            path.unlink(missing_ok=True)
        return p

    def engine_cli(
        self, tag: str, manifest_path: Path, url: str, extra: Sequence[str] = ()
    ) -> tuple[list[str], dict[str, Path]]:
        p = self.paths(tag)
        cmd = [PY, "-m", "fashiontag_pipeline", "run", str(manifest_path), "--base-url", url]
        cmd += ["--out", str(p["out"]), "--rejects", str(p["rejects"]), "--state", str(p["state"])]
        cmd += ["--no-progress", "--summary", str(p["summary"]), *self.engine_args, *extra]
        return cmd, p

    def engine_api(
        self, tag: str, manifest_path: Path, url: str, engine: dict[str, Any] | None = None
    ) -> tuple[list[str], dict[str, Path]]:
        p = self.paths(tag)
        cmd = [PY, "-m", "benchmarks.drive_api", str(manifest_path), "--base-url", url]
        cmd += ["--out", str(p["out"]), "--rejects", str(p["rejects"]), "--state", str(p["state"])]
        cmd += ["--summary", str(p["summary"]), "--engine-json", json.dumps(engine or {})]
        return cmd, p

    def naive(self, tag: str, manifest_path: Path, url: str) -> tuple[list[str], dict[str, Path]]:
        p = self.paths(tag)
        return [PY, str(NAIVE), str(manifest_path), "--base-url", url, "--out", str(p["out"])], p

    def async_script(
        self, tag: str, manifest_path: Path, url: str
    ) -> tuple[list[str], dict[str, Path]]:
        p = self.paths(tag)
        cmd = [PY, str(ASYNC_SCRIPT), str(manifest_path), "--base-url", url]
        return [*cmd, "--out", str(p["out"])], p

    def measure(
        self,
        label: str,
        built: tuple[list[str], dict[str, Path]],
        *,
        rows: int,
        service: Any,
        timeout: float = 3600.0,
        naive: bool = False,
    ) -> MeasuredRun:
        cmd, p = built
        self.log(f"  running {label} ({rows:,} rows) ...")
        run = run_measured(
            label,
            cmd,
            rows=rows,
            out=p["out"],
            rejects=None if naive else p["rejects"],
            service=service,
            timeout=timeout,
        )
        if p["summary"].exists():
            with contextlib.suppress(ValueError):
                run.summary = json.loads(p["summary"].read_text())
        status = "ok" if run.ok else f"FAILED rc={run.returncode}"
        self.log(
            f"    {status}: wall {run.wall_s:.1f}s, cpu {run.cpu_s:.2f}s "
            f"({run.cpu_us_per_row:.1f} us/row), peak RSS {run.peak_rss_mb:.0f} MiB, "
            f"results {run.out_lines:,} + rejects {run.reject_lines:,}"
        )
        if not run.ok:
            self.log("    stderr tail: " + run.stderr_tail[-600:].replace("\n", "\n      "))
        if not self.keep_outputs:
            for path in (p["out"], p["rejects"]):
                path.unlink(missing_ok=True)
        return run

    def baseline(self, key: str, rows: int, rate: int, faults: str | None = None) -> MeasuredRun:
        """The naive script on ``rows`` against a fresh service, once per harness invocation."""
        if key in self.cache:
            return self.cache[key]
        m = manifest(self.work, rows)
        with running_service(self.work, rate=rate, faults=faults) as svc:
            run = self.measure(
                f"naive {rows:,}", self.naive(key, m, svc.url), rows=rows, service=svc, naive=True
            )
        self.cache[key] = run
        return run


# ---------------------------------------------------------------------------- helpers


def _ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or b == 0:
        return None
    return a / b


def _r(value: float | None, digits: int = 2) -> float | None:
    return None if value is None else round(value, digits)


def _complete(run: MeasuredRun) -> bool:
    return run.ok and run.out_lines + run.reject_lines == run.rows


# ---------------------------------------------------------------------------- scenarios


def scenario_cpu(b: Bench) -> Outcome:
    """1. Engine CPU per image end to end against ``serve --rate 0 --no-fetch``."""
    o = Outcome()
    n = b.sizes.cpu_rows
    m = manifest(b.work, n)
    small = manifest(b.work, 1000)
    with running_service(b.work) as svc:
        fixed = b.measure(
            "engine CLI 1,000 (fixed cost)",
            b.engine_cli("cpu-fixed", small, svc.url),
            rows=1000,
            service=svc,
        )
    with running_service(b.work) as svc:
        cli = b.measure(
            f"engine CLI {n:,}", b.engine_cli("cpu-cli", m, svc.url), rows=n, service=svc
        )
    with running_service(b.work) as svc:
        api = b.measure(
            f"engine API {n:,}", b.engine_api("cpu-api", m, svc.url), rows=n, service=svc
        )
    o.runs += [fixed, cli, api]
    b.cache["engine-cli-cpu"] = cli
    base = b.baseline(f"naive-cpu-{n}", n, 0) if b.with_baseline else None
    if base is not None:
        o.runs.append(base)
    marginal = (cli.cpu_s - fixed.cpu_s) / (n - 1000) * 1e6 if n > 1000 else None
    o.figures = {
        "rows": n,
        "engine_cli_us_per_image": _r(cli.cpu_us_per_row),
        "engine_api_us_per_image": _r(api.cpu_us_per_row),
        "engine_cli_marginal_us_per_image": _r(marginal),
        "engine_fixed_cpu_s": _r(fixed.cpu_s, 3),
        "engine_cli_wall_s": _r(cli.wall_s),
        "engine_cli_rows_per_s": _r(n / cli.wall_s if cli.wall_s else None, 0),
        "service_cpu_us_per_image": _r(
            cli.service_cpu_s / n * 1e6 if cli.service_cpu_s is not None else None
        ),
        "engine_complete": _complete(cli) and _complete(api),
    }
    if base is not None:
        o.figures |= {
            "naive_us_per_image": _r(base.cpu_us_per_row),
            "naive_wall_s": _r(base.wall_s),
            "naive_complete": _complete(base),
            "naive_over_engine_cli": _r(_ratio(base.cpu_us_per_row, cli.cpu_us_per_row)),
            "naive_over_engine_api": _r(_ratio(base.cpu_us_per_row, api.cpu_us_per_row)),
        }
    ok_runs = cli.ok and api.ok
    o.budget(
        f"CPU <= {BUDGET_CPU_US:g} us/image (end to end, {n:,} rows)",
        f"CLI {cli.cpu_us_per_row:.1f}, API {api.cpu_us_per_row:.1f} us/image",
        ok_runs and cli.cpu_us_per_row <= BUDGET_CPU_US,
    )
    if base is not None:
        ratio = _ratio(base.cpu_us_per_row, cli.cpu_us_per_row)
        o.budget(
            f">= {BUDGET_CPU_RATIO:g}x less CPU than the naive baseline",
            f"naive {base.cpu_us_per_row:.1f} us/image = {ratio or 0:.1f}x the CLI",
            ok_runs and base.ok and ratio is not None and ratio >= BUDGET_CPU_RATIO,
        )
    if not ok_runs:
        o.notes.append("an engine run failed; see its stderr tail in the JSON")
    return o


def scenario_makespan(b: Bench) -> Outcome:
    """2. Makespan against a service capped at R images/s: makespan / (N/R)."""
    o = Outcome()
    n, rate = b.sizes.makespan_rows, b.sizes.rate
    bound = n / rate
    m = manifest(b.work, n)
    with running_service(b.work, rate=rate) as svc:
        cli = b.measure(
            f"engine CLI {n:,} @ {rate}/s",
            b.engine_cli("mk-cli", m, svc.url),
            rows=n,
            service=svc,
            timeout=20 * bound + 120,
        )
    o.runs.append(cli)
    o.figures = {
        "rows": n,
        "rate": rate,
        "lower_bound_s": _r(bound),
        "engine_makespan_s": _r(cli.wall_s),
        "engine_over_bound": _r(cli.wall_s / bound, 3),
        "engine_first_result_s": _r(cli.first_result_s),
        "engine_complete": _complete(cli),
    }
    if b.with_baseline:
        base = b.baseline(f"naive-mk-{n}-{rate}", n, rate)
        o.runs.append(base)
        o.figures |= {
            "naive_makespan_s": _r(base.wall_s),
            "naive_over_bound": _r(base.wall_s / bound, 3),
            "naive_first_result_s": _r(base.first_result_s),
            "naive_over_engine": _r(_ratio(base.wall_s, cli.wall_s)),
        }
    o.budget(
        f"makespan <= {BUDGET_MAKESPAN} x N/R (N={n:,}, R={rate:,}/s)",
        f"{cli.wall_s:.1f}s = {cli.wall_s / bound:.3f} x {bound:.1f}s",
        cli.ok and cli.wall_s <= BUDGET_MAKESPAN * bound,
    )
    return o


def scenario_ttfr(b: Bench) -> Outcome:
    """3. Time to first result and results over time, with task rotation on."""
    o = Outcome()
    n, rate = b.sizes.makespan_rows, b.sizes.rate
    m = manifest(b.work, n)
    rotation = b.rotation_args if b.rotation_args is not None else []
    if not rotation:
        o.notes.append("no rotation flags known for this engine: ran with its defaults")
    with running_service(b.work, rate=rate) as svc:
        cli = b.measure(
            f"engine CLI {n:,} @ {rate}/s, rotation",
            b.engine_cli("ttfr-cli", m, svc.url, rotation),
            rows=n,
            service=svc,
            timeout=20 * n / rate + 120,
        )
    o.runs.append(cli)
    # The rotation bound: a rotated task of k rows is done k/R after its last row went in.
    expected = b.sizes.rotate_rows / rate
    o.figures = {
        "rows": n,
        "rate": rate,
        "rotation_args": " ".join(rotation),
        "rotation_rows": b.sizes.rotate_rows,
        "rotation_bound_s": _r(expected),
        "engine_first_result_s": _r(cli.first_result_s),
        "engine_makespan_s": _r(cli.wall_s),
        "engine_over_bound": _r(cli.wall_s / (n / rate), 3),
        "engine_complete": _complete(cli),
    }
    if b.with_baseline:
        base = b.baseline(f"naive-mk-{n}-{rate}", n, rate)
        if base not in o.runs:
            o.runs.append(base)
        o.figures |= {
            "naive_first_result_s": _r(base.first_result_s),
            "naive_over_engine": _r(_ratio(base.first_result_s, cli.first_result_s)),
        }
    ttfr = cli.first_result_s
    # "Bounded by the rotation setting, not by N": allow the rotation time, a poll period
    # and process start-up (2 s) on top.
    o.budget(
        "time to first result bounded by rotation, not N",
        f"{ttfr if ttfr is not None else float('nan'):.2f}s (rotation {expected:.1f}s; N/R "
        f"{n / rate:.0f}s)",
        cli.ok and ttfr is not None and ttfr <= expected + 3.0 and ttfr < 0.5 * n / rate,
    )
    return o


def scenario_memory(b: Bench) -> Outcome:
    """4. Peak RSS against N (rate 0): flat in N and <= 200 MiB."""
    o = Outcome()
    peaks: dict[int, float] = {}
    for n in b.sizes.memory_rows:
        m = manifest(b.work, n)
        with running_service(b.work) as svc:
            run = b.measure(
                f"engine CLI {n:,} (memory)",
                b.engine_cli(f"mem-{n}", m, svc.url),
                rows=n,
                service=svc,
                timeout=max(600.0, n / 2000),
            )
        o.runs.append(run)
        peaks[n] = run.peak_rss_mb
        if n >= 5_000_000 and not b.keep_outputs:
            m.unlink(missing_ok=True)  # multi-GB manifests are not worth keeping
    ns = sorted(peaks)
    o.figures = {f"peak_rss_mb_{n}": _r(peaks[n], 1) for n in ns}
    o.figures["complete"] = all(_complete(r) for r in o.runs)
    if len(ns) >= 2:
        lo, hi = ns[0], ns[1]
        flat = peaks[hi] / peaks[lo]
        o.figures[f"rss_ratio_{hi}_over_{lo}"] = _r(flat, 3)
        o.budget(
            f"peak RSS flat in N ({hi:,} within {BUDGET_RSS_FLAT}x of {lo:,})",
            f"{peaks[hi]:.0f} / {peaks[lo]:.0f} MiB = {flat:.2f}x",
            all(r.ok for r in o.runs) and flat <= BUDGET_RSS_FLAT,
        )
    if len(ns) >= 3:
        top = ns[-1]
        o.figures[f"rss_ratio_{top}_over_{ns[0]}"] = _r(peaks[top] / peaks[ns[0]], 3)
    worst = max(peaks.values()) if peaks else float("nan")
    o.budget(
        f"peak RSS <= {BUDGET_RSS_MB:g} MiB (up to {ns[-1]:,} rows)",
        f"max {worst:.0f} MiB",
        all(r.ok for r in o.runs) and worst <= BUDGET_RSS_MB,
    )
    naive = next((r for k, r in b.cache.items() if k.startswith("naive-cpu")), None)
    if naive is not None:
        o.figures["naive_peak_rss_mb"] = _r(naive.peak_rss_mb, 1)
        o.figures["naive_rows"] = naive.rows
    return o


def scenario_service(b: Bench) -> Outcome:
    """5. What the reference service serves (it must not be the bottleneck)."""
    o = Outcome()
    n = b.sizes.service_rows
    with running_service(b.work) as svc:
        b.log(f"  running load generator ({n:,} images) ...")
        cmd = [
            PY,
            "-m",
            "benchmarks.loadgen",
            "--base-url",
            svc.url,
            "--rows",
            str(n),
            "--service-pid",
            str(svc.proc.pid),
        ]
        t0 = time.monotonic()
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, check=False)
        wall = time.monotonic() - t0
    if done.returncode != 0:
        o.notes.append("load generator failed: " + done.stderr[-800:])
        o.budget("service is not the bottleneck", "load generator failed", False)
        return o
    load = json.loads(done.stdout.strip().splitlines()[-1])
    b.log(
        f"    ingest {load['ingest_images_per_s']:,.0f} images/s, "
        f"read {load['results_per_s']:,.0f} results/s ({wall:.1f}s)"
    )
    o.figures = {k: _r(v) if isinstance(v, float) else v for k, v in load.items()}
    # The service handles ingest and reads of every image: its capacity per image is the
    # harmonic combination of both phases.
    capacity = 1 / (1 / load["ingest_images_per_s"] + 1 / load["results_per_s"])
    o.figures["service_capacity_images_per_s"] = _r(capacity, 0)
    rate = b.sizes.rate
    o.budget(
        f"service is not the bottleneck of the rate-limited scenarios (R={rate:,}/s)",
        f"capacity {capacity:,.0f} images/s = {capacity / rate:.1f} x R",
        capacity >= 2 * rate,
    )
    cpu = b.cache.get("engine-cli-cpu")
    if cpu is not None and cpu.ok and cpu.cpu_s > 0:
        # What the engine could do on one core if the service were free: 1 / CPU per image.
        engine_max = cpu.rows / cpu.cpu_s
        o.figures["engine_cpu_bound_rows_per_s"] = _r(engine_max, 0)
        o.figures["engine_rows_per_s_rate0"] = _r(cpu.rows / cpu.wall_s, 0)
        o.figures["capacity_over_engine"] = _r(capacity / engine_max)
        o.budget(
            "service is not the bottleneck at rate 0 (capacity >= engine's 1/CPU)",
            f"capacity {capacity:,.0f} images/s vs engine {engine_max:,.0f} rows/s per core",
            capacity >= engine_max,
        )
    return o


def scenario_faults(b: Bench) -> Outcome:
    """6. Scenario 1 with the reliability faults on: CPU overhead and exactly-once."""
    o = Outcome()
    n = b.sizes.faults_rows
    m = manifest(b.work, n)
    with running_service(b.work, faults=RELIABILITY_FAULTS) as svc:
        keep, b.keep_outputs = b.keep_outputs, True
        try:
            cli = b.measure(
                f"engine CLI {n:,} with faults",
                b.engine_cli("faults-cli", m, svc.url),
                rows=n,
                service=svc,
            )
        finally:
            b.keep_outputs = keep
    o.runs.append(cli)
    p = b.work / "runs"
    distinct, dupes = _distinct_ids(p / "faults-cli.results.jsonl", p / "faults-cli.rejects.jsonl")
    if not b.keep_outputs:
        for f in ("faults-cli.results.jsonl", "faults-cli.rejects.jsonl"):
            (p / f).unlink(missing_ok=True)
    clean = b.cache.get("engine-cli-cpu")
    o.figures = {
        "rows": n,
        "faults": RELIABILITY_FAULTS,
        "engine_us_per_image": _r(cli.cpu_us_per_row),
        "engine_wall_s": _r(cli.wall_s),
        "results": cli.out_lines,
        "rejects": cli.reject_lines,
        "distinct_ids": distinct,
        "duplicate_lines": dupes,
        "exactly_once": cli.ok and distinct == n and dupes == 0,
        "retries": (cli.summary or {}).get("retries"),
    }
    if clean is not None and clean.ok:
        o.figures["overhead_vs_clean"] = _r(_ratio(cli.cpu_us_per_row, clean.cpu_us_per_row), 3)
        o.figures["clean_rows"] = clean.rows
    if b.with_baseline:
        base = b.baseline(f"naive-faults-{n}", n, 0, faults=RELIABILITY_FAULTS)
        o.runs.append(base)
        o.figures |= {
            "naive_ok": base.ok and base.out_lines == n,
            "naive_results": base.out_lines,
            # A crashed baseline has no meaningful wall time or CPU per image.
            "naive_wall_s": _r(base.wall_s) if base.ok else None,
            "naive_us_per_image": _r(base.cpu_us_per_row) if base.ok else None,
            "naive_error": base.stderr_tail.strip().splitlines()[-1] if not base.ok else "",
        }
    o.budget(
        "exactly once under faults",
        f"{distinct:,} distinct ids of {n:,}, {dupes} duplicates",
        cli.ok and distinct == n and dupes == 0,
    )
    o.budget(
        f"CPU <= {BUDGET_CPU_US:g} us/image with faults",
        f"{cli.cpu_us_per_row:.1f} us/image",
        cli.ok and cli.cpu_us_per_row <= BUDGET_CPU_US,
    )
    return o


def _distinct_ids(*paths: Path) -> tuple[int, int]:
    import msgspec

    class _Id(msgspec.Struct):
        id: str

    dec = msgspec.json.Decoder(_Id)
    seen: set[str] = set()
    dupes = 0
    for path in paths:
        if not path.exists():
            continue
        with path.open("rb") as fh:
            for line in fh:
                if not line.strip():
                    continue
                ident = dec.decode(line).id
                if ident in seen:
                    dupes += 1
                seen.add(ident)
    return len(seen), dupes


#: The clients of ``compare``: (key, label, maker, through the foreign-format proxy, the
#: manifest: sorted ids, random ids, or sorted ids with context columns; see
#: :func:`~.harness.manifest`).
_CLIENTS = (
    ("engine", "engine CLI", "engine", False, "sequential"),
    ("async", "async script", "async", False, "sequential"),
    ("naive", "naive script", "naive", False, "sequential"),
    ("engine_foreign", "engine CLI, foreign formatting", "engine", True, "sequential"),
    ("async_foreign", "async script, foreign formatting", "async", True, "sequential"),
    ("engine_random", "engine CLI, random ids", "engine", False, "random"),
    ("async_random", "async script, random ids", "async", False, "random"),
    ("engine_context", "engine CLI, context columns", "engine", False, "context"),
    ("async_context", "async script, context columns", "async", False, "context"),
)


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def _relative(o: Outcome, medians: dict[str, dict[str, Any]], n: int, key: str, what: str) -> None:
    """The budget "engine CPU <= async script CPU" of the clients ``engine{key}`` and
    ``async{key}`` (one manifest) at ``n`` rows."""
    e, a = medians[f"engine{key}"], medians[f"async{key}"]
    o.budget(
        f"engine CPU <= async script CPU{what} ({n:,} rows)",
        f"engine {e['cpu_us_per_image']:.1f}, async script {a['cpu_us_per_image']:.1f} us/image",
        e["complete"] and e["cpu_us_per_image"] <= a["cpu_us_per_image"],
    )


def scenario_compare(b: Bench) -> Outcome:
    """0. Side by side: engine, competent async script, naive script (CPU, wall, peak RSS).

    At each of ``compare_rows``; the engine and the async script also run through the
    foreign-format proxy (:mod:`benchmarks.foreign`)."""
    o = Outcome()
    table: list[dict[str, Any]] = []
    for n in b.sizes.compare_rows:
        manifests = {ids: manifest(b.work, n, ids) for ids in ("sequential", "random")}
        manifests["context"] = manifest(b.work, n, context=True)
        clients = [c for c in _CLIENTS if b.with_baseline or c[2] != "naive"]
        runs: dict[str, list[MeasuredRun]] = {key: [] for key, *_ in clients}
        # Rounds of one run per client, so that every client sees the same changes in the
        # machine's load (other processes on a shared machine come and go).
        for i in range(b.repeat):
            for key, label, maker, foreign, ids in clients:
                tag = f"cmp-{key}-{n}-{i}"
                m = manifests[ids]
                with (
                    running_service(b.work) as svc,
                    _maybe_foreign(b.work, svc.url, foreign) as url,
                ):
                    built = (
                        b.engine_cli(tag, m, url)
                        if maker == "engine"
                        else b.async_script(tag, m, url)
                        if maker == "async"
                        else b.naive(tag, m, url)
                    )
                    runs[key].append(
                        b.measure(
                            f"{label} {n:,} #{i + 1}",
                            built,
                            rows=n,
                            service=svc,
                            naive=maker != "engine",
                        )
                    )
        medians: dict[str, dict[str, Any]] = {}
        for key, label, *_ in clients:
            done = runs[key]
            o.runs += done
            cpu = [r.cpu_us_per_row for r in done]
            row = {
                "rows": n,
                "client": label,
                "cpu_us_per_image": round(_median(cpu), 2),
                "cpu_us_min": round(min(cpu), 2),
                "cpu_us_max": round(max(cpu), 2),
                "user_us_per_image": round(_median([r.user_s / n * 1e6 for r in done]), 2),
                "sys_us_per_image": round(_median([r.sys_s / n * 1e6 for r in done]), 2),
                "wall_s": round(_median([r.wall_s for r in done]), 2),
                "peak_rss_mb": round(_median([r.peak_rss_mb for r in done]), 1),
                "runs": len(done),
                "complete": all(_complete(r) for r in done),
                "tagged": [(r.summary or {}).get("tagged") for r in done],
                "failed": [(r.summary or {}).get("failed") for r in done],
            }
            table.append(row)
            medians[key] = row
        eng, asy = medians["engine"], medians["async"]
        _relative(o, medians, n, "", "")
        o.budget(
            f"CPU <= {BUDGET_CPU_US:g} us/image ({n:,} rows)",
            f"{eng['cpu_us_per_image']:.1f} us/image",
            eng["complete"] and eng["cpu_us_per_image"] <= BUDGET_CPU_US,
        )
        fe = medians["engine_foreign"]
        same = fe["complete"] and fe["tagged"] == eng["tagged"] and fe["failed"] == eng["failed"]
        o.budget(
            f"same outcomes through the foreign-format proxy ({n:,} rows)",
            f"tagged {fe['tagged']} / failed {fe['failed']} vs {eng['tagged']} / {eng['failed']}",
            same,
        )
        _relative(o, medians, n, "_random", ", random ids")
        _relative(o, medians, n, "_context", ", context columns")
        er = medians["engine_random"]
        o.figures[f"random_over_sequential_ids_cpu_{n}"] = _r(
            _ratio(er["cpu_us_per_image"], eng["cpu_us_per_image"])
        )
        o.figures[f"foreign_over_plain_cpu_{n}"] = _r(
            _ratio(fe["cpu_us_per_image"], eng["cpu_us_per_image"])
        )
        o.figures[f"engine_over_async_cpu_{n}"] = _r(
            _ratio(eng["cpu_us_per_image"], asy["cpu_us_per_image"])
        )
    o.figures["side_by_side"] = table
    o.notes.append(
        "CPU = user+sys of the client process (os.wait4), interpreter start and imports "
        f"included; median of {b.repeat} run(s) per cell; every run against a fresh service"
    )
    return o


@contextlib.contextmanager
def _maybe_foreign(work: Path, upstream: str, foreign: bool) -> Iterator[str]:
    if not foreign:
        yield upstream
        return
    with running_foreign_proxy(work, upstream) as url:
        yield url


SCENARIOS: dict[str, Callable[[Bench], Outcome]] = {
    "compare": scenario_compare,
    "cpu": scenario_cpu,
    "makespan": scenario_makespan,
    "ttfr": scenario_ttfr,
    "memory": scenario_memory,
    "service": scenario_service,
    "faults": scenario_faults,
}


def cleanup(work: Path) -> None:
    """Remove run outputs (manifests are kept for the next invocation)."""
    shutil.rmtree(work / "runs", ignore_errors=True)
