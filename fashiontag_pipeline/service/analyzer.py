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

import aiohttp
import anyio
import msgspec

from .._models import STATUS_FAILURE, Detection, ErrorInfo, TaggingResponse
from ._synthesis import ALL_DETECTIONS, BIT, CLOTHING_MASK, scene_of
from .fastrender import FastRenderer
from .pixels import (
    CODE_BAD_TYPE,
    CODE_FETCH_FAILED,
    CODE_FILE_TOO_LARGE,
    CODE_NO_PREFIX,
    MAX_IMAGE_BYTES,
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

FETCH_TIMEOUT = 15.0
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
        self, taxonomy: Taxonomy | None = None, *, fetch_timeout: float = FETCH_TIMEOUT
    ) -> None:
        self.taxonomy = taxonomy or load_taxonomy()
        self._fetch_timeout = fetch_timeout
        self._session: aiohttp.ClientSession | None = None
        self._structs = StructRenderer(self.taxonomy)
        self._fast = FastRenderer(self.taxonomy)

    # ------------------------------------------------------------------ analysis

    def from_text(self, text: str) -> Analysis:
        return Analysis(content_hash(text.encode("utf-8", "surrogatepass")))

    def from_bytes(self, data: bytes) -> Analysis:
        h = content_hash(data)
        return Analysis(h, measure_colors(self.taxonomy, data, scene_of(h)))

    async def from_url(self, url: str) -> Analysis:
        data = await self._download(url)
        return await anyio.to_thread.run_sync(self.from_bytes, data)

    async def _download(self, url: str) -> bytes:
        if self._session is None:
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=self._fetch_timeout),
                headers={"User-Agent": "fashiontag-reference-service/0.1"},
            )
        try:
            async with self._session.get(url, allow_redirects=True) as resp:
                if resp.status != 200:
                    raise ImageRejected(CODE_FETCH_FAILED, f"image URL answered HTTP {resp.status}")
                ctype = resp.headers.get("Content-Type", "")
                if ctype and not ctype.lower().startswith(("image/", "application/octet-stream")):
                    raise ImageRejected(
                        CODE_FETCH_FAILED, f"image URL returned {ctype.split(';')[0]}, not an image"
                    )
                if (resp.content_length or 0) > MAX_IMAGE_BYTES:
                    raise ImageRejected(CODE_FILE_TOO_LARGE, "image file is too large")
                chunks: list[bytes] = []
                size = 0
                async for chunk in resp.content.iter_chunked(65536):
                    size += len(chunk)
                    if size > MAX_IMAGE_BYTES:
                        raise ImageRejected(CODE_FILE_TOO_LARGE, "image file is too large")
                    chunks.append(chunk)
                return b"".join(chunks)
        except ImageRejected:
            raise
        except TimeoutError:
            raise ImageRejected(CODE_FETCH_FAILED, "image URL timed out") from None
        except (aiohttp.ClientError, ValueError, OSError) as err:
            raise ImageRejected(
                CODE_FETCH_FAILED, f"image URL could not be fetched: {type(err).__name__}"
            ) from None

    async def aclose(self) -> None:
        session, self._session = self._session, None
        if session is not None:
            with anyio.CancelScope(shield=True):
                await session.close()

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
