"""Profile the engine on the CPU scenario with py-spy and print its hot spots.

    python -m benchmarks.profile [--rows 200000] [--out benchmarks/results/tmp/profile]

Starts the reference service (``--rate 0 --no-fetch``) in its own process, records
``fashiontag run`` with ``py-spy record --gil`` (only samples where Python holds the GIL, which
approximates Python CPU time; waits in threads and the event loop are left out), writes a
speedscope file (open it at speedscope.app) and a flamegraph SVG, and prints the functions
with the largest self and inclusive share. Needs ``pip install -e '.[bench]'`` (py-spy).
"""

from __future__ import annotations

import argparse
import collections
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from .harness import PY, manifest, manifest_options, running_service

DEFAULT_OUT = Path(__file__).parent / "results" / "tmp" / "profile"


def _where(frame: dict[str, Any]) -> str:
    file = str(frame.get("file", ""))
    for marker in ("site-packages/", "/fashiontag_pipeline/", "/lib/python3"):
        if marker in file:
            file = file.split(marker, 1)[1]
            if marker == "/fashiontag_pipeline/":
                file = "fashiontag_pipeline/" + file
            break
    return file


def hot_spots(speedscope: Path, top: int = 25) -> dict[str, list[tuple[float, str]]]:
    """Self and inclusive shares (percent of samples) per function of a speedscope profile."""
    doc = json.loads(speedscope.read_text())
    frames = doc["shared"]["frames"]
    total = 0.0
    own: collections.Counter[str] = collections.Counter()
    incl: collections.Counter[str] = collections.Counter()
    for prof in doc["profiles"]:
        for stack, weight in zip(prof["samples"], prof["weights"], strict=True):
            total += weight
            if not stack:
                continue
            leaf = frames[stack[-1]]
            own[f"{leaf['name']} ({_where(leaf)}:{leaf.get('line')})"] += weight
            seen: set[str] = set()
            for i in stack:
                key = f"{frames[i]['name']} ({_where(frames[i])})"
                if key not in seen:
                    seen.add(key)
                    incl[key] += weight
    if not total:
        return {"self": [], "inclusive": [], "total_s": []}
    return {
        "total_s": [(total, "seconds of samples")],
        "self": [(100 * w / total, k) for k, w in own.most_common(top)],
        "inclusive": [(100 * w / total, k) for k, w in incl.most_common(top * 2)],
    }


def main() -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.profile")
    p.add_argument("--rows", type=int, default=200_000)
    manifest_options(p)
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    p.add_argument("--rate", type=int, default=250, help="py-spy samples per second")
    p.add_argument("--top", type=int, default=25)
    args = p.parse_args()
    spy = shutil.which("py-spy") or str(Path(PY).parent / "py-spy")
    if not Path(spy).exists():
        print("py-spy not found: pip install -e '.[bench]'", file=sys.stderr)
        return 2
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    m = manifest(out.parent, args.rows, args.ids, args.context, args.jsonl)
    with running_service(out) as svc:
        for fmt, name in (("speedscope", "engine.speedscope.json"), ("flamegraph", "engine.svg")):
            for f in out.glob("run.*"):
                f.unlink()
            cmd = [spy, "record", "--gil", "-r", str(args.rate), "-o", str(out / name)]
            cmd += ["--format", fmt, "--", PY, "-m", "fashiontag_pipeline", "run", str(m)]
            cmd += ["--base-url", svc.url, "--out", str(out / "run.results.jsonl")]
            cmd += ["--rejects", str(out / "run.rejects.jsonl")]
            cmd += ["--state", str(out / "run.state.sqlite"), "--no-progress"]
            print("$", " ".join(cmd[:8]), "...", flush=True)
            subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    for f in out.glob("run.*"):
        f.unlink()
    spots = hot_spots(out / "engine.speedscope.json", args.top)
    total = spots["total_s"][0][0] if spots["total_s"] else 0.0
    print(
        f"\nhot spots of `fashiontag run` on {args.rows:,} rows: {total:.2f}s of GIL-held "
        f"samples = {total / args.rows * 1e6:.1f} us/row (shares below are of those samples)"
    )
    for kind in ("self", "inclusive"):
        print(f"\n-- {kind}")
        for share, name in spots[kind]:
            print(f"{share:5.1f}%  {name}")
    print(f"\nspeedscope: {out / 'engine.speedscope.json'}\nflamegraph: {out / 'engine.svg'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
