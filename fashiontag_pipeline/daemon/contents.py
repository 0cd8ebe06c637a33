"""Manifests of one content on one daemon of a shared PostgreSQL state, one at a time.

Two claims of equal content (a file dropped again under another name while the first is being
tagged) were leased side by side and both tagged: every row billed twice, where a daemon on a
SQLite state has the second wait for the first, then finds it completed (a duplicate). The
second now takes its turn after the first in the same way (docs/postgresql.md: with one
daemon, the second waits for the first). Daemons of one fleet do not wait for each other.
"""

from __future__ import annotations

import anyio

__all__ = ["ContentTurns"]


class ContentTurns:
    """One turn per content (its sha256) at a time, taken in the order asked."""

    def __init__(self) -> None:
        self._held: dict[str, anyio.Event] = {}

    async def take(self, sha256: str) -> None:
        """Wait until no manifest of this content holds a turn, then hold it."""
        while (event := self._held.get(sha256)) is not None:
            await event.wait()
        self._held[sha256] = anyio.Event()

    def release(self, sha256: str) -> None:
        """End the turn held on ``sha256``: the next claim of the content goes on."""
        event = self._held.pop(sha256, None)
        if event is not None:
            event.set()
