"""Reports: a Markdown table, a JSON document (with machine info) and PNG plots."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .scenarios import Outcome

__all__ = ["machine_info", "write_reports"]


def _git(*args: str) -> str:
    try:
        return subprocess.run(
            ["git", *args], capture_output=True, text=True, check=True, timeout=10
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def machine_info() -> dict[str, Any]:
    """CPU model, cores, memory, OS, interpreter, library versions and the git commit."""
    cpu = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem_gb = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem_gb = round(int(line.split()[1]) / 1024 / 1024, 1)
    except OSError:
        pass
    # A run of ``--snapshot REV`` measures an exported tree: its commit comes from the parent.
    snapshot = os.environ.get("BENCH_COMMIT")
    dirty = False if snapshot else bool(_git("status", "--porcelain", "--untracked-files=no"))
    return {
        "cpu": cpu or platform.processor(),
        "cores": os.cpu_count(),
        "memory_gb": mem_gb,
        "os": f"{platform.system()} {platform.release()}",
        "python": sys.version.split()[0],
        "implementation": platform.python_implementation(),
        "versions": {
            d: _version(d)
            for d in ("fashiontag_pipeline", "aiohttp", "msgspec", "anyio", "uvloop", "aiofiles")
        },
        "commit": snapshot or _git("rev-parse", "--short=12", "HEAD"),
        "snapshot": bool(snapshot),
        "dirty": dirty,
        "date": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }


# --------------------------------------------------------------------------- markdown

_ROWS: dict[str, list[tuple[str, str, str | None, str]]] = {
    # scenario -> (label, engine key, baseline key, unit)
    "cpu": [
        ("CPU per image, CLI", "engine_cli_us_per_image", "naive_us_per_image", "us"),
        ("CPU per image, Python API", "engine_api_us_per_image", "naive_us_per_image", "us"),
        (
            "CPU per image, CLI marginal (fixed cost removed)",
            "engine_cli_marginal_us_per_image",
            None,
            "us",
        ),
        ("wall time", "engine_cli_wall_s", "naive_wall_s", "s"),
        ("service CPU per image during the run", "service_cpu_us_per_image", None, "us"),
    ],
    "makespan": [
        ("makespan", "engine_makespan_s", "naive_makespan_s", "s"),
        ("makespan / (N/R)", "engine_over_bound", "naive_over_bound", "x"),
        (
            "time to first result (engine defaults)",
            "engine_first_result_s",
            "naive_first_result_s",
            "s",
        ),
    ],
    "ttfr": [
        ("time to first result, rotation on", "engine_first_result_s", "naive_first_result_s", "s"),
        ("makespan / (N/R), rotation on", "engine_over_bound", None, "x"),
    ],
    "service": [
        ("ingest (POST/PUT 1,000 each)", "ingest_images_per_s", None, "images/s"),
        ("results read (pages of 100)", "results_per_s", None, "results/s"),
        ("service CPU per result read", "read_service_cpu_us_per_result", None, "us"),
        ("capacity / engine rows per s", "capacity_over_engine", None, "x"),
    ],
    "faults": [
        ("completes, exactly once", "exactly_once", "naive_ok", "yes/no"),
        ("CPU per image with faults", "engine_us_per_image", "naive_us_per_image", "us"),
        ("CPU overhead vs no faults", "overhead_vs_clean", None, "x"),
        ("wall time with faults", "engine_wall_s", "naive_wall_s", "s"),
    ],
}


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        if abs(v) >= 1000:
            return f"{v:,.0f}"
        if abs(v) >= 100:
            return f"{v:.0f}"
        if abs(v) >= 10:
            return f"{v:.1f}"
        return f"{v:.2f}"
    if isinstance(v, int):
        return f"{v:,}"
    return str(v)


def _ratio(engine: Any, naive: Any) -> str:
    numbers = (int, float)
    if (
        isinstance(engine, numbers)
        and isinstance(naive, numbers)
        and not isinstance(engine, bool)
        and not isinstance(naive, bool)
        and engine
    ):
        return f"{naive / engine:.1f}x"
    return "-"


def markdown(doc: dict[str, Any]) -> str:
    m = doc["machine"]
    lines = [
        f"# Benchmark results ({doc['mode']})",
        "",
        f"{m['date']} - commit `{m['commit']}`"
        f"{' (dirty working tree)' if m['dirty'] else ''}"
        f"{' (measured from a clean export)' if m.get('snapshot') else ''} - "
        f"{m['cpu']}, {m['cores']} cores, {m['memory_gb']} GB - Python {m['python']}, "
        + ", ".join(
            f"{k} {v}" for k, v in m["versions"].items() if v and k != "fashiontag_pipeline"
        ),
        "",
        f"Reproduce: `{doc['command']}`",
        "",
        "## Budgets (DESIGN section 5)",
        "",
        "| budget | measured | met |",
        "|---|---|---|",
    ]
    for name, sc in doc["scenarios"].items():
        for bud in sc["budgets"]:
            met = {True: "yes", False: "**no**", None: "n/a"}[bud["met"]]
            lines.append(f"| {bud['budget']} ({name}) | {bud['figure']} | {met} |")
    if any(name != "compare" for name in doc["scenarios"]):
        lines += [
            "",
            "## Engine vs naive baseline (same run)",
            "",
            "| scenario | figure | engine | naive | naive / engine |",
            "|---|---|---|---|---|",
        ]
    for name, sc in doc["scenarios"].items():
        f = sc["figures"]
        for label, ek, nk, unit in _ROWS.get(name, []):
            if ek not in f:
                continue
            nv = f.get(nk) if nk else None
            lines.append(
                f"| {name} | {label} ({unit}) | {_fmt(f[ek])} | {_fmt(nv)} | "
                f"{_ratio(f[ek], nv) if nk else '-'} |"
            )
        if name == "memory":
            peaks = {k: v for k, v in f.items() if k.startswith("peak_rss_mb_")}
            for k, v in peaks.items():
                n = int(k.rsplit("_", 1)[1])
                nv = f.get("naive_peak_rss_mb")
                naive = f"{_fmt(nv)} (at {f.get('naive_rows', 0):,} rows)" if nv else "-"
                lines.append(f"| memory | peak RSS, {n:,} rows (MiB) | {_fmt(v)} | {naive} | - |")
            for k, v in f.items():
                if k.startswith("rss_ratio_"):
                    a, b = k.removeprefix("rss_ratio_").split("_over_")
                    lines.append(
                        f"| memory | peak RSS {int(a):,} / {int(b):,} rows | {_fmt(v)}x | - | - |"
                    )
    side = doc["scenarios"].get("compare", {}).get("figures", {}).get("side_by_side")
    if side:
        lines += [
            "",
            "## Side by side: engine, async script, naive (compare)",
            "",
            "CPU = user+sys of the client process per image (median of the runs; min-max).",
            "",
            "| rows | client | CPU us/image | user / sys us | wall s | peak RSS MiB | runs | "
            "complete |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for r in side:
            lines.append(
                f"| {r['rows']:,} | {r['client']} | **{r['cpu_us_per_image']:.1f}** "
                f"({r['cpu_us_min']:.1f}-{r['cpu_us_max']:.1f}) | "
                f"{r['user_us_per_image']:.1f} / {r['sys_us_per_image']:.1f} | "
                f"{r['wall_s']:.2f} | {r['peak_rss_mb']:.0f} | {r['runs']} | "
                f"{_fmt(r['complete'])} |"
            )
    lines += ["", "## Scenario details", ""]
    for name, sc in doc["scenarios"].items():
        lines.append(f"- **{name}**: {sc['doc']}")
        extra = {
            k: v
            for k, v in sc["figures"].items()
            if not any(k in (ek, nk) for _, ek, nk, _ in _ROWS.get(name, []))
            and not k.startswith(("peak_rss_mb_", "rss_ratio_"))
            and k != "side_by_side"
        }
        if extra:
            lines.append("  " + ", ".join(f"{k}={_fmt(v)}" for k, v in extra.items()))
        for note in sc["notes"]:
            lines.append(f"  - note: {note}")
        for run in sc["runs"]:
            flag = "" if run["ok"] else f" **FAILED rc={run['returncode']}**"
            lines.append(
                f"  - {run['label']}: wall {run['wall_s']:.1f}s, cpu {run['cpu_s']:.2f}s "
                f"({run['cpu_us_per_row']:.1f} us/row), peak RSS {run['peak_rss_mb']:.0f} MiB, "
                f"first result {_fmt(run['first_result_s'])}s{flag}"
            )
    if doc.get("plots"):
        lines += ["", "## Plots", ""]
        for p in doc["plots"]:
            lines.append(f"![{p}]({p})")
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- plots


def plots(doc: dict[str, Any], runs: dict[str, list[Any]], out_dir: Path) -> list[str]:
    """Results over time and RSS over time, one line per measured run. Returns file names."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no plots (pip install -e '.[bench]')", file=sys.stderr)
        return []
    mode = doc["mode"]
    written: list[str] = []

    # 1. Results over time: the rate-limited scenarios (and the CPU scenario, rate 0).
    panels = [(k, runs[k]) for k in ("makespan", "ttfr", "cpu", "faults") if runs.get(k)]
    if panels:
        fig, axes = plt.subplots(len(panels), 1, figsize=(9, 3.2 * len(panels)), squeeze=False)
        for ax, (name, rs) in zip(axes[:, 0], panels, strict=True):
            seen: set[str] = set()
            for r in rs:
                if r.label in seen or r.rows <= 1000:
                    continue
                seen.add(r.label)
                curve = r.results_curve()
                if curve:
                    ax.plot([t for t, _ in curve], [y for _, y in curve], label=r.label)
            f = doc["scenarios"][name]["figures"]
            if name in ("makespan", "ttfr"):
                n, rate = f["rows"], f["rate"]
                ax.plot([0, n / rate], [0, n], "k--", lw=1, label=f"lower bound N/R ({rate}/s)")
            ax.set_title(f"{name}: results written over time")
            ax.set_xlabel("seconds since start")
            ax.set_ylabel("results")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
        fig.tight_layout()
        name = f"{mode}-throughput.png"
        fig.savefig(out_dir / name, dpi=110)
        plt.close(fig)
        written.append(name)

    # 2. RSS over time: the memory scenario plus the naive baseline of the CPU scenario.
    mem = list(runs.get("memory", []))
    mem += [r for r in runs.get("cpu", []) if r.label.startswith("naive")]
    if mem:
        fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4))
        for r in mem:
            ts = [t for t, _, _ in r.samples]
            rss = [m for _, m, _ in r.samples]
            if not ts:
                continue
            ax1.plot(ts, rss, label=f"{r.label} (peak {r.peak_rss_mb:.0f} MiB)")
            wall = max(ts[-1], 1e-9)
            ax2.plot([t / wall for t in ts], rss, label=r.label)
        ax1.axhline(200, color="r", ls=":", lw=1, label="budget 200 MiB")
        ax2.axhline(200, color="r", ls=":", lw=1)
        ax1.set_title("RSS over time")
        ax1.set_xlabel("seconds since start")
        ax1.set_ylabel("RSS (MiB)")
        ax2.set_title("RSS over the run (normalized time)")
        ax2.set_xlabel("fraction of the run")
        for ax in (ax1, ax2):
            ax.grid(alpha=0.3)
            ax.set_ylim(bottom=0)
        ax1.legend(fontsize=8)
        fig.tight_layout()
        name = f"{mode}-rss.png"
        fig.savefig(out_dir / name, dpi=110)
        plt.close(fig)
        written.append(name)
    return written


# --------------------------------------------------------------------------- writing


def write_reports(
    out_dir: Path,
    *,
    mode: str,
    command: str,
    outcomes: dict[str, Outcome],
    docs: dict[str, str],
    sizes: dict[str, Any],
) -> Path:
    """Write ``<mode>.md/.json`` and ``latest.md/.json`` plus plots; return the Markdown path."""
    out_dir.mkdir(parents=True, exist_ok=True)
    doc: dict[str, Any] = {
        "mode": mode,
        "command": command,
        "machine": machine_info(),
        "sizes": sizes,
        "scenarios": {
            name: {
                "doc": docs[name],
                "figures": o.figures,
                "budgets": o.budgets,
                "notes": o.notes,
                "runs": [r.to_json() for r in o.runs],
            }
            for name, o in outcomes.items()
        },
    }
    doc["plots"] = plots(doc, {k: o.runs for k, o in outcomes.items()}, out_dir)
    text = markdown(doc)
    payload = json.dumps(doc, indent=1, default=str)
    for stem in (mode, "latest"):
        (out_dir / f"{stem}.md").write_text(text)
        (out_dir / f"{stem}.json").write_text(payload)
    return out_dir / "latest.md"
