"""Instructions per image, counted by valgrind: before/after that a busy machine cannot blur.

    python -m benchmarks.instructions REV [REV...] [--rows 1000,20000] [--async-script]

On a shared 2-core machine the CPU time of the same build moves by 10-30% from one run to the
next (other engineers' tests), more than most changes save. The number of instructions a run
executes barely moves (+-0.5% between repeats here): each revision (exported with ``git
archive`` and byte-compiled, like :mod:`benchmarks.ab`) runs ``fashiontag run`` under
``valgrind --tool=callgrind`` (no cache simulation) against a fresh ``serve --rate 0
--no-fetch``, at each ``--rows`` size. Printed: total instructions per run, and the marginal
instructions per image between the smallest and the largest size (start-up cancels out).

``--hash-seed`` (default ``0``) sets ``PYTHONHASHSEED`` for every child (the service, the
engine, the script), and the output names it: without it each child drew its own, so the
layouts of its dicts and sets of ids (their probes and resizes) differed from run to run.
``--hash-seed 0,1,2`` counts every client at each seed and prints the median of their
marginals too (one seed's layout could favour one side); ``random`` leaves it unset.

What it does not see: time in the kernel (system calls, page faults), cache misses, waits for
the GIL or for another thread; and instructions are not all equal (a large ``memcpy`` is one
``rep movsb`` counted once per byte; interpreted bytecode runs at a lower rate than C
loops).
Use it to compare code paths, and :mod:`benchmarks.ab` for the CPU seconds. Under valgrind
the engine is ~50x slower, so the service is never the bottleneck; 20,000 rows take about
half a minute per revision. Needs ``valgrind``.

``--functions N`` (with ``--async-script``) also says where the difference is: every run's
callgrind file is kept, ``callgrind_annotate`` gives each C function's own instructions, and
the N functions the first revision spends most more on than the async script (and N/3 the other
way) are printed as marginal instructions per image between the two sizes, each side's figure
beside the difference. Python code shows as the interpreter loop (``_PyEval_EvalFrameDefault``),
msgspec's JSON, SQLite, sre, libc: it says which kind of work differs, and py-spy which
Python functions do it.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from .ab import ROOT, _export
from .harness import PY, manifest, manifest_options, running_service
from .scenarios import ASYNC_SCRIPT

_TOTALS = re.compile(r"^(?:summary|totals):\s+(\d+)", re.MULTILINE)


def count(cmd: list[str], env: dict[str, str] | None, work: Path, keep: Path | None = None) -> int:
    """Instructions executed by ``cmd`` (every thread), from callgrind's totals (``keep``:
    where the callgrind file stays, for :func:`by_function`)."""
    out = keep or work / "callgrind.out"
    out.unlink(missing_ok=True)
    valgrind = ["valgrind", "--tool=callgrind", "--cache-sim=no", "--branch-sim=no"]
    full_env = dict(os.environ)
    full_env.update(env or {})
    subprocess.run(
        [*valgrind, f"--callgrind-out-file={out}", *cmd],
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=full_env,
    )
    found = _TOTALS.search(out.read_text(errors="replace"))
    if found is None:
        raise RuntimeError(f"no totals in {out}")
    return int(found.group(1))


_ANNOTATED = re.compile(r"^\s*([\d,]+) \(\s*[\d.]+%\)\s+(.+?)(?: \[([^]]*)\])?$")


def by_function(callgrind_file: Path) -> dict[str, int]:
    """Each function's own instructions in a callgrind file (see :func:`parse_annotated`)."""
    text = subprocess.run(
        ["callgrind_annotate", "--threshold=100", str(callgrind_file)],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return parse_annotated(text)


def parse_annotated(text: str) -> dict[str, int]:
    """``callgrind_annotate``'s function lines as {name: instructions}, named ``file:function``
    without the build directory or the recursion depth (``'2``, summed with the outer calls); a
    function without debug symbols by its library and address (``libcrypto.so.3:0x29ad80``)."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        found = _ANNOTATED.match(line)
        if found is None or "PROGRAM TOTALS" in line:
            continue
        name = re.sub(r"'\d+", "", found.group(2))
        name = re.sub(r"^.*/(?=[^/]+:)", "", name)  # the file's name, not its build path
        if name.startswith("???") and found.group(3):  # no symbol: name its library
            name = f"{Path(found.group(3)).name}:{name[4:]}"
        out[name] = out.get(name, 0) + int(found.group(1).replace(",", ""))
    return out


def function_table(
    counted: dict[str, dict[int, dict[str, int]]],
    first: str,
    other: str,
    rows: tuple[int, int],
    top: int,
) -> list[str]:
    """Markdown rows: the ``top`` functions ``first`` spends most more on than ``other``
    (marginal instructions per image between the two sizes), then ``top // 3`` the other way."""
    small, large = rows

    def marginal(name: str, fn: str) -> float:
        got = counted[name]
        return (got[large].get(fn, 0) - got[small].get(fn, 0)) / (large - small)

    names = set().union(*(counted[n][r] for n in (first, other) for r in rows))
    diffs = sorted(
        ((marginal(first, fn), marginal(other, fn), fn) for fn in names),
        key=lambda d: d[1] - d[0],
    )

    def line(a: float, b: float, fn: str) -> str:
        return f"| `{fn}` | {a:,.0f} | {b:,.0f} | {a - b:+,.0f} |"

    more = [line(*d) for d in diffs[:top]]
    less = [line(*d) for d in reversed(diffs[-max(1, top // 3) :])]
    return [
        f"| function | {first} | {other} | difference |",
        "|---|---|---|---|",
        *more,
        "| ... | | | |",
        *less,
    ]


def hash_seeds(text: str) -> list[str | None]:
    """``--hash-seed``'s value: comma-separated seeds (0 to 4294967295), or ``random`` (no
    ``PYTHONHASHSEED``: each child draws its own, as before the option)."""
    seeds: list[str | None] = []
    for part in text.split(","):
        part = part.strip()
        if part == "random":
            seeds.append(None)
        elif part.isdigit() and int(part) <= 4_294_967_295:
            seeds.append(str(int(part)))
        else:
            raise argparse.ArgumentTypeError(f"not a hash seed: {part!r}")
    return seeds


def seeded(seed: str | None) -> None:
    """Set (or, for ``random``, unset) ``PYTHONHASHSEED`` in this process's environment, which
    every child inherits: the service, the engine and the script under valgrind."""
    if seed is None:
        os.environ.pop("PYTHONHASHSEED", None)
    else:
        os.environ["PYTHONHASHSEED"] = seed


def _seed_name(seed: str | None) -> str:
    return "random" if seed is None else seed


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.instructions", description=__doc__)
    p.add_argument("revisions", nargs="+")
    p.add_argument("--rows", default="1000,20000", help="manifest sizes, comma-separated")
    p.add_argument("--async-script", action="store_true", help="count the async script too")
    manifest_options(p)
    p.add_argument(
        "--functions",
        type=int,
        default=0,
        metavar="N",
        help="with --async-script: the N functions the first revision spends most more on",
    )
    p.add_argument(
        "--hash-seed",
        type=hash_seeds,
        default=["0"],
        metavar="SEEDS",
        help="PYTHONHASHSEED of every child (the service, the engine, the script): one seed, "
        "several comma-separated (each counted, then the median of their marginals), or "
        "random (unset; default 0)",
    )
    p.add_argument("--work-dir", type=Path, default=ROOT / "benchmarks" / "results" / "tmp")
    args = p.parse_args(argv)
    if shutil.which("valgrind") is None:
        print("valgrind not found", file=sys.stderr)
        return 2
    if args.functions and not args.async_script:
        p.error("--functions compares with the async script: add --async-script")
    sizes = sorted(int(r) for r in args.rows.split(","))
    seeds: list[str | None] = args.hash_seed
    work: Path = args.work_dir.resolve()
    snaps = Path(tempfile.gettempdir()) / "fashiontag-bench-snapshots"
    clients: list[tuple[str, Path | None]] = []
    for rev in args.revisions:
        sha, path = _export(rev, snaps, pyc=True)
        clients.append((f"engine {sha}", path))
    if args.async_script:
        clients.append(("async script", None))
    runs = work / "runs" / "instructions"
    runs.mkdir(parents=True, exist_ok=True)
    neutral = Path(tempfile.mkdtemp(prefix="fashiontag-instr-"))
    os.chdir(neutral)  # `-m fashiontag_pipeline` must import the export, never the checkout
    counted: dict[tuple[str, int], dict[int, int]] = {}
    functions: dict[str, dict[int, dict[str, int]]] = {name: {} for name, _ in clients}
    print("PYTHONHASHSEED " + ", ".join(map(_seed_name, seeds)), flush=True)
    for i, seed in enumerate(seeds):
        seeded(seed)
        for rows in sizes:
            m = manifest(work, rows, args.ids, args.context, args.jsonl)
            for name, path in clients:
                keep = None
                if args.functions and i == 0:
                    keep = runs / f"callgrind.{name.replace(' ', '-')}.{rows}.out"
                n = _count_one(runs, m, path, keep)
                if keep is not None:
                    functions[name][rows] = by_function(keep)
                counted.setdefault((name, i), {})[rows] = n
                label = f"{name}, seed {_seed_name(seed)}"
                print(f"  {rows:,} {label}: {n / 1e9:.3f} G instructions", flush=True)
    shutil.rmtree(neutral, ignore_errors=True)
    print()
    print("\n".join(totals_table(counted, [name for name, _ in clients], seeds, sizes)))
    if args.functions and len(sizes) > 1:
        first = clients[0][0]
        seed_name = _seed_name(seeds[0])
        print(f"\nWhere {first} and the async script differ (marginal instructions per image,")
        print(f"PYTHONHASHSEED {seed_name}):\n")
        table = function_table(
            functions, first, "async script", (sizes[0], sizes[-1]), args.functions
        )
        print("\n".join(table))
    return 0


def _count_one(runs: Path, m: Path, path: Path | None, keep: Path | None) -> int:
    """One client's run on manifest ``m`` against a fresh service: the engine exported at
    ``path``, or the async script (``None``)."""
    for f in runs.glob("run.*"):
        f.unlink()
    out = runs / "run.out.jsonl"
    with running_service(runs) as svc:
        if path is None:
            cmd = [PY, str(ASYNC_SCRIPT), str(m), "--base-url", svc.url, "--out", str(out)]
            env = None
        else:
            cmd = [PY, "-m", "fashiontag_pipeline", "run", str(m), "--base-url", svc.url]
            cmd += ["--out", str(out), "--rejects", str(runs / "run.rejects.jsonl")]
            cmd += ["--state", str(runs / "run.state.sqlite"), "--no-progress"]
            env = {"PYTHONPATH": str(path)}
        return count(cmd, env, runs, keep)


def totals_table(
    counted: dict[tuple[str, int], dict[int, int]],
    names: list[str],
    seeds: list[str | None],
    sizes: list[int],
) -> list[str]:
    """Markdown rows: each client's total at each size and hash seed, its marginal
    instructions per image (smallest -> largest size), then with several seeds the median of
    the marginals; last, with an engine and the script, each engine's ratio to the script."""
    small, large = sizes[0], sizes[-1]
    both = len(sizes) > 1
    head = f"| client | seed | {' | '.join(f'{r:,} rows (G instr)' for r in sizes)} |"
    head += f" marginal instr/image ({small:,}->{large:,}) |" if both else ""
    lines = [head, "|---" * (len(sizes) + 2 + both) + "|"]
    marginal: dict[str, float] = {}
    for name in names:
        per_seed = []
        for i, seed in enumerate(seeds):
            got = counted[(name, i)]
            cells = " | ".join(f"{got[r] / 1e9:.3f}" for r in sizes)
            line = f"| {name} | {_seed_name(seed)} | {cells} |"
            if both:
                per_seed.append((got[large] - got[small]) / (large - small))
                line += f" {per_seed[-1]:,.0f} |"
            lines.append(line)
        if both:
            marginal[name] = statistics.median(per_seed)
            if len(seeds) > 1:
                blank = " |" * len(sizes)
                lines.append(f"| {name} | median |{blank} {marginal[name]:,.0f} |")
    script = marginal.get("async script")
    if script:
        lines.append("")
        for name in names[:-1]:
            lines.append(f"{name} / async script: {marginal[name] / script:.3f}x")
    return lines


if __name__ == "__main__":
    sys.exit(main())
