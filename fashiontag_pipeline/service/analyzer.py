"""The reference analyzer: a stand-in for a fashion model, behind the :class:`Analyzer` seam.

This is **not** a fashion model. What it does:

* **Colours are measured.** With real pixels (a fetched URL or a base64 image) the image is
  decoded with Pillow, the product is separated from a plain background (the dominant border
  colour), and every product reported gets the colours of its own region of the image: the top
  1-3 of the 18 named colours (confidence = share of the region's product pixels),
  ``colorDetails`` from the 2,032-colour palette (``pixelFraction``, largest first) and the
  region's centroid as the tag ``position``.
* **Everything else is synthesized** deterministically from a 64-bit hash of the image content
  (the bytes, or the URL text with ``--no-fetch``): category, item, details, looks, prints,
  textures, length, sleeve length, neckline, fit, shape, shoe attributes, materials, pair index
  and gender. The same content always gives the same answer, and every rule of spec 2.3 holds.

What the store keeps per image is an :class:`Analysis`: the content hash plus, when pixels were
measured, ~20 bytes of packed colour measurement per tag. Results are rendered from it on read,
so stored images cost bytes, not kilobytes. A real model plugs in by implementing :class:`Analyzer`.

Where the parts live: this module holds the seam and :class:`ReferenceAnalyzer` (download,
analysis, rendering entry points); :mod:`.pixels` the image checks, decoding and colour
measurement; :mod:`.render` the readable renderer of the synthesized attributes (the reference);
:mod:`.fastrender` the same responses rendered straight to JSON for the results hot path.
"""

from __future__ import annotations

import hashlib
from typing import NamedTuple, Protocol

import anyio
import msgspec

from .._models import STATUS_FAILURE, Detection, ErrorInfo, TaggingResponse
from ._synthesis import ALL_DETECTIONS, BIT, CLOTHING_MASK, scene_of
from .decoding import DecodePool
from .fastrender import FastRenderer
from .fetching import DEFAULT_FETCH_PER_HOST, FETCH_TIMEOUT, ImageFetcher
from .pixels import (
    CODE_BAD_TYPE,
    CODE_NO_PREFIX,
    ImageRejected,
    decode_base64_image,
    measure_colors,
    unpack_measurement,
)
from .render import StructRenderer
from .taxonomy import Taxonomy, load_taxonomy

__all__ = [
    "ALL_DETECTIONS",
    "CLOTHING_MASK",
    "CODE_BAD_TYPE",
    "CODE_NO_PREFIX",
    "Analysis",
    "Analyzer",
    "ImageRejected",
    "ReferenceAnalyzer",
    "decode_base64_image",
    "detection_mask",
    "failure_response",
]

_encoder = msgspec.json.Encoder()


def detection_mask(values: list[Detection] | tuple[Detection, ...] | None, default: int) -> int:
    """Bit mask of detection values; ``default`` when none are given."""
    if not values:
        return default
    mask = 0
    for value in values:
        mask |= BIT[value]
    return mask


class Analysis(NamedTuple):
    """What is kept of an analysed image: its content hash and packed colour measurement."""

    content_hash: int
    measured: bytes | None = None


class Analyzer(Protocol):
    """The seam a real model plugs into."""

    def from_text(self, text: str) -> Analysis:
        """Analysis of an image known only by its URL text (``--no-fetch``)."""
        ...

    def from_bytes(self, data: bytes) -> Analysis:
        """Analysis of image bytes; raises :class:`ImageRejected`. May run in a worker thread."""
        ...

    async def from_url(self, url: str) -> Analysis:
        """Download and analyse; raises :class:`ImageRejected` (803 when the download fails)."""
        ...

    def render(self, analysis: Analysis, detection: int, lang: int) -> TaggingResponse:
        """The tagging response of an analysed image for a detection mask and language index."""
        ...

    # Optional: ``render_json(analysis, detection, lang) -> bytes``, the JSON of ``render``
    # (the service uses it when present; see :meth:`ReferenceAnalyzer.render_json`).

    async def aclose(self) -> None:
        """Release what the analyzer holds (HTTP session). Idempotent."""
        ...


def failure_response(code: int, message: str) -> TaggingResponse:
    """A ``status: failure`` tagging response."""
    return TaggingResponse(status=STATUS_FAILURE, error=ErrorInfo(code=code, message=message))


def content_hash(data: bytes) -> int:
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")


# --------------------------------------------------------------------------- the analyzer


class ReferenceAnalyzer:
    """The reference :class:`Analyzer`: measured colours, synthesized everything else."""

    def __init__(
        self,
        taxonomy: Taxonomy | None = None,
        *,
        fetch_timeout: float = FETCH_TIMEOUT,
        fetcher: ImageFetcher | None = None,
        decode: DecodePool | None = None,
    ) -> None:
        """``fetcher``: how images are downloaded (by default public hosts only, at most
        ``DEFAULT_FETCH_PER_HOST`` connections per host); ``decode``: the pool that decodes
        them (by default anyio's worker threads). A subclass keeps both guards."""
        self.taxonomy = taxonomy or load_taxonomy()
        self._fetcher = fetcher or ImageFetcher(
            per_host=DEFAULT_FETCH_PER_HOST, timeout=fetch_timeout
        )
        self._decode = decode
        self._structs = StructRenderer(self.taxonomy)
        self._fast = FastRenderer(self.taxonomy)

    # ------------------------------------------------------------------ analysis

    def from_text(self, text: str) -> Analysis:
        return Analysis(content_hash(text.encode("utf-8", "surrogatepass")))

    def from_bytes(self, data: bytes) -> Analysis:
        h = content_hash(data)
        return Analysis(h, measure_colors(self.taxonomy, data, scene_of(h)))

    async def from_url(self, url: str) -> Analysis:
        data = await self._fetcher.download(url)
        if self._decode is not None:
            return await self._decode.analyze(self, data)
        return await anyio.to_thread.run_sync(self.from_bytes, data)

    async def aclose(self) -> None:
        await self._fetcher.aclose()

    # ------------------------------------------------------------------ rendering

    def render_json(self, analysis: Analysis, detection: int, lang: int) -> bytes:
        """``msgspec.json.encode(self.render(...))``, ~5x faster (:mod:`.fastrender`).

        A subclass that overrides :meth:`render` gets its own rendering encoded.
        """
        if type(self).render is not ReferenceAnalyzer.render:
            return _encoder.encode(self.render(analysis, detection, lang))
        measured = unpack_measurement(analysis.measured) if analysis.measured else None
        return self._fast.render(analysis.content_hash, measured, detection, lang)

    def render(self, analysis: Analysis, detection: int, lang: int) -> TaggingResponse:
        """The response as structs (:mod:`.render`, the reference for :meth:`render_json`)."""
        measured = unpack_measurement(analysis.measured) if analysis.measured else None
        return self._structs.render(analysis.content_hash, measured, detection, lang)
