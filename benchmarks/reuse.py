"""``python -m benchmarks.reuse``: a catalogue run twice with ``--reuse`` (DESIGN section 5).

Against ``serve --rate R --no-fetch`` (a separate process), the CLI runs the same manifest twice
with the same result store:

1. the first night tags every row (wall W1, CPU C1) and fills the store;
2. the second night, unchanged, must send nothing (the service's task list does not grow, the
   summary says ``submitted 0``, ``reused N``) and take <= 5% of W1.

CPU per row (user + sys of the engine process, ``os.wait4``) is reported two ways: whole-run
(interpreter start and imports included) and marginal (minus the same two nights of a 1,000-row
catalogue, which cancels start-up), for tagged rows (night 1) and reused rows (night 2).

Quick defaults (20,000 rows at 500 images/s: ~40 s of tagging, about a minute in all);
``--million`` runs the issue's 1M-row catalogue (at ``--rate 5000`` unless given: ~200 s of
tagging, ~4 minutes with the manifest and the re-run), or any ``--rows`` / ``--rate``.
Writes ``benchmarks/results/reuse.json`` and ``reuse.md`` (other sizes: ``reuse-N.*``).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from .harness import PY, MeasuredRun, Service, manifest, run_measured, running_service

RESULTS = Path(__file__).parent / "results"
BUDGET_RATIO = 0.05
SMALL = 1_000


def _tasks(url: str) -> int:
    """How many tasks the service holds for the development bulk key (its own record)."""
    out = subprocess.run(
        [PY, "-m", "fashiontag_pipeline", "tasks", "list", "--json", "--base-url", url],
        capture_output=True,
        check=True,
        text=True,
        env=_env(),
    )
    return len(json.loads(out.stdout))


def _env() -> dict[str, str]:
    import os

    env = dict(os.environ)
    for var in ("FASHIONTAG_API_KEY", "FASHIONTAG_BULK_API_KEY", "FASHIONTAG_BASE_URL"):
        env.pop(var, None)
    return env


def _night(
    work: Path, tag: str, rows: int, source: Path, store: Path, service: Service
) -> tuple[MeasuredRun, dict[str, Any]]:
    out = work / f"{tag}.results.jsonl"
    rejects = work / f"{tag}.rejects.jsonl"
    summary = work / f"{tag}.summary.json"
    state = work / f"{tag}.state.sqlite"
    for path in work.glob(f"{tag}.state.sqlite*"):
        path.unlink()
    cmd = [PY, "-m", "fashiontag_pipeline", "run", str(source), "--base-url", service.url]
    cmd += ["--out", str(out), "--rejects", str(rejects), "--state", str(state)]
    cmd += ["--no-progress", "--summary", str(summary), "--reuse", str(store)]
    run = run_measured(tag, cmd, rows=rows, out=out, rejects=rejects, service=service)
    if not run.ok:
        sys.exit(f"{tag} failed ({run.returncode}):\n{run.stderr_tail}")
    data = json.loads(summary.read_text())
    out.unlink(missing_ok=True)
    return run, data


def measure(rows: int, rate: float, work: Path) -> dict[str, Any]:
    """Both nights of ``rows`` and of a 1,000-row catalogue; the figures."""
    work.mkdir(parents=True, exist_ok=True)
    big, small = manifest(work, rows), manifest(work, SMALL)
    stores = {n: work / f"reuse-{n}.sqlite" for n in (rows, SMALL)}
    for store in stores.values():
        for path in store.parent.glob(store.name + "*"):
            path.unlink()
    with running_service(work, rate=rate) as service:
        s1, s1_sum = _night(work, "small-night1", SMALL, small, stores[SMALL], service)
        s2, _ = _night(work, "small-night2", SMALL, small, stores[SMALL], service)
        n1, n1_sum = _night(work, "night1", rows, big, stores[rows], service)
        tasks_before = _tasks(service.url)
        n2, n2_sum = _night(work, "night2", rows, big, stores[rows], service)
        tasks_after = _tasks(service.url)
    store_bytes = sum(p.stat().st_size for p in work.glob(stores[rows].name + "*"))
    ratio = n2.wall_s / n1.wall_s
    figures = {
        "rows": rows,
        "rate": rate,
        "lower_bound_s": round(rows / rate, 2) if rate else None,
        "night1_wall_s": round(n1.wall_s, 3),
        "night2_wall_s": round(n2.wall_s, 3),
        "wall_ratio": round(ratio, 4),
        "night1_tagged": n1_sum["tagged"] + n1_sum["failed"],
        "night2_submitted": n2_sum["submitted"],
        "night2_reused": n2_sum["reused"],
        "night2_tasks_created": tasks_after - tasks_before,
        "cpu_us_per_tagged_row": round(n1.cpu_us_per_row, 2),
        "cpu_us_per_reused_row": round(n2.cpu_us_per_row, 2),
        "marginal_cpu_us_per_tagged_row": round((n1.cpu_s - s1.cpu_s) / (rows - SMALL) * 1e6, 2),
        "marginal_cpu_us_per_reused_row": round((n2.cpu_s - s2.cpu_s) / (rows - SMALL) * 1e6, 2),
        "night1_peak_rss_mb": round(n1.peak_rss_mb, 1),
        "night2_peak_rss_mb": round(n2.peak_rss_mb, 1),
        "store_mb": round(store_bytes / 1e6, 1),
        "small_night1_tagged": s1_sum["tagged"] + s1_sum["failed"],
    }
    figures["budget_sends_nothing"] = (
        figures["night2_submitted"] == 0
        and figures["night2_tasks_created"] == 0
        and figures["night2_reused"] == rows
    )
    figures["budget_wall_5pct"] = ratio <= BUDGET_RATIO
    return figures


def report(figures: dict[str, Any], command: str) -> str:
    f = figures
    ok = "met" if f["budget_wall_5pct"] and f["budget_sends_nothing"] else "NOT MET"
    return "\n".join(
        [
            "# --reuse: the same catalogue twice",
            "",
            f"`{command}`",
            "",
            f"{f['rows']:,} rows against `serve --rate {f['rate']:g} --no-fetch`; budgets {ok}.",
            "",
            "| | night 1 (tags all) | night 2 (unchanged, --reuse) |",
            "|---|---|---|",
            f"| wall | {f['night1_wall_s']:.2f} s | {f['night2_wall_s']:.2f} s "
            f"({f['wall_ratio']:.1%} of night 1; budget <= 5%) |",
            f"| rows sent | {f['night1_tagged']:,} | {f['night2_submitted']:,} "
            f"(tasks created: {f['night2_tasks_created']}) |",
            f"| rows reused | 0 | {f['night2_reused']:,} |",
            f"| CPU per row, whole run | {f['cpu_us_per_tagged_row']:.1f} us (tagged) | "
            f"{f['cpu_us_per_reused_row']:.1f} us (reused) |",
            f"| CPU per row, marginal | {f['marginal_cpu_us_per_tagged_row']:.1f} us | "
            f"{f['marginal_cpu_us_per_reused_row']:.1f} us |",
            f"| peak RSS | {f['night1_peak_rss_mb']:.0f} MB | {f['night2_peak_rss_mb']:.0f} MB |",
            "",
            f"Result store after night 1: {f['store_mb']:.1f} MB.",
            "",
        ]
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.reuse", description=__doc__)
    p.add_argument("--rows", type=int, default=None, help="catalogue rows (default 20,000)")
    p.add_argument("--rate", type=float, default=None, help="service images/s (default 500)")
    p.add_argument(
        "--million", action="store_true", help="1,000,000 rows (at --rate 5000 unless given)"
    )
    p.add_argument("--work", type=Path, default=RESULTS / "tmp" / "reuse")
    p.add_argument("--keep", action="store_true", help="keep the work directory")
    args = p.parse_args(argv)
    rows = args.rows or (1_000_000 if args.million else 20_000)
    rate = args.rate if args.rate is not None else (5000.0 if args.million else 500.0)
    if rows <= SMALL:
        p.error(f"--rows must be more than {SMALL}")
    figures = measure(rows, rate, args.work)
    command = "python -m benchmarks.reuse " + " ".join(argv if argv is not None else sys.argv[1:])
    text = report(figures, command.strip())
    print(text)
    RESULTS.mkdir(parents=True, exist_ok=True)
    stem = "reuse" if (rows, rate) == (20_000, 500.0) else f"reuse-{rows}"
    (RESULTS / f"{stem}.json").write_text(json.dumps(figures, indent=2) + "\n")
    (RESULTS / f"{stem}.md").write_text(text)
    if not args.keep:
        for path in args.work.glob("*.jsonl"):
            path.unlink()
        shutil.rmtree(args.work / "runs", ignore_errors=True)
    return 0 if figures["budget_wall_5pct"] and figures["budget_sends_nothing"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
