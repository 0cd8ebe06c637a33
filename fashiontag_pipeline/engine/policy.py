"""The task writer's data and pure decisions: chunks, open tasks, and :class:`WritePolicy`.

:class:`WritePolicy` answers, from the engine config and a time ``now`` passed in, when a
partial chunk is due, whether a task may still take a write (never later than
``taskExpiredAt - expiry_margin``), when a task is full (rotation: ``rotate_min_images`` for
the first tasks, then ``rotate_fraction`` of the images sent before it, capped by
``rotate_images``, and at most ``rotate_seconds`` old) and when to seal it. Being pure, it is
tested with a fake clock (``tests/engine/test_policy.py``). A chunk's body, as written ahead to
the state store, is ``{"p": [positions], "r": [requests]}`` in JSON (:func:`encode_body`), and
the ``r`` bytes are what the bulk write sends: each request is encoded once.
"""

from __future__ import annotations

import operator
from collections import deque
from collections.abc import Iterable, Sequence
from typing import Any

import anyio
import msgspec

from .._models import EncodedRequests, TaggingRequest
from .config import EngineConfig
from .plainbody import encode_requests

__all__ = [
    "HOLD_LINGERS",
    "MAX_CHUNK_BYTES",
    "Chunk",
    "OpenTask",
    "WritePolicy",
    "body_ids",
    "chunk_cut",
    "chunk_of",
    "decode_body",
    "decode_chunk",
    "decode_ids",
    "encode_body",
    "encode_ids",
    "halves",
]

_body_encoder = msgspec.json.Encoder()
_requests_decoder = msgspec.json.Decoder(list[TaggingRequest])
_old_body_decoder = msgspec.json.Decoder(list[tuple[int, TaggingRequest]])


class _Body(msgspec.Struct):
    p: list[int]
    r: msgspec.Raw
    #: Times its rows were sent before this chunk (absent in a chunk of new rows).
    g: int = 0


_body_decoder = msgspec.json.Decoder(_Body)


class _SentContext(msgspec.Struct, gc=False):
    id: str


class _SentRequest(msgspec.Struct, gc=False):
    context: _SentContext


class _SentBody(msgspec.Struct, gc=False):
    r: list[_SentRequest]


#: A stored body's ids alone: msgspec skips the positions and the images.
_ids_decoder = msgspec.json.Decoder(_SentBody)


def encode_body(
    positions: Sequence[int],
    requests: Sequence[TaggingRequest | str],
    sends: int = 0,
    ids: Sequence[str] | None = None,
    ids_json: bytes | None = None,
) -> tuple[bytes, EncodedRequests]:
    """A chunk as stored ahead of its write, ``{"p": [positions], "r": [requests]}`` (and
    ``"g": sends`` for rows sent ``sends`` times before), and its requests as the bulk write
    sends them: each request is encoded once, for both. ``ids``: the requests' ids, given
    when some may be plain rows' URLs (:mod:`.plainbody`), with their encoding
    (:func:`encode_ids`) when the caller has it."""
    if ids is None:
        encoded = _body_encoder.encode(requests)
    else:
        encoded = encode_requests(ids, requests, ids_json)
    tail = b',"g":%d}' % sends if sends else b"}"
    # One join: each ``+`` copied everything before it again (the requests twice).
    body = b"".join((b'{"p":', _body_encoder.encode(positions), b',"r":', encoded, tail))
    return body, EncodedRequests(msgspec.Raw(encoded), len(requests))


def encode_ids(ids: Sequence[str]) -> bytes:
    """A chunk's ids as stored beside its body (a JSON list: ~16 bytes a row against ~120
    for the body, read back with :func:`decode_ids` without skipping over the requests)."""
    return _body_encoder.encode(ids)


#: The ids stored by :func:`encode_ids`.
decode_ids = msgspec.json.Decoder(list[str]).decode


def decode_chunk(body: bytes) -> tuple[int, list[tuple[int, TaggingRequest]]]:
    """A stored chunk (either format), in one pass: how many times its rows were sent before
    it (0: new rows), and its (position, request) rows."""
    if body[:1] == b"[":  # written by a version that stored [[position, request], ...]
        return 0, _old_body_decoder.decode(body)
    stored = _body_decoder.decode(body)
    return stored.g, list(zip(stored.p, _requests_decoder.decode(stored.r), strict=True))


def decode_body(body: bytes) -> list[tuple[int, TaggingRequest]]:
    """The (position, request) rows of a stored chunk (either format)."""
    return decode_chunk(body)[1]


def body_ids(body: bytes) -> list[str]:
    """The ids (as sent) of a stored chunk, decoding nothing else of it."""
    if body[:1] == b"[":
        return [request.context.id for _, request in _old_body_decoder.decode(body)]
    return [request.context.id for request in _ids_decoder.decode(body).r]


def chunk_of(chunk_id: int, body: bytes) -> Chunk:
    """A stored chunk, ready to be sent again (a resume)."""
    sends, rows = decode_chunk(body)
    requests = [r for _, r in rows]
    encoded = _body_encoder.encode(requests)
    return Chunk(
        chunk_id,
        [r.context.id for r in requests],
        [p for p, _ in rows],
        EncodedRequests(msgspec.Raw(encoded), len(requests)),
        sends=sends,
    )


def halves(chunk: Chunk) -> list[tuple[Chunk, bytes]]:
    """The chunk's rows in two chunks (ids 0 until written ahead), each with its body to store:
    a write refused whole (too large, or one element the service will not name) is split."""
    requests = _requests_decoder.decode(chunk.requests.raw)
    half = (len(requests) + 1) // 2
    out = []
    for lo, hi in ((0, half), (half, len(requests))):
        body, encoded = encode_body(chunk.positions[lo:hi], requests[lo:hi], chunk.sends)
        out.append(
            (Chunk(0, chunk.ids[lo:hi], chunk.positions[lo:hi], encoded, sends=chunk.sends), body)
        )
    return out


#: A task held open for more of a daemon's burst is sealed at most this many ``linger_seconds``
#: past its first rows (or its create's answer, if later), however closely the burst's
#: manifests keep coming.
HOLD_LINGERS = 3


class OpenTask(msgspec.Struct, eq=False):
    """A task the writer may still write to (or is sealing)."""

    seq: int
    token: str
    opened: float
    expires: float
    task_id: str | None = None
    #: When its create was answered (None: not yet, or not created by this writer).
    answered: float | None = None
    images: int = 0
    inflight: int = 0
    closing: bool = False
    sealed: bool = False
    failed: bool = False
    #: Images after which the task is full (None: ``rotate_images``).
    limit: int | None = None
    created: anyio.Event = msgspec.field(default_factory=anyio.Event)
    #: The coarse keys of the ids sent to it (:mod:`.idkeys`: no two ids of one key).
    keys: set[str] = msgspec.field(default_factory=set)


class Chunk(msgspec.Struct, eq=False):
    """Up to ``chunk_size`` requests, written ahead under ``chunk_id``."""

    chunk_id: int
    ids: list[str]
    positions: list[int]
    requests: EncodedRequests
    fate_unknown: bool = False
    task_id: str | None = None
    #: Times its rows were sent before (kept in its body).
    sends: int = 0
    #: Refused whole before any write of the run was taken: why (it waits for one to be).
    waiting: str | None = None
    #: Sent while another part of its chunk waits: refused, it waits too rather than split.
    hold: bool = False
    #: Every row is of one manifest, found when the chunk was cut (False: not known), so that
    #: its rows are counted per job without a pass over its positions (:mod:`.answers`).
    one_source: bool = False


class WritePolicy:
    """The writer's decisions, pure functions of the config and a time ``now``."""

    def __init__(self, config: EngineConfig) -> None:
        # A chunk goes whole to one task: one larger than ``rotate_images`` overfilled it.
        self.chunk_size = min(config.chunk_size, config.rotate_images)
        self.rotate_images = config.rotate_images
        self.rotate_min_images = min(config.rotate_min_images, config.rotate_images)
        self.rotate_fraction = config.rotate_fraction
        self.rotate_seconds = config.rotate_seconds
        self.margin = config.expiry_margin
        self.linger = config.linger_seconds

    def write_deadline(self, task: OpenTask) -> float:
        """The last moment a write to ``task`` may start."""
        return task.expires - self.margin

    def writable(self, task: OpenTask, now: float) -> bool:
        """True while a write to the task may still start (before expiry - margin)."""
        return not task.failed and now < self.write_deadline(task)

    def task_limit(self, sent_before: int) -> int:
        """Images a new task may hold when ``sent_before`` images went to earlier tasks of the
        run: ``rotate_fraction`` of them, at least ``rotate_min_images``, at most
        ``rotate_images`` (see :class:`~.config.EngineConfig`)."""
        grown = int(sent_before * self.rotate_fraction)
        return max(self.rotate_min_images, min(grown, self.rotate_images))

    def limit_of(self, task: OpenTask) -> int:
        return self.rotate_images if task.limit is None else task.limit

    def full(self, task: OpenTask) -> bool:
        """True when no further chunk may go to the task (seal it now, not at the next chunk)."""
        return task.images >= self.limit_of(task)

    def usable(self, task: OpenTask, now: float, n: int) -> bool:
        """True when a new chunk of ``n`` rows may go to ``task`` (not rotated, not expiring)."""
        if task.closing or not self.writable(task, now):
            return False
        if now - task.opened >= self.rotate_seconds:
            return False
        return task.images == 0 or task.images + n <= self.limit_of(task)

    def flush_at(self, buffered: int, since: float, task: OpenTask | None) -> float:
        """When the buffered rows (oldest arrived at ``since``) must be sent."""
        if buffered >= self.chunk_size:
            return since
        if buffered == 0:
            return float("inf")
        due = since + self.linger
        if task is not None and not task.closing and task.task_id is not None:
            # Flush while the open task still takes writes, so a slow producer never meets
            # an expired task (the write itself extends the expiry).
            guard = max(min(self.linger, self.margin) / 2, 0.01)
            due = min(due, self.write_deadline(task) - guard)
        return due

    def close_at(self, task: OpenTask | None, buffered: int) -> float:
        """When the open task should be sealed: rotation age, or expiry with nothing to write."""
        if task is None or task.closing or task.task_id is None:
            return float("inf")
        age = task.opened + self.rotate_seconds
        if buffered == 0:
            return min(age, self.write_deadline(task))
        return age

    def held_until(self, task: OpenTask, rows_at: float, bounded: bool = True) -> float:
        """When a task held open for more of a daemon's burst (rows last came at ``rows_at``)
        is sealed: ``linger`` after its last rows, and at most :data:`HOLD_LINGERS` ``linger``
        past its first (a trickle of manifests closer than ``linger`` held it until rotated,
        30 s, and the first manifest's results waited as long) or past its create's answer:
        while the create is unanswered (a 429 of a live-task cap waited out) no result can
        come sooner for the hold, and a bound spent meanwhile gave the burst's next rows a
        second task, a create the cap refused until the first task expired. Not ``bounded``
        (a manifest's rows in hand: a burst dropped at once, read longer than the bound), as
        long as rows keep coming: the rest of the burst in a second task met the same cap."""
        linger = self.linger
        quiet = max(task.opened, rows_at) + linger
        if task.answered is None or not bounded:
            return quiet
        return min(quiet, max(task.opened, task.answered) + HOLD_LINGERS * linger)

    def split(self, buffered: int) -> list[int]:
        """Sizes of the full chunks to cut from ``buffered`` rows."""
        return [self.chunk_size] * (buffered // self.chunk_size)


#: The most characters of requests (ids, image URLs and context fields: :func:`text_size`)
#: one chunk carries (besides ``chunk_size`` requests). Chunks were cut by count alone: 1,000
#: rows of 250 KB URLs made a 250 MB chunk, held in the buffer, encoded, written ahead and sent
#: by each write slot at once (2.2 GB peak RSS for a 500 MB manifest), and then by their URLs
#: alone: 1,000 rows of 50 KB keywords or ids, 407 MB; a chunk past the service's body limit is
#: refused and split anyway. (Under 1 MB, past which aiohttp warns that sending a body may
#: block the event loop; a chunk of the common ~100-byte rows is ~0.1 MB, never cut by it.)
MAX_CHUNK_BYTES = 512 << 10


class Measured(list[Any]):
    """Items whose requests are known to hold at most ``size`` characters (:func:`text_size`),
    measured where it cost nothing (the validator's block of plain lines has their text);
    ``columns``: their ids and positions, when the block built the items from them."""

    __slots__ = ("columns", "size")

    def __init__(self, items: Iterable[Any], size: int, columns: Any = None) -> None:
        super().__init__(items)
        self.size = size
        self.columns: tuple[Sequence[str], Sequence[int]] | None = columns


def batch_size(items: Sequence[Any]) -> int:
    """At least the :func:`text_size` of ``items`` together: as measured (:class:`Measured`),
    else the length of their requests' JSON, encoded in C (~90 ns an item; every string at
    least as long as its characters), and of their ids (a plain row's request is its URL alone:
    :mod:`.plainbody`)."""
    known: int | None = getattr(items, "size", None)
    if known is not None:
        return known
    return len(_body_encoder.encode(list(map(_request, items)))) + sum(map(len, map(_id, items)))


def text_size(request: TaggingRequest) -> int:
    """The characters of a request's strings: its URL, its id and its context fields (what
    may be long in a manifest's row; the JSON around them is ~60 bytes a request)."""
    context = request.context
    size = len(request.image.content) + len(context.id)
    for value in (
        context.gender,
        context.brand,
        context.currency,
        context.price,
        context.keywords,
        context.product_content_name,
        context.season,
    ):
        if value:
            size += len(value)
    if context.age:
        size += sum(map(len, context.age))
    return size


class ChunkCutter:
    """Where the task writer's buffer is cut into chunks: every ``size`` requests, or sooner
    when their :func:`text_size` passes ``max_bytes`` (at least one request a chunk).

    The size of each batch added is known (a :class:`Measured` batch's, at no cost; any other
    is measured once, in C), and the buffer's bound is the sum of the batches still in it,
    a batch counted whole until its last item leaves (an upper bound). While it is within
    ``max_bytes`` the buffer is cut by count alone; past it, the next chunk's requests are
    measured, and only those that really hold that much (long URLs, ids or context fields)
    are cut item by item (measured only when the batches they are in pass the limit).
    Measuring every chunk item by item cost ~700 instructions an image
    (~1.3% of the engine's CPU); measuring the whole buffer at each cut once its bound passed
    the limit cost three times what the cut by URLs alone did."""

    __slots__ = ("batches", "bound", "max_bytes", "size")

    def __init__(self, size: int, max_bytes: int = MAX_CHUNK_BYTES) -> None:
        self.size = size
        self.max_bytes = max_bytes
        self.bound = 0
        #: [items left in the buffer, size] of each batch in it, oldest first.
        self.batches: deque[list[int]] = deque()

    def added(self, items: Sequence[Any]) -> None:
        size = batch_size(items)
        self.batches.append([len(items), size])
        self.bound += size

    def emptied(self) -> None:
        self.bound = 0
        self.batches.clear()

    def _head_bound(self) -> int:
        """An upper bound of the next chunk's size: the batches its requests are in."""
        covered = bound = 0
        for count, size in self.batches:
            covered += count
            bound += size
            if covered >= self.size:
                break
        return bound

    def cut(self, buffer: list[Any]) -> int:
        """How many items from the front of ``buffer`` make a full chunk (the caller takes
        them off); 0: none yet."""
        n = self.size if len(buffer) >= self.size else 0
        limit = self.max_bytes
        if (
            self.bound > limit
            and self._head_bound() > limit
            and batch_size(buffer[: self.size]) > limit
        ):
            n = chunk_cut(buffer, self.size, limit)
        left = n
        batches = self.batches
        while left and batches:
            first = batches[0]
            if first[0] > left:
                first[0] -= left
                break
            left -= first[0]
            self.bound -= first[1]
            batches.popleft()
        return n


def chunk_cut(buffer: list[Any], size: int, max_bytes: int) -> int:
    """How many items from the front of ``buffer`` make a full chunk (``size`` requests, or
    the most, at least one, whose :func:`text_size` stays within ``max_bytes``); 0 when they
    make none yet."""
    total = 0
    for i, item in enumerate(buffer[:size]):
        total += item_size(item)
        if total > max_bytes:
            return max(i, 1)
    return size if len(buffer) >= size else 0


def item_size(item: tuple[str, int, TaggingRequest | str]) -> int:
    """The :func:`text_size` of an item's request (a plain row's: its URL and id)."""
    request = item[2]
    if type(request) is str:
        return len(request) + len(item[0])
    assert isinstance(request, TaggingRequest)
    return text_size(request)


_request = operator.itemgetter(2)
_id = operator.itemgetter(0)
