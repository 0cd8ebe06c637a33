"""When a manifest on a shared PostgreSQL state has failed: attempts in a row with no progress.

An attempt at a leased manifest that stops on an error (the database went away, the result
store failed, the manifest cannot be kept in the state at all) is followed by another once the
manifest is leased again. The manifest fails with the last reason once ``limit`` attempts in a
row here stopped with nothing committed by any of them. An attempt's own commits are only seen
when the next attempt begins and reads what the state holds (the database may be gone when it
stops), so that is where it is decided (:meth:`Attempts.begun`); an attempt that committed rows
written ahead, results or rejects starts the count again, and a long manifest outlives any
number of restarts or failovers that each let it progress. An attempt that stops before it can
look (:meth:`Attempts.over`) fails the manifest at once. A result store whose database cannot
be reached counts no attempt, nor does a state that cannot be connected to (the database at
its connection limit): the manifest waits for it, as for the state's database.
"""

from __future__ import annotations

from .. import _exceptions as exc
from ..engine.state.jobtables import JobRow

__all__ = ["Attempts"]


class Attempts:
    """The attempts of this daemon at each claim (by claim id)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._failed: dict[int, int] = {}
        self._reasons: dict[int, str] = {}
        #: What the state held of each claim when its last attempt here began.
        self._progress: dict[int, tuple[int, int, int]] = {}

    def begun(self, claim: int, row: JobRow | None) -> str | None:
        """An attempt begins with ``row`` committed: the reason to fail the manifest with when
        ``limit`` attempts in a row stopped with nothing committed since, else None."""
        progress = (0, 0, 0) if row is None else (row.chunked, row.results_ckpt, row.rejects_ckpt)
        if self._progress.get(claim, progress) != progress:
            self._failed.pop(claim, None)
        self._progress[claim] = progress
        failed = self._failed.get(claim, 0)
        if failed < self.limit:
            return None
        return f"{self._reasons.get(claim, 'it stopped on an error')} ({failed} attempts)"

    def failed(self, claim: int, error: Exception) -> int:
        """An attempt stopped on ``error``: how many in a row now. A result store that cannot
        be reached (an outage of its database) is no attempt of the manifest's: not counted,
        or an outage of a few lease lengths sent every manifest in flight to failed/. Nor is
        a state that cannot be connected to (the database at its connection limit while the
        daemon's pool still holds its own connections) or whose connection was lost."""
        if isinstance(error, exc.ResultStoreUnavailable | exc.StateUnavailable):
            return self._failed.get(claim, 0)
        count = self._failed[claim] = self._failed.get(claim, 0) + 1
        self._reasons[claim] = str(error)
        return count

    def over(self, claim: int) -> bool:
        """More attempts in a row failed than the limit: the last could not even look."""
        return self._failed.get(claim, 0) > self.limit

    def forget(self, claim: int) -> None:
        """The manifest is settled."""
        self._failed.pop(claim, None)
        self._reasons.pop(claim, None)
        self._progress.pop(claim, None)
