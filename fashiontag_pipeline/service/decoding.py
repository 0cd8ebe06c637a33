"""Image decoding off the event loop: a bounded thread pool and a budget of decoded pixels.

Every base64 or fetched image is decoded in one of ``workers`` threads, whatever its size (a
113 KB PNG can hold 40 million pixels). Before a decode starts, the image's header is read to
learn how many pixels decoding will produce (a JPEG is decoded at 1/8 scale, other formats in
full), and that many are reserved from a shared budget of :data:`PIXEL_BUDGET`; a decode waits
until its pixels fit, so the memory all decodes take together stays bounded.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

import anyio
import anyio.to_thread

from .pixels import MAX_PIXELS

if TYPE_CHECKING:
    from .analyzer import Analysis, Analyzer

__all__ = ["PIXEL_BUDGET", "DecodePool", "decoded_pixels"]

T = TypeVar("T")

#: Decoded pixels in flight at once, service-wide: one image at the pixel cap, or many small ones.
PIXEL_BUDGET = MAX_PIXELS
_DRAFT_FORMATS = frozenset({"JPEG", "MPO"})
_JPEG_MIN_SCALE = 8


def decoded_pixels(data: bytes) -> int:
    """Pixels decoding ``data`` will produce, from its header alone (0 when unreadable: the
    analyzer rejects it without decoding)."""
    from PIL import Image as PILImage

    try:
        with PILImage.open(io.BytesIO(data)) as img:
            width, height = img.size
            fmt = (img.format or "").upper()
    except Exception:
        return 0
    pixels = width * height
    if fmt in _DRAFT_FORMATS:
        # draft() picks the largest 1/2, 1/4 or 1/8 scale still above the thumbnail: at most
        # the full image, usually 1/64 of it.
        pixels = max(pixels // (_JPEG_MIN_SCALE * _JPEG_MIN_SCALE), min(pixels, 128 * 128))
    return pixels


class DecodePool:
    """``workers`` decode threads and the shared pixel budget (see the module docstring)."""

    def __init__(self, workers: int, *, pixel_budget: int = PIXEL_BUDGET) -> None:
        self._limiter = anyio.CapacityLimiter(workers)
        self._budget = pixel_budget
        self._in_flight = 0
        self._released = anyio.Event()

    async def run_sync(self, func: Callable[..., T], *args: object) -> T:
        """``func(*args)`` in a pool thread (for CPU work that is not a pixel decode)."""
        return await anyio.to_thread.run_sync(func, *args, limiter=self._limiter)

    async def analyze(self, analyzer: Analyzer, data: bytes) -> Analysis:
        """``analyzer.from_bytes(data)`` in a pool thread once its pixels fit the budget."""
        # Past the cap the analyzer refuses it from its header (808) without decoding.
        cost = min(await self.run_sync(decoded_pixels, data), self._budget)
        while self._in_flight and self._in_flight + cost > self._budget:
            await self._released.wait()
        self._in_flight += cost
        try:
            return await self.run_sync(analyzer.from_bytes, data)
        finally:
            self._in_flight -= cost
            self._released.set()
            self._released = anyio.Event()
