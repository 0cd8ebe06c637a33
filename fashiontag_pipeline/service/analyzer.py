"""The reference analyzer: a stand-in for a fashion model, behind the :class:`Analyzer` seam.

This is **not** a fashion model. What it does:

* **Colours are measured.** With real pixels (a fetched URL or a base64 image) the image is
  decoded with Pillow, the product is separated from a plain background (the dominant border
  colour), and the product pixels give the top 1-3 of the 18 named colours (confidence = share
  of product pixels) and ``colorDetails`` from the 2,032-colour palette (``pixelFraction``).
  The product's centroid is the tag ``position``.
* **Everything else is synthesized** deterministically from a 64-bit hash of the image content
  (the bytes, or the URL text with ``--no-fetch``): category, item, details, looks, prints,
  textures, length, sleeve length, neckline, fit, shape, shoe attributes, materials, pair index
  and gender. The same content always gives the same answer, and every rule of spec 2.3 holds.

What the store keeps per image is an :class:`Analysis`: the content hash plus, when pixels were
measured, a ~20-byte packed colour measurement. Results are rendered from it on read, so stored
images cost bytes, not kilobytes. A real model plugs in by implementing :class:`Analyzer`.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import io
import random
import struct
from collections import Counter
from typing import NamedTuple, Protocol

import aiohttp
import anyio
import msgspec

from .._models import (
    STATUS_FAILURE,
    STATUS_SUCCESS,
    ColorDetail,
    DetectedObject,
    Detection,
    ErrorInfo,
    Position,
    ScoredTag,
    Tag,
    TaggingData,
    TaggingResponse,
)
from ._synthesis import (
    ALL_DETECTIONS,
    CLOTHING_MASK,
    DETECTIONS,
    MIN_CONFIDENCE,
    NO_PRODUCT,
    SCENE_PRIMARY,
)
from ._synthesis import BIT as _BIT
from ._synthesis import OBJECT_ORDER as _OBJECT_ORDER
from .fastrender import FastRenderer
from .taxonomy import Entry, Taxonomy, load_taxonomy

__all__ = [
    "ALL_DETECTIONS",
    "CLOTHING_MASK",
    "Analysis",
    "Analyzer",
    "ImageRejected",
    "ReferenceAnalyzer",
    "detection_mask",
    "failure_response",
]


# Image checks (DESIGN section 3 error codes).
CODE_NO_PREFIX = 801
CODE_UNDECODABLE = 802
CODE_FETCH_FAILED = 803
CODE_BAD_TYPE = 804
CODE_UNSUPPORTED_FORMAT = 805
CODE_ASPECT_RATIO = 806
CODE_TOO_SMALL = 807
CODE_TOO_LARGE = 808
CODE_FILE_TOO_LARGE = 809
SUPPORTED_FORMATS = frozenset({"BMP", "GIF", "JPEG", "PNG", "TIFF", "WEBP", "MPO"})
MIN_SIDE = 16
MAX_PIXELS = 40_000_000
MAX_ASPECT = 20.0
MAX_IMAGE_BYTES = 20 * 1024 * 1024
FETCH_TIMEOUT = 15.0
_THUMB = 64

_MEASURE_HEAD = struct.Struct("<BB")
_encoder = msgspec.json.Encoder()


def detection_mask(values: list[Detection] | tuple[Detection, ...] | None, default: int) -> int:
    """Bit mask of detection values; ``default`` when none are given."""
    if not values:
        return default
    mask = 0
    for value in values:
        mask |= _BIT[value]
    return mask


class Analysis(NamedTuple):
    """What is kept of an analysed image: its content hash and packed colour measurement."""

    content_hash: int
    measured: bytes | None = None


class ImageRejected(Exception):
    """The image could not be analysed; ``code`` is the service error code (803, 805, ...)."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


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


def decode_base64_image(content: str) -> bytes:
    """Bytes of a ``data:image/<ext>;base64,`` string; :class:`ImageRejected` 801/802."""
    head, sep, payload = content.partition(",")
    if not sep or not head.startswith("data:image/") or not head.endswith(";base64"):
        raise ImageRejected(
            CODE_NO_PREFIX, "base64 content must begin with data:image/<image_ext>;base64,"
        )
    try:
        return base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise ImageRejected(CODE_UNDECODABLE, "base64 image could not be decoded") from None


# --------------------------------------------------------------------------- measurement


def _pack_measurement(
    colors: list[tuple[int, float]], details: list[tuple[int, float]], x: float, y: float
) -> bytes:
    out = bytearray(_MEASURE_HEAD.pack(len(colors), len(details)))
    for index, conf in colors:
        out += struct.pack("<BH", index, round(conf * 10000))
    for index, frac in details:
        out += struct.pack("<HH", index, round(frac * 10000))
    out += struct.pack("<BB", round(x * 200), round(y * 200))
    return bytes(out)


def _unpack_measurement(
    blob: bytes,
) -> tuple[list[tuple[int, float]], list[tuple[int, float]], float, float]:
    n_colors, n_details = _MEASURE_HEAD.unpack_from(blob, 0)
    pos = 2
    colors = []
    for _ in range(n_colors):
        index, conf = struct.unpack_from("<BH", blob, pos)
        colors.append((index, conf / 10000))
        pos += 3
    details = []
    for _ in range(n_details):
        index, frac = struct.unpack_from("<HH", blob, pos)
        details.append((index, frac / 10000))
        pos += 4
    x, y = struct.unpack_from("<BB", blob, pos)
    return colors, details, x / 200, y / 200


def measure_colors(taxonomy: Taxonomy, data: bytes) -> bytes:
    """Decode ``data`` with Pillow and measure its product colours (packed measurement)."""
    from PIL import Image as PILImage
    from PIL import UnidentifiedImageError

    if len(data) > MAX_IMAGE_BYTES:
        raise ImageRejected(
            CODE_FILE_TOO_LARGE, f"image file is larger than {MAX_IMAGE_BYTES} bytes"
        )
    try:
        with PILImage.open(io.BytesIO(data)) as img:
            fmt = (img.format or "").upper()
            if fmt not in SUPPORTED_FORMATS:
                raise ImageRejected(
                    CODE_UNSUPPORTED_FORMAT, f"image format {fmt or '?'} is not supported"
                )
            width, height = img.size
            if width < MIN_SIDE or height < MIN_SIDE:
                raise ImageRejected(CODE_TOO_SMALL, f"image is smaller than {MIN_SIDE}x{MIN_SIDE}")
            if width * height > MAX_PIXELS:
                raise ImageRejected(CODE_TOO_LARGE, f"image has more than {MAX_PIXELS} pixels")
            if max(width, height) / min(width, height) > MAX_ASPECT:
                raise ImageRejected(CODE_ASPECT_RATIO, "image aspect ratio is not supported")
            img.draft("RGB", (_THUMB * 2, _THUMB * 2))
            rgb = img.convert("RGB")
            rgb.thumbnail((_THUMB, _THUMB))
    except ImageRejected:
        raise
    except UnidentifiedImageError:
        # Pillow's text names the BytesIO it was given (an object repr): say it plainly.
        raise ImageRejected(
            CODE_UNSUPPORTED_FORMAT, "image could not be decoded: not an image Pillow can read"
        ) from None
    except (OSError, ValueError, SyntaxError) as err:
        raise ImageRejected(CODE_UNSUPPORTED_FORMAT, f"image could not be decoded: {err}") from None
    except PILImage.DecompressionBombError:
        raise ImageRejected(CODE_TOO_LARGE, "image has too many pixels") from None
    raw = rgb.tobytes()
    pixels = list(zip(raw[0::3], raw[1::3], raw[2::3], strict=True))
    return _measure_pixels(taxonomy, rgb.width, rgb.height, pixels)


def _measure_pixels(
    taxonomy: Taxonomy, width: int, height: int, pixels: list[tuple[int, int, int]]
) -> bytes:
    # Background: the dominant (coarsely quantised) colour of the border, if it dominates.
    border = pixels[:width] + pixels[-width:]
    border += [pixels[r * width] for r in range(height)]
    border += [pixels[r * width + width - 1] for r in range(height)]
    buckets = Counter((r >> 4, g >> 4, b >> 4) for r, g, b in border)
    bucket, count = buckets.most_common(1)[0]
    foreground: list[int] = list(range(len(pixels)))
    if count >= 0.6 * len(border):
        members = [p for p in border if (p[0] >> 4, p[1] >> 4, p[2] >> 4) == bucket]
        br = sum(p[0] for p in members) / len(members)
        bg = sum(p[1] for p in members) / len(members)
        bb = sum(p[2] for p in members) / len(members)
        threshold = 40 * 40 * 3
        fg = [
            i
            for i, (r, g, b) in enumerate(pixels)
            if (r - br) ** 2 + (g - bg) ** 2 + (b - bb) ** 2 > threshold
        ]
        if len(fg) >= 0.02 * len(pixels):
            foreground = fg
    total = len(foreground)
    quantised = Counter(
        (pixels[i][0] >> 3, pixels[i][1] >> 3, pixels[i][2] >> 3) for i in foreground
    )
    named: Counter[int] = Counter()
    palette: Counter[int] = Counter()
    for (qr, qg, qb), n in quantised.items():
        r, g, b = (qr << 3) + 4, (qg << 3) + 4, (qb << 3) + 4
        named[taxonomy.nearest_color(r, g, b)] += n
        palette[taxonomy.palette.nearest(r, g, b)] += n
    colors: list[tuple[int, float]] = []
    for rank, (index, n) in enumerate(named.most_common(3)):
        share = n / total
        if rank == 0:
            colors.append((index, max(share, MIN_CONFIDENCE)))
        elif share >= MIN_CONFIDENCE:
            colors.append((index, share))
    details = [(index, n / total) for index, n in palette.most_common(5) if n / total >= 0.01]
    if not details:
        index, n = palette.most_common(1)[0]
        details = [(index, n / total)]
    xs = sum(i % width for i in foreground) / total
    ys = sum(i // width for i in foreground) / total
    x = (xs + 0.5) / width
    y = (ys + 0.5) / height
    return _pack_measurement(colors, details, x, y)


# --------------------------------------------------------------------------- synthesis


class ReferenceAnalyzer:
    """The reference :class:`Analyzer`: measured colours, synthesized everything else."""

    def __init__(
        self, taxonomy: Taxonomy | None = None, *, fetch_timeout: float = FETCH_TIMEOUT
    ) -> None:
        self.taxonomy = taxonomy or load_taxonomy()
        self._fetch_timeout = fetch_timeout
        self._session: aiohttp.ClientSession | None = None
        self._fast = FastRenderer(self.taxonomy)

    # ------------------------------------------------------------------ analysis

    def from_text(self, text: str) -> Analysis:
        return Analysis(content_hash(text.encode("utf-8", "surrogatepass")))

    def from_bytes(self, data: bytes) -> Analysis:
        return Analysis(content_hash(data), measure_colors(self.taxonomy, data))

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
        measured = _unpack_measurement(analysis.measured) if analysis.measured else None
        return self._fast.render(analysis.content_hash, measured, detection, lang)

    def render(self, analysis: Analysis, detection: int, lang: int) -> TaggingResponse:
        tax = self.taxonomy
        h = analysis.content_hash
        # One generator per image: every product of the scene is synthesized in order for any
        # detection mask, so a product's tags never depend on what was asked for.
        rng = random.Random(h)
        model = rng.random() < 0.5
        gender = int(rng.random() * 3)
        groups = self._scene(rng, model)
        measured = _unpack_measurement(analysis.measured) if analysis.measured else None
        wanted: dict[str, list[Tag]] = {}
        for d in DETECTIONS:
            if detection & _BIT[d]:
                wanted.setdefault(tax.object_types[d], [])
        unmatched: dict[str, list[Tag]] = {}
        clothing_only = detection & ~CLOTHING_MASK == 0
        for slot, group in enumerate(groups):
            otype = tax.object_types[group]
            tags = self._tags(rng, slot, group, lang, measured)
            if detection & _BIT[group]:
                wanted[otype].extend(tags)
            elif clothing_only:
                unmatched.setdefault(otype, []).extend(tags)
        objects = [
            DetectedObject(type=otype, tags=wanted[otype])
            for otype in _OBJECT_ORDER
            if otype in wanted
        ]
        if not any(o.tags for o in objects):
            objects = [DetectedObject(type=NO_PRODUCT, tags=[])]
        data = TaggingData(
            imageinfo=[tax.imageinfo[1 if model else 0].id_name(lang)],
            gender_info=tax.gender[gender].id_name(lang) if model else None,
            objects=objects,
            notmatchedobjects=[
                DetectedObject(type=otype, tags=unmatched[otype])
                for otype in _OBJECT_ORDER
                if otype in unmatched
            ],
        )
        return TaggingResponse(status=STATUS_SUCCESS, data=data)

    @staticmethod
    def _scene(rng: random.Random, model: bool) -> list[Detection]:
        """The products in the image (a function of the content hash only)."""
        point = rng.random()
        if point < 0.03:
            return []
        primary = next(d for p, d in SCENE_PRIMARY if point < p)
        groups = [primary]
        if model:
            if primary is Detection.TOP and rng.random() < 0.7:
                groups.append(Detection.BOTTOM)
            elif primary is Detection.BOTTOM and rng.random() < 0.7:
                groups.append(Detection.TOP)
            for extra in (Detection.SHOES, Detection.BAG, Detection.HAT):
                if extra not in groups and rng.random() < 0.25:
                    groups.append(extra)
        return groups

    def _tags(
        self,
        rng: random.Random,
        slot: int,
        group: Detection,
        lang: int,
        measured: tuple[list[tuple[int, float]], list[tuple[int, float]], float, float] | None,
    ) -> list[Tag]:
        tax = self.taxonomy
        category = tax.categories[group][int(rng.random() * len(tax.categories[group]))]
        items = tax.items[category.id]
        item = items[int(rng.random() * len(items))]
        if measured is not None and slot == 0:
            colors = [tax.colors[i].id_name(lang) for i, _ in measured[0]]
            scored_colors = [
                ScoredTag(id=c.id, name=c.name, confidence=round(conf, 4))
                for c, (_, conf) in zip(colors, measured[0], strict=True)
            ]
            details = [tax.palette.detail(i, lang, round(f, 4)) for i, f in measured[1]]
            x, y = measured[2], measured[3]
        else:
            scored_colors, details = self._colors(rng, lang)
            x, y = 0.15 + 0.7 * rng.random(), 0.15 + 0.7 * rng.random()
        tag = Tag(
            info=[tax.info[group].id_name(lang)],
            category=category.id_name(lang),
            position=Position(x=round(x, 4), y=round(y, 4)),
            colors=scored_colors,
            color_details=details,
            item=ScoredTag(
                id=item.id, name=item.names[lang], confidence=round(0.05 + 0.94 * rng.random(), 4)
            ),
            main_materials=self._many(rng, tax.materials, lang, 1),
            sub_materials=self._many(rng, tax.materials, lang, 1, chance=0.4),
            looks=self._many(rng, tax.looks, lang, 2),
        )
        if group in (Detection.TOP, Detection.BOTTOM, Detection.WHOLEBODY, Detection.SWIMWEAR):
            tag.details = self._many(rng, tax.details, lang, 3)
            tag.prints = self._many(rng, tax.prints, lang, 1)
            tag.textures = self._many(rng, tax.textures, lang, 2, chance=0.6)
            tag.length = self._one(rng, tax.length, lang)
            tag.fit = self._one(rng, tax.fit, lang)
            tag.shape = self._one(rng, tax.shape, lang)
            if group is not Detection.BOTTOM:
                tag.sleeve_length = tax.sleeve_length[
                    int(rng.random() * len(tax.sleeve_length))
                ].id_name(lang)
                tag.neck_line = self._one(rng, tax.neck_line, lang)
        elif group is Detection.SHOES:
            tag.heel_height = self._one(rng, tax.heel_height, lang)
            tag.toe_type = self._one(rng, tax.toe_type, lang)
            tag.heel_shape = self._one(rng, tax.heel_shape, lang)
            tag.sole_type = self._one(rng, tax.sole_type, lang)
            tag.pair_index = int(rng.random() * 101)
            if rng.random() < 0.6:
                # Both shoes of a pair: same attributes and pairIndex, mirrored position.
                twin = Tag(**{f: getattr(tag, f) for f in Tag.__struct_fields__})
                assert tag.position is not None
                twin.position = Position(x=round(1.0 - tag.position.x, 4), y=tag.position.y)
                return [tag, twin]
        elif group is Detection.BAG:
            tag.shape = self._one(rng, tax.shape, lang)
            tag.details = self._many(rng, tax.details, lang, 2, chance=0.5)
        return [tag]

    def _colors(self, rng: random.Random, lang: int) -> tuple[list[ScoredTag], list[ColorDetail]]:
        tax = self.taxonomy
        n = 1 + int(rng.random() * 3)
        picks = rng.sample(range(len(tax.colors)), n)
        shares = sorted((rng.random() for _ in range(n)), reverse=True)
        total = sum(shares)
        colors = []
        for rank, (index, share) in enumerate(zip(picks, shares, strict=True)):
            conf = share / total
            if rank and conf < MIN_CONFIDENCE:
                break
            entry = tax.colors[index]
            colors.append(
                ScoredTag(
                    id=entry.id,
                    name=entry.names[lang],
                    confidence=round(max(conf, MIN_CONFIDENCE), 4),
                )
            )
        m = 1 + int(rng.random() * 4)
        remaining = 1.0
        details = []
        for _ in range(m):
            frac = remaining * (0.4 + 0.5 * rng.random())
            remaining -= frac
            index = int(rng.random() * tax.palette.size)
            details.append(tax.palette.detail(index, lang, round(frac, 4)))
        return colors, details

    @staticmethod
    def _one(rng: random.Random, entries: tuple[Entry, ...], lang: int) -> ScoredTag | None:
        # One draw gives both the entry (integer part) and the confidence (fraction).
        point = rng.random() * len(entries)
        entry = entries[int(point)]
        conf = round(point - int(point), 4)
        if conf < MIN_CONFIDENCE:
            return None
        return ScoredTag(id=entry.id, name=entry.names[lang], confidence=conf)

    @staticmethod
    def _many(
        rng: random.Random, entries: tuple[Entry, ...], lang: int, most: int, chance: float = 1.0
    ) -> list[ScoredTag]:
        if rng.random() >= chance:
            return []
        out: list[ScoredTag] = []
        seen: set[int] = set()
        for _ in range(1 + int(rng.random() * most)):
            point = rng.random() * len(entries)
            index = int(point)
            conf = round(point - index, 4)
            if index in seen or conf < MIN_CONFIDENCE:
                continue
            seen.add(index)
            entry = entries[index]
            out.append(ScoredTag(id=entry.id, name=entry.names[lang], confidence=conf))
        out.sort(key=lambda t: -(t.confidence or 0.0))
        return out
