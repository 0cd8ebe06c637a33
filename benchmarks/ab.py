"""Revisions of the engine and the async script, runs interleaved: before/after on a busy box.

    python -m benchmarks.ab BEFORE AFTER [MORE...] [--rows 20000,200000] [--repeat 5]

Each revision is exported with ``git archive`` (``--no-pyc-before`` leaves the first without
byte code, as the compare scenario measured it before the harness byte-compiled the package),
then every round runs the engine of each revision and the async script once, each against a
fresh ``serve --rate 0 --no-fetch``, in the same order. On a shared machine the load drifts over
minutes, so cells measured one after the other are comparable where two separate invocations of
``--scenario compare`` are not. Children run from a neutral working directory, so
``python -m fashiontag_pipeline`` imports the exported revision and never the checkout.

Prints CPU us/image (user + sys of the client, ``os.wait4``; median, min-max), wall seconds and
peak RSS per cell.
"""

from __future__ import annotations

import argparse
import compileall
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from .harness import PY, manifest, manifest_options, run_measured, running_service
from .scenarios import ASYNC_SCRIPT

ROOT = Path(__file__).resolve().parent.parent


def _export(rev: str, base: Path, *, pyc: bool) -> tuple[str, Path]:
    sha = subprocess.run(
        ["git", "rev-parse", "--short=12", rev],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    dest = base / (sha + ("" if pyc else "-nopyc"))
    if not dest.exists():
        part = dest.with_name(dest.name + ".part")
        shutil.rmtree(part, ignore_errors=True)
        part.mkdir(parents=True)
        archive = subprocess.run(
            ["git", "archive", "--format=tar", sha], cwd=ROOT, capture_output=True, check=True
        ).stdout
        subprocess.run(["tar", "-x", "-C", str(part)], input=archive, check=True)
        part.rename(dest)
    if pyc:
        compileall.compile_dir(dest / "fashiontag_pipeline", quiet=1)
    return sha, dest


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.ab", description=__doc__)
    p.add_argument("before")
    p.add_argument("after", nargs="+", help="one or more revisions measured beside BEFORE")
    p.add_argument("--rows", default="20000,200000", help="manifest sizes, comma-separated")
    p.add_argument("--repeat", type=int, default=5, help="rounds per size")
    p.add_argument("--no-pyc-before", action="store_true")
    manifest_options(p)
    p.add_argument("--work-dir", type=Path, default=ROOT / "benchmarks" / "results" / "tmp")
    args = p.parse_args(argv)
    work: Path = args.work_dir.resolve()
    snaps = Path(tempfile.gettempdir()) / "fashiontag-bench-snapshots"
    clients: list[tuple[str, Path | None]] = []
    revisions = [(args.before, not args.no_pyc_before)] + [(rev, True) for rev in args.after]
    for rev, pyc in revisions:
        sha, path = _export(rev, snaps, pyc=pyc)
        clients.append((f"engine {sha}{'' if pyc else ' (no byte code)'}", path))
    clients.append(("async script", None))
    neutral = Path(tempfile.mkdtemp(prefix="fashiontag-ab-"))
    os.chdir(neutral)  # `-m fashiontag_pipeline` must not find the checkout through the cwd
    runs = work / "runs" / "ab"
    runs.mkdir(parents=True, exist_ok=True)
    table: list[str] = []
    for rows in (int(r) for r in args.rows.split(",")):
        m = manifest(work, rows, args.ids, args.context, args.jsonl)
        cells: dict[str, list[tuple[float, float, float]]] = {name: [] for name, _ in clients}
        for round_ in range(args.repeat):
            for name, path in clients:
                out = runs / "out.jsonl"
                for f in runs.glob("run.*"):
                    f.unlink()
                with running_service(runs) as svc:
                    if path is None:
                        cmd = [PY, str(ASYNC_SCRIPT), str(m), "--base-url", svc.url]
                        env = None
                    else:
                        cmd = [
                            PY,
                            "-m",
                            "fashiontag_pipeline",
                            "run",
                            str(m),
                            "--base-url",
                            svc.url,
                        ]
                        cmd += ["--rejects", str(runs / "run.rejects.jsonl"), "--no-progress"]
                        cmd += ["--state", str(runs / "run.state.sqlite")]
                        env = {"PYTHONPATH": str(path)}
                    run = run_measured(
                        name, [*cmd, "--out", str(out)], rows=rows, out=out, service=svc, env=env
                    )
                if not run.ok or run.out_lines != rows:
                    print(f"{name}: failed ({run.out_lines} lines)\n{run.stderr_tail}")
                    return 1
                cells[name].append((run.cpu_us_per_row, run.wall_s, run.peak_rss_mb))
                print(
                    f"  {rows:,} #{round_ + 1} {name}: {run.cpu_us_per_row:.1f} us/image, "
                    f"wall {run.wall_s:.2f} s, RSS {run.peak_rss_mb:.0f} MiB",
                    flush=True,
                )
        for name, got in cells.items():
            cpu = [c for c, _, _ in got]
            table.append(
                f"| {rows:,} | {name} | **{statistics.median(cpu):.1f}** ({min(cpu):.1f}-"
                f"{max(cpu):.1f}) | {statistics.median(w for _, w, _ in got):.2f} | "
                f"{statistics.median(r for _, _, r in got):.0f} |"
            )
    shutil.rmtree(neutral, ignore_errors=True)
    print(f"\n{args.repeat} interleaved rounds; CPU = user+sys of the client per image\n")
    print("| rows | client | CPU us/image (min-max) | wall s | peak RSS MiB |")
    print("|---|---|---|---|---|")
    print("\n".join(table))
    return 0


if __name__ == "__main__":
    sys.exit(main())
