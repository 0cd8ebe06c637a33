"""Who calls a C function, per image: the callers of a function in two callgrind files of the
same client at two manifest sizes, as marginal instructions per image.

    python -m benchmarks.callers SMALL.out LARGE.out PATTERN [--rows 1000,20000] [--inclusive]

``benchmarks.instructions ... --functions N`` keeps each run's callgrind file (under
``--work-dir``: ``runs/instructions/callgrind.<client>.<rows>.out``) and names the functions
one client spends more on than another; this says where each is called from. Both files go
through ``callgrind_annotate --tree=caller`` (``--inclusive=yes`` with ``--inclusive``: a
function's cost with its callees', e.g. ``builtin_max`` with the comparisons it makes), and
for each function whose name holds ``PATTERN`` its own marginal cost and its callers' (what
each call site's calls cost, the largest first) are printed, (large - small) / (rows
difference). Python code shows as the interpreter's frames: read the C callers (``min_max``,
``set_update_internal``, ``list_extend``) against the engine's code.
"""

from __future__ import annotations

import argparse
import re
import subprocess

_LINE = re.compile(r"\s*([\d,]+) \([^)]*\)\s+([<*>])\s+(\S+)")


def callers(annotated: str) -> dict[str, tuple[int, dict[str, int]]]:
    """Each function's cost and its callers' (``callgrind_annotate --tree=caller`` output)."""
    out: dict[str, tuple[int, dict[str, int]]] = {}
    above: dict[str, int] = {}
    for line in annotated.splitlines():
        m = _LINE.match(line)
        if m is None:
            if not line.strip():
                above = {}
            continue
        cost, kind, fn = int(m.group(1).replace(",", "")), m.group(2), m.group(3)
        if kind == "<":
            above[fn] = above.get(fn, 0) + cost
        elif kind == "*":
            out.setdefault(fn, (cost, above))
            above = {}
    return out


def annotate(path: str, inclusive: bool) -> dict[str, tuple[int, dict[str, int]]]:
    cmd = ["callgrind_annotate", "--tree=caller", "--threshold=100"]
    cmd.append(f"--inclusive={'yes' if inclusive else 'no'}")
    text = subprocess.run([*cmd, path], capture_output=True, text=True, check=True).stdout
    return callers(text)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.callers")
    p.add_argument("small")
    p.add_argument("large")
    p.add_argument("pattern")
    p.add_argument("--rows", default="1000,20000", help="the two files' manifest sizes")
    p.add_argument("--inclusive", action="store_true")
    p.add_argument("--top", type=int, default=8)
    args = p.parse_args(argv)
    lo, hi = (int(n) for n in args.rows.split(","))
    small, large = annotate(args.small, args.inclusive), annotate(args.large, args.inclusive)
    for fn, (cost, by) in large.items():
        if args.pattern not in fn:
            continue
        cost0, by0 = small.get(fn, (0, {}))
        print(f"{fn.rsplit('/', 1)[-1]}: {(cost - cost0) / (hi - lo):,.0f} an image")
        rows = sorted(((c - by0.get(k, 0)) / (hi - lo), k) for k, c in by.items())
        for per, k in reversed(rows[-args.top :]):
            print(f"  {per:9,.1f}  < {k.rsplit('/', 1)[-1]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
