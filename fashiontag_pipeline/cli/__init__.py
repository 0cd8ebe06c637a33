"""The ``fashiontag`` command line (the top layer: it may use every half; none uses it).

This module stays cheap to import: :func:`main`, the console script's entry point, holds the
stop signals before the commands (and their 100-odd ms of imports) are loaded, so that a stop
sent while the command starts is a clean exit (:mod:`.startup`).
"""

from __future__ import annotations

from collections.abc import Sequence

from . import startup

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``fashiontag`` console script (``argv`` None: ``sys.argv``)."""
    if argv is None:
        startup.hold_signals()
        startup.defer_collections()  # (until the command runs)
    from .commands import main as command_line

    return command_line(argv)
