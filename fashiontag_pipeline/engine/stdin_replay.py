"""A resume of a run that read stdin: the rows piped again must be the rows it read.

``fashiontag run - --resume`` takes the caller's word that stdin carries the same rows again:
the rows at or below the job's watermarks are skipped by their line numbers. Two checks keep
another night's rows from being skipped in place of rows never sent (lost with exit 0):

* :func:`check_replayed`, per batch, before any of its rows is sent: each replayed row's id is
  the one the run took in at that line (names the first line that differs);
* :class:`StdinDigest`: a CRC-32 of every row read from stdin (line number and parsed value)
  is committed with V; the replay's rows up to V must give the same, and stdin must reach V.
  The ids alone let through tonight's dump with last night's ids in the same order (its new
  URLs never tagged, last night's results kept) and a dump shorter than what was read.
  A JSONL object is digested with its keys sorted: the same rows re-exported by another tool
  (``jq -S``) are the same rows.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from typing import Any

import msgspec

from .._exceptions import StateConflictError
from .jobs import Jobs
from .rows import RowBatch
from .rules import unkeyable
from .sinks import LineSet
from .state import POS_SHIFT, Journal, split_position
from .state.changes import STDIN_DIGEST, Change, stdin_digest
from .validate import Validator

__all__ = ["StdinDigest", "check_replayed"]


def _as_text(obj: Any) -> str:
    """A row the source refuses (a :class:`~.strays.BadRow`: its reason, a ``str`` subclass
    msgspec does not encode) digested as its text, as any row of an unparsable line is."""
    if isinstance(obj, str):
        return str(obj)
    raise NotImplementedError(type(obj))


#: The digest's encoding of a row: a JSONL object's keys sorted, so that their order, which
#: an exporter may change, is not part of the row. States of builds before it recorded the
#: digest with the keys as read (no ``:k`` after the CRC): :data:`_AS_READ` checks those.
_KEYS_SORTED = msgspec.json.Encoder(order="deterministic", enc_hook=_as_text)
_AS_READ = msgspec.json.Encoder(enc_hook=_as_text)
_SORTED_MARK = "k"
_REFUSE = "; pipe the same rows again, or run with --restart to start over"


class StdinDigest:
    """The running digest of the rows one job reads from stdin (see the module).

    ``recorded``: (V, digest of the rows up to V) that the resumed run committed, which the
    replay must match; None for a new run, or a state that recorded none (an older version)."""

    def __init__(
        self, job: int, source: int, recorded: tuple[int, int] | None, keys_sorted: bool = True
    ) -> None:
        self.job = job
        self.source = source
        self.crc = 0
        self.check = recorded
        self.last_line = 0
        # A digest recorded by an older build goes on the way it began (keys as read).
        self._sorted = keys_sorted
        self._encode_lines = (_KEYS_SORTED if keys_sorted else _AS_READ).encode_lines

    @classmethod
    async def load(cls, journal: Journal, job: int, source: int, validated: int) -> StdinDigest:
        """The digest of a job as the state recorded it (see :meth:`recorded`)."""
        text = await journal.run(journal.db.meta, f"{STDIN_DIGEST}{job}")
        return cls.recorded(job, source, validated, text)

    @classmethod
    def recorded(cls, job: int, source: int, validated: int, text: str | None) -> StdinDigest:
        """The digest of a job from its state's record ``text`` (``V:CRC``, then ``:k`` when
        the rows were encoded with JSONL keys sorted). Only one recorded at the job's V
        (``validated``) is checked, or at stdin's last row when V has gone on to a later
        manifest of the job (``run - later.csv``: every batch of stdin commits its digest
        with V, so the last one covers every row stdin gave); any other is not this run's."""
        recorded: tuple[int, int] | None = None
        keys_sorted = True
        if text and validated >= 0:
            pos, _, rest = text.partition(":")
            crc, _, mark = rest.partition(":")
            if pos.isdigit() and crc.isdigit():
                at = int(pos)
                if at == validated or (
                    at >> POS_SHIFT == source and validated >> POS_SHIFT > source
                ):
                    recorded = (at, int(crc))
                    keys_sorted = mark == _SORTED_MARK
        return cls(job, source, recorded, keys_sorted)

    def feed(self, rows: Sequence[tuple[int, Any]]) -> Change | None:
        """Take a batch's rows in; returns the change that records the digest up to its last
        row when it holds rows past the replay (None when it is all replay). Raises
        StateConflictError when the replay's rows up to the recorded V are not the rows read
        then, before any row of the batch is sent."""
        if not rows:
            return None
        self.last_line = rows[-1][0]
        rest: Sequence[tuple[int, Any]] = rows
        if self.check is not None:
            upto = split_position(self.check[0])[1]
            if rows[-1][0] <= upto:
                self.crc = zlib.crc32(self._encode_lines(list(rows)), self.crc)
                if rows[-1][0] == upto:
                    self.verify()
                return None
            replayed = [row for row in rows if row[0] <= upto]
            rest = list(rows)[len(replayed) :]
            self.crc = zlib.crc32(self._encode_lines(replayed), self.crc)
            self.verify()
        self.crc = zlib.crc32(self._encode_lines(list(rest)), self.crc)
        at = (self.source << POS_SHIFT) | rows[-1][0]
        return stdin_digest(self.job, at, self.crc, _SORTED_MARK if self._sorted else "")

    def verify(self) -> None:
        """Compare the digest of the rows replayed so far with the one recorded at V (once
        the replay has reached V)."""
        if self.check is None:
            return
        pos, crc = self.check
        if crc != self.crc:
            line = split_position(pos)[1]
            raise StateConflictError(
                "stdin does not carry the rows of the run being resumed: its first"
                f" {line:,} lines are not the rows that run read (the same ids, perhaps, with"
                " other URLs or fields: tonight's dump is a new run)" + _REFUSE
            )
        self.check = None

    def ended(self) -> None:
        """stdin ended: the replay must have reached the V it resumes from (it was verified
        there)."""
        if self.check is None:
            return
        line = split_position(self.check[0])[1]
        raise StateConflictError(
            "stdin does not carry the rows of the run being resumed: stdin ended after line"
            f" {self.last_line:,}, and that run had read up to line {line:,}" + _REFUSE
        )


async def check_replayed(
    batch: RowBatch,
    upto: int,
    validator: Validator,
    journal: Journal,
    jobs: Jobs,
    rejected: dict[int, LineSet],
) -> None:
    """Rows of stdin that a resumed run had taken in (positions <= ``upto``) are skipped by
    their line numbers, on the caller's word (``--resume``) that stdin carries the same rows
    again. Each is checked against what the run recorded of that line, and StateConflictError
    raised before any row of the batch is sent: other rows on stdin (another dump, the same
    one shifted by a line) would be skipped in place of rows never sent, lost with exit 0.

    A row with an id: the run took that id in at this very line, or wrote a reject at this
    line (the row repeated the id: a duplicate, or a bad row under an id taken; or a row an
    earlier build refused without reading its id). A row without one: the run wrote a reject
    for this line. (``rejected``: per job, the lines of stdin with a reject, from one scan of
    its rejects file, a bit a line.)"""
    job = jobs.of_source(batch.source)
    assert job is not None
    if job.id not in rejected:
        rejected[job.id] = await journal.run(job.rejects.lines_of, batch.name)
    refused = rejected[job.id]
    items, singles, rejects = validator.route(batch)
    keyed = [(ident, pos) for ident, pos, _ in items]
    keyed += [(ident, pos) for ident, pos, _ in singles]
    # An id holding a NUL, or too long, is never taken in (no store holds one): that row is
    # checked as a row without a usable id, by its reject's line.
    keyed += [(r.id, pos) for pos, r in rejects if r.id is not None and not unkeyable(r.id)]
    sent = jobs.ids.sent
    replayed = sorted((pos, ident, sent(job.id, ident)) for ident, pos in keyed if pos <= upto)
    # (An id too long that an earlier build took in at this very line is its row's: a build
    # before the limit keyed it; the intake writes the row's reject, see taken_before.)
    long = [
        (pos, sent(job.id, r.id))
        for pos, r in rejects
        if pos <= upto and r.id is not None and "\x00" not in r.id and unkeyable(r.id)
    ]
    first = await journal.run(
        journal.db.first_positions, [key for _, _, key in replayed] + [key for _, key in long]
    )
    taken_long = {pos for pos, key in long if first.get(key) == pos}
    mismatch: tuple[int, str] | None = None
    for pos, ident, key in replayed:
        recorded = first.get(key)
        line = split_position(pos)[1]
        # (At a line with a reject, the run may have read no usable id where this build reads
        # one, an earlier build's rules: the row keeps that reject, see taken_before.)
        if recorded != pos and line not in refused:
            mismatch = (pos, f"line {line} has id {ident!r}, which that run did not read there")
            break
    for pos, r in rejects:
        line = split_position(pos)[1]
        if (
            (r.id is None or unkeyable(r.id))
            and pos <= upto
            and line not in refused
            and pos not in taken_long
        ):
            if mismatch is None or pos < mismatch[0]:
                mismatch = (pos, f"line {line} has no usable id, where that run read one")
            break
    if mismatch is not None:
        raise StateConflictError(
            f"stdin does not carry the rows of the run being resumed: {mismatch[1]} (its"
            " rows would be skipped unsent); pipe the same rows again, or run with --restart"
            " to start over"
        )
