"""``python -m benchmarks``: run the scenarios, write the reports.

python -m benchmarks --quick                      # a few minutes (make bench)
python -m benchmarks --full                       # the issue's sizes (make bench-full)
python -m benchmarks --scenario cpu --rows 50000  # one scenario, other size
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from .harness import byte_compile_package
from .report import write_reports
from .scenarios import FULL, QUICK, SCENARIOS, Bench, Outcome, cleanup

DEFAULT_OUT = Path(__file__).parent / "results"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks",
        description="Benchmark the engine against the reference service and two baselines "
        "(a competent async script and a naive sequential one).",
    )
    mode = p.add_mutually_exclusive_group()
    mode.add_argument(
        "--quick",
        dest="mode",
        action="store_const",
        const="quick",
        help="small sizes, a few minutes on 2 cores (default)",
    )
    mode.add_argument(
        "--full",
        dest="mode",
        action="store_const",
        const="full",
        help="the sizes of issue 5 (200k CPU, 100k makespan, 10M memory)",
    )
    p.set_defaults(mode="quick")
    p.add_argument(
        "--scenario",
        action="append",
        choices=list(SCENARIOS),
        metavar="NAME",
        help=f"run only this scenario (repeatable): {', '.join(SCENARIOS)}",
    )
    p.add_argument(
        "--rows", type=int, help="rows of every scenario (memory: N and 10N) instead of the mode's"
    )
    p.add_argument(
        "--compare-rows",
        type=lambda v: tuple(int(x) for x in v.split(",")),
        metavar="N,N",
        help="manifest sizes of the compare scenario (default 20000,200000)",
    )
    p.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="runs per client and size in the compare scenario (median reported)",
    )
    p.add_argument("--rate", type=int, help="service rate R (images/s) of makespan/ttfr")
    p.add_argument(
        "--out-dir",
        type=Path,
        default=DEFAULT_OUT,
        help="where reports go (default benchmarks/results)",
    )
    p.add_argument(
        "--work-dir", type=Path, help="manifests and run outputs (default OUT_DIR/tmp, gitignored)"
    )
    p.add_argument(
        "--engine-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="extra argument for every `fashiontag run` (repeatable)",
    )
    p.add_argument(
        "--rotation",
        metavar="ARGS",
        help="engine flags that turn task rotation on for the ttfr scenario, "
        "e.g. '--rotate-rows 10000' (default: the mode's rotate_rows if the engine "
        "has such a flag)",
    )
    p.add_argument(
        "--snapshot",
        metavar="REV",
        help="measure the code of git revision REV (exported with `git archive` into the work "
        "dir), not the working tree: other people's uncommitted edits cannot leak into a run",
    )
    p.add_argument("--no-baseline", action="store_true", help="skip the naive baseline runs")
    p.add_argument("--keep-outputs", action="store_true", help="keep results/rejects files")
    return p


def _rotation_args(explicit: str | None, rows: int) -> list[str] | None:
    if explicit is not None:
        return shlex.split(explicit)

    helptext = subprocess.run(
        [sys.executable, "-m", "fashiontag_pipeline", "run", "--help"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout
    for flag in (
        "--rotate-images",
        "--rotate-rows",
        "--rotate-size",
        "--task-rows",
        "--max-task-rows",
        "--rotate-after-rows",
        "--task-size",
    ):
        if flag in helptext:
            return [flag, str(rows)]
    return None


def _run_snapshot(args: argparse.Namespace, argv: list[str]) -> int:
    """Export ``args.snapshot`` and re-run this command from there (same venv)."""
    root = Path(__file__).resolve().parent.parent
    sha = subprocess.run(
        ["git", "rev-parse", "--short=12", args.snapshot],
        cwd=root,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    work = (args.work_dir or args.out_dir / "tmp").resolve()
    # Outside the repository, so that linters and test runners never see a second copy.
    snap = Path(tempfile.gettempdir()) / "fashiontag-bench-snapshots" / sha
    if not snap.exists():
        part = snap.with_name(snap.name + ".part")
        shutil.rmtree(part, ignore_errors=True)
        part.mkdir(parents=True)
        archive = subprocess.run(
            ["git", "archive", "--format=tar", sha], cwd=root, capture_output=True, check=True
        ).stdout
        subprocess.run(["tar", "-x", "-C", str(part)], input=archive, check=True)
        part.rename(snap)
    rest: list[str] = []
    skip = False
    own = ("--snapshot", "--out-dir", "--work-dir")  # replaced below
    for a in argv:
        if skip:
            skip = False
        elif a in own:
            skip = True
        elif not a.startswith(tuple(f"{o}=" for o in own)):
            rest.append(a)
    rest += ["--out-dir", str(args.out_dir.resolve()), "--work-dir", str(work)]
    shown = " ".join([*(shlex.quote(a) for a in rest[:-4]), "--snapshot", sha])
    env = dict(os.environ, PYTHONPATH=str(snap), BENCH_COMMIT=sha, BENCH_COMMAND=shown)
    print(f"measuring snapshot {sha} from {snap}", flush=True)
    return subprocess.run(
        [sys.executable, "-m", "benchmarks", *rest], cwd=snap, env=env, check=False
    ).returncode


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = _parser().parse_args(argv)
    if args.snapshot:
        return _run_snapshot(args, argv)
    sizes = FULL if args.mode == "full" else QUICK
    if args.rows:
        n = args.rows
        sizes = dataclasses.replace(
            sizes,
            cpu_rows=n,
            makespan_rows=n,
            memory_rows=(n, 10 * n),
            service_rows=n,
            faults_rows=n,
            rotate_rows=max(1000, n // 10),
            compare_rows=(n,),
        )
    if args.compare_rows:
        sizes = dataclasses.replace(sizes, compare_rows=args.compare_rows)
    if args.rate:
        sizes = dataclasses.replace(sizes, rate=args.rate)
    compiled = byte_compile_package()
    if compiled is not None:
        print(f"byte-compiled {compiled} (what the measured processes import)", flush=True)
    names = args.scenario or list(SCENARIOS)
    names = [n for n in SCENARIOS if n in names]  # canonical order: later ones reuse earlier
    work = args.work_dir or args.out_dir / "tmp"
    bench = Bench(
        sizes=sizes,
        work=work,
        engine_args=args.engine_arg,
        rotation_args=_rotation_args(args.rotation, sizes.rotate_rows),
        with_baseline=not args.no_baseline,
        keep_outputs=args.keep_outputs,
        repeat=max(1, args.repeat),
        log=lambda s: print(s, flush=True),
    )
    command = "python -m benchmarks " + os.environ.get(
        "BENCH_COMMAND", " ".join(shlex.quote(a) for a in argv)
    )
    print(f"benchmarks ({args.mode}): {', '.join(names)}; sizes {sizes}", flush=True)
    outcomes: dict[str, Outcome] = {}
    t0 = time.monotonic()
    try:
        for name in names:
            print(f"[{name}] {SCENARIOS[name].__doc__.splitlines()[0]}", flush=True)  # type: ignore[union-attr]
            try:
                outcomes[name] = SCENARIOS[name](bench)
            except Exception as exc:  # one broken scenario must not lose the others' figures
                print(f"  scenario {name} failed: {exc!r}", flush=True)
                failed = Outcome()
                failed.notes.append(f"scenario failed: {exc!r}")
                failed.budget(name, "scenario failed", False)
                outcomes[name] = failed
    finally:
        if not args.keep_outputs:
            cleanup(work)
    md = write_reports(
        args.out_dir,
        # A compare-only run has its own report files: it must not replace quick.* / full.*.
        mode="compare" if names == ["compare"] else args.mode,
        command=command.strip(),
        outcomes=outcomes,
        docs={n: (SCENARIOS[n].__doc__ or "").strip().splitlines()[0] for n in outcomes},
        sizes=dataclasses.asdict(sizes),
    )
    print(f"\ndone in {time.monotonic() - t0:.0f}s; report: {md}\n", flush=True)
    print(md.read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
