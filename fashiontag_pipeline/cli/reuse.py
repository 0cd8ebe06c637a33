"""``fashiontag reuse stats|prune STORE``: inspect and trim the result store of ``--reuse``.

``stats`` prints rows, size on disk, the oldest and newest stored result, and what the last run
that used the store did with it (rows looked up, reused, hit rate, results stored); ``--json``
for programs. ``prune --older-than 30d`` deletes results stored longer ago than that (they would
not be reused by a run whose ``--reuse-max-age`` is shorter anyway). Neither creates a store: a
missing or unreadable one is an error (exit 1) naming the file.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from datetime import UTC, datetime
from pathlib import Path

import msgspec

from .._exceptions import FashiontagError
from .._models import format_time
from .._postgres import foreign_advice, foreign_url, is_postgres_url, redact_url
from ..engine.reuse import StoreStats, open_store, parse_duration
from ..engine.run_checks import a_folder
from .common import EXIT_ERROR, EXIT_OK, EXIT_USAGE
from .streams import write_stdout

__all__ = ["add_reuse_arguments", "format_stats", "reuse_command"]


def add_reuse_arguments(parser: argparse.ArgumentParser) -> None:
    """Actions of ``fashiontag reuse``."""
    actions = parser.add_subparsers(dest="reuse_command", required=True, metavar="ACTION")
    stats = actions.add_parser(
        "stats", help="rows, size, oldest/newest result, hit rate of the last run"
    )
    stats.add_argument(
        "store",
        metavar="STORE",
        help="result store: a file or a postgresql:// URL (run --reuse STORE)",
    )
    stats.add_argument("--json", action="store_true", help="print the figures as JSON")
    prune = actions.add_parser("prune", help="delete results stored longer ago than a duration")
    prune.add_argument(
        "store",
        metavar="STORE",
        help="result store: a file or a postgresql:// URL (run --reuse STORE)",
    )
    prune.add_argument(
        "--older-than",
        required=True,
        metavar="DURATION",
        help="with its unit: 30d, 12h, 90m, 45s (a bare number is refused: it deletes)",
    )


def _when(stamp: float | None) -> str:
    return format_time(datetime.fromtimestamp(stamp, UTC)) if stamp is not None else "-"


def format_stats(stats: StoreStats) -> str:
    """The ``reuse stats`` text."""
    lines = [
        f"result store {stats.path}",
        f"  rows {stats.rows:,}   size {stats.size_bytes / 1e6:,.1f} MB",
        f"  oldest {_when(stats.oldest)}   newest {_when(stats.newest)}",
    ]
    last = stats.last_run
    if last is None:
        lines.append("  last run: none recorded")
    else:
        rate = f"{last.hit_rate:.1%}" if last.hit_rate is not None else "-"
        lines.append(
            f"  last run {_when(last.started_at)} .. {_when(last.finished_at)}: looked up "
            f"{last.looked_up:,}   reused {last.reused:,}   hit rate {rate}   "
            f"stored {last.stored:,}"
        )
    return "\n".join(lines)


def reuse_command(args: argparse.Namespace) -> int:
    """``fashiontag reuse``: returns the exit code."""
    older_than: float | None = None
    if args.reuse_command == "prune":
        text = args.older_than.strip()
        if text.replace(".", "", 1).isdigit():
            # (--reuse-max-age takes a bare number as seconds; a prune deletes, and "30"
            # meant 30 days would empty the store: every row billed again the next night)
            print(
                f"fashiontag: --older-than {text}: give its unit: {text}d for {text} days,"
                f" {text}h for hours, {text}s for {text} seconds",
                file=sys.stderr,
            )
            return EXIT_USAGE
        try:
            older_than = parse_duration(args.older_than)
        except ValueError as err:
            print(f"fashiontag: --older-than: {err}", file=sys.stderr)
            return EXIT_USAGE
    if foreign_url(args.store):
        print(
            f"fashiontag: {redact_url(args.store)}: not a result store this fashiontag can use: "
            + foreign_advice(args.store),
            file=sys.stderr,
        )
        return EXIT_USAGE
    if not is_postgres_url(args.store) and (
        problem := a_folder([("result store", Path(args.store))])
    ):
        print(f"fashiontag: {problem}", file=sys.stderr)  # (SQLite: "unable to open ...")
        return EXIT_USAGE
    try:
        store = open_store(args.store, create=False)
        with contextlib.closing(store):
            if older_than is None:
                stats = store.stats()
                if args.json:
                    data = msgspec.to_builtins(stats)
                    if stats.last_run is not None:
                        data["last_run"]["hit_rate"] = stats.last_run.hit_rate
                    write_stdout(msgspec.json.encode(data).decode() + "\n")
                else:
                    write_stdout(format_stats(stats) + "\n")
            else:
                deleted = store.prune(older_than)
                left = store.stats().rows
                write_stdout(
                    f"pruned {deleted:,} results stored more than {args.older_than} ago; "
                    f"{left:,} left in {store.path}\n"
                )
    except FashiontagError as err:
        print(f"fashiontag: {err}", file=sys.stderr)
        return EXIT_ERROR
    return EXIT_OK
