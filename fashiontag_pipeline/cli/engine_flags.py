"""The engine's flags, shared by ``fashiontag run`` and ``fashiontag daemon``, and the
configuration they make: the ``[engine]`` table of ``--config`` first, then the flags given.
"""

from __future__ import annotations

import argparse
from typing import Any

import msgspec

from .._config import load_section
from .._exceptions import ConfigError
from ..engine.config import EngineConfig
from .common import nonempty, parse_detection

__all__ = ["add_engine_arguments", "engine_config_from_args"]

_D = EngineConfig()  # the defaults shown in --help


def add_engine_arguments(
    parser: argparse.ArgumentParser, *, give_up: bool = True, jsonl_only: bool = False
) -> None:
    """The engine's flags, shared by ``run`` and ``daemon`` (which never gives up: no
    ``--give-up-after`` there; and writes JSONL only: ``jsonl_only``)."""
    parser.add_argument("--detection", type=parse_detection, help="default detection, TOP,SHOES")
    if not jsonl_only:
        parser.add_argument(
            "--sink", choices=("jsonl", "sqlite"), help="results sink kind (default jsonl)"
        )
    else:
        # The daemon writes JSONL only: its help offers nothing else. Not ``choices``: another
        # value (from here or ``engine.sink`` in a config file) gets the daemon's own reason.
        parser.add_argument(
            "--sink",
            metavar="{jsonl}",
            help="results sink kind: OUTBOX/STEM/results.jsonl (jsonl, the only one)",
        )
    parser.add_argument(
        "--rotate-images",
        type=int,
        metavar="N",
        help=f"a task holds at most N images (default {_D.rotate_images:,})",
    )
    parser.add_argument(
        "--rotate-min-images",
        type=int,
        metavar="N",
        help="the first tasks hold N images, later ones at least N "
        f"(default {_D.rotate_min_images:,})",
    )
    parser.add_argument(
        "--rotate-fraction",
        type=float,
        metavar="F",
        help="a task holds at most F x the images sent before it (within the two bounds; "
        f"default {_D.rotate_fraction:g})",
    )
    parser.add_argument(
        "--rotate-seconds",
        type=float,
        metavar="S",
        help=f"seal a task after S seconds (default {_D.rotate_seconds:g})",
    )
    parser.add_argument(
        "--expiry-margin",
        type=float,
        metavar="S",
        help=f"no write later than expiry - S (default {_D.expiry_margin:g})",
    )
    parser.add_argument(
        "--linger",
        type=float,
        metavar="S",
        help=f"max seconds a partial chunk waits (default {_D.linger_seconds:g})",
    )
    parser.add_argument(
        "--write-concurrency",
        type=int,
        metavar="N",
        help=f"cap of concurrent writes (default {_D.max_write_concurrency})",
    )
    parser.add_argument(
        "--page-concurrency",
        type=int,
        metavar="N",
        help=f"cap of concurrent page reads (default {_D.max_page_concurrency})",
    )
    if give_up:
        parser.add_argument(
            "--give-up-after",
            type=float,
            metavar="S",
            help="seconds of continuous failure (service unreachable, refusing) before the run "
            "stops with its state saved (default 120)",
        )
        parser.add_argument(
            "--stall-timeout",
            type=float,
            metavar="S",
            help="seconds with no progress on any task the run waits for (the service holds "
            f"them processing) before it stops with its state saved (default {_D.stall_timeout:g})",
        )
    parser.add_argument(
        "--read-again-window",
        type=float,
        metavar="S",
        help="seconds after a task is done during which its pages short of rows are read "
        "again before those rows are sent (and billed) again: a results store that lags the "
        f"task status (default {_D.read_again_window:g}; 0: sent again at once)",
    )
    parser.add_argument(
        "--reuse",
        type=nonempty,
        metavar="PATH|URL",
        help="result store (a SQLite file, created when missing, or a postgresql:// URL): a row "
        "whose request (URL, "
        "detection, language, context other than id) has a stored successful result is "
        'written from it ("reused": true) with no request; every successful result is stored',
    )
    parser.add_argument(
        "--reuse-max-age",
        metavar="DURATION",
        help="oldest stored result --reuse may stand in with, e.g. 30d, 12h (default "
        f"{_D.reuse_max_age})",
    )
    parser.add_argument(
        "--single-concurrency",
        type=int,
        metavar="N",
        help="cap of concurrent single-mode requests (local files, data: URIs; "
        f"default {_D.single_concurrency})",
    )


def engine_config_from_args(args: argparse.Namespace) -> EngineConfig:
    """The ``[engine]`` table of --config, then flags."""
    base = load_section(getattr(args, "config", None), "engine", EngineConfig)
    overrides: dict[str, Any] = {
        "default_detection": getattr(args, "detection", None),
        "sink": getattr(args, "sink", None),
        "rotate_images": getattr(args, "rotate_images", None),
        "rotate_min_images": getattr(args, "rotate_min_images", None),
        "rotate_fraction": getattr(args, "rotate_fraction", None),
        "rotate_seconds": getattr(args, "rotate_seconds", None),
        "expiry_margin": getattr(args, "expiry_margin", None),
        "linger_seconds": getattr(args, "linger", None),
        "max_write_concurrency": getattr(args, "write_concurrency", None),
        "max_page_concurrency": getattr(args, "page_concurrency", None),
        "give_up_after": getattr(args, "give_up_after", None),
        "stall_timeout": getattr(args, "stall_timeout", None),
        "read_again_window": getattr(args, "read_again_window", None),
        "single_concurrency": getattr(args, "single_concurrency", None),
        "progress_seconds": getattr(args, "progress_interval", None),
        "reuse": getattr(args, "reuse", None),
        "reuse_max_age": getattr(args, "reuse_max_age", None),
    }
    changes = {k: v for k, v in overrides.items() if v is not None}
    if not changes:
        return base
    try:
        return msgspec.structs.replace(base, **changes)
    except (ValueError, TypeError) as err:
        raise ConfigError(f"invalid engine option: {err}") from None
