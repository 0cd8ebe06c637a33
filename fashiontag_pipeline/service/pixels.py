"""Pixel measurement: the part of the reference analyzer that looks at the image.

An image's bytes (downloaded in fetch mode, or a base64 image) are checked against the service's
limits (error codes 805-809 of DESIGN section 3), decoded with Pillow and sampled (nearest
neighbour, so every sample is a real pixel) to at most 64x64. The product is separated from a
plain background (the dominant border colour) and its bounding box found. Every product of the
image's scene (:func:`._synthesis.scene_of`: which products the synthesis will report) gets its
region of that box (:func:`product_regions`), and each region's product pixels give that tag's
top 1-3 of the 18 named colours (confidence = share of the pixels), its ``colorDetails`` from
the 2,032-colour palette (``pixelFraction``, largest first) and its centroid (the tag
``position``). Colours are counted at 5 bits per channel (the measurement's resolution).

The measurements are packed into a few bytes per tag, which is what the service stores per
image; the renderers unpack them.
"""

from __future__ import annotations

import base64
import binascii
import io
import math
import struct
from collections import Counter
from collections.abc import Sequence

from .._models import Detection
from ._synthesis import MIN_CONFIDENCE
from .taxonomy import Taxonomy

__all__ = [
    "REGION_LAYOUT",
    "ImageRejected",
    "Measurement",
    "decode_base64_image",
    "measure_colors",
    "pack_measurement",
    "pack_measurements",
    "product_regions",
    "unpack_measurement",
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
_THUMB = 64

_MEASURE_HEAD = struct.Struct("<BB")
_COLOR = struct.Struct("<BH")
_DETAIL = struct.Struct("<HH")
_POSITION = struct.Struct("<BB")
#: Head of the stored form: a mark no single-measurement blob starts with (those start with
#: their colour count, 1-3), then the number of region measurements.
_REGIONS_HEAD = struct.Struct("<BB")
_REGIONS_MARK = 0x80

#: Where each product of a photo showing several (a person wearing them) sits within the
#: product's bounding box: (left, top, right, bottom) as fractions of the box.
REGION_LAYOUT: dict[Detection, tuple[float, float, float, float]] = {
    Detection.HAT: (0.2, 0.0, 0.8, 0.15),
    Detection.TOP: (0.0, 0.12, 1.0, 0.5),
    Detection.BOTTOM: (0.0, 0.45, 1.0, 0.88),
    Detection.WHOLEBODY: (0.0, 0.12, 1.0, 0.88),
    Detection.SWIMWEAR: (0.0, 0.15, 1.0, 0.7),
    Detection.SHOES: (0.0, 0.85, 1.0, 1.0),
    Detection.BAG: (0.6, 0.3, 1.0, 0.7),
    Detection.JEWELRY: (0.25, 0.08, 0.75, 0.35),
    Detection.ACCESSORY: (0.0, 0.3, 0.4, 0.6),
}

#: An unpacked measurement: named colours (index, confidence), palette details (index,
#: pixel fraction), and the centroid x, y as fractions of the width and height.
Measurement = tuple[list[tuple[int, float]], list[tuple[int, float]], float, float]


class ImageRejected(Exception):
    """The image could not be analysed; ``code`` is the service error code (803, 805, ...)."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


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


def pack_measurement(
    colors: list[tuple[int, float]], details: list[tuple[int, float]], x: float, y: float
) -> bytes:
    """One region's measurement in ~20 bytes; ``details`` kept largest pixel fraction first."""
    details = sorted(details, key=lambda d: -round(d[1] * 10000))
    out = bytearray(_MEASURE_HEAD.pack(len(colors), len(details)))
    for index, conf in colors:
        out += _COLOR.pack(index, round(conf * 10000))
    for index, frac in details:
        out += _DETAIL.pack(index, round(frac * 10000))
    out += _POSITION.pack(round(x * 200), round(y * 200))
    return bytes(out)


def pack_measurements(measurements: list[bytes]) -> bytes:
    """The stored form of an image: the measurements of its regions, in render order."""
    return _REGIONS_HEAD.pack(_REGIONS_MARK, len(measurements)) + b"".join(measurements)


def _unpack_one(blob: bytes, pos: int) -> tuple[Measurement, int]:
    # On the results hot path (every fetch-mode result is unpacked when rendered).
    n_colors, n_details = _MEASURE_HEAD.unpack_from(blob, pos)
    pos += 2
    colors = []
    for _ in range(n_colors):
        index, conf = _COLOR.unpack_from(blob, pos)
        colors.append((index, conf / 10000))
        pos += 3
    details = []
    for _ in range(n_details):
        index, frac = _DETAIL.unpack_from(blob, pos)
        details.append((index, frac / 10000))
        pos += 4
    x, y = _POSITION.unpack_from(blob, pos)
    return (colors, details, x / 200, y / 200), pos + 2


def unpack_measurement(blob: bytes) -> list[Measurement]:
    """The region measurements of a stored image, in render order (see :func:`measure_colors`).

    A blob stored before measurements were per region (one measurement of the whole product,
    first byte 1-3) unpacks to that one measurement, which the renderers use for every product.
    """
    if blob[0] != _REGIONS_MARK:
        return [_unpack_one(blob, 0)[0]]
    _, count = _REGIONS_HEAD.unpack_from(blob, 0)
    pos = _REGIONS_HEAD.size
    out = []
    for _ in range(count):
        measurement, pos = _unpack_one(blob, pos)
        out.append(measurement)
    return out


def measure_colors(taxonomy: Taxonomy, data: bytes, scene: Sequence[Detection]) -> bytes:
    """Decode ``data`` with Pillow and measure the colours of each product of ``scene`` in its
    region of the image (packed with :func:`pack_measurements`, one measurement per tag in
    render order: two for shoes, the left and the right one)."""
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
            # Nearest-neighbour sampling: every measured pixel is a pixel of the image. A
            # smoothing resize invents colours at edges (and ringing) that the image never has.
            scale = min(1.0, _THUMB / max(rgb.size))
            size = (max(1, round(rgb.width * scale)), max(1, round(rgb.height * scale)))
            if size != rgb.size:
                rgb = rgb.resize(size, PILImage.Resampling.NEAREST)
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
    return _measure_pixels(taxonomy, rgb.width, rgb.height, pixels, scene)


def _foreground(width: int, height: int, pixels: list[tuple[int, int, int]]) -> bytearray:
    """1 for a product pixel, 0 for background: the dominant (coarsely quantised) colour of the
    border is the background when it dominates; otherwise every pixel is product."""
    border = pixels[:width] + pixels[-width:]
    border += [pixels[r * width] for r in range(height)]
    border += [pixels[r * width + width - 1] for r in range(height)]
    buckets = Counter((r >> 4, g >> 4, b >> 4) for r, g, b in border)
    bucket, count = buckets.most_common(1)[0]
    if count >= 0.6 * len(border):
        members = [p for p in border if (p[0] >> 4, p[1] >> 4, p[2] >> 4) == bucket]
        br = sum(p[0] for p in members) / len(members)
        bg = sum(p[1] for p in members) / len(members)
        bb = sum(p[2] for p in members) / len(members)
        threshold = 40 * 40 * 3
        mask = bytearray(
            (r - br) ** 2 + (g - bg) ** 2 + (b - bb) ** 2 > threshold for r, g, b in pixels
        )
        if sum(mask) >= 0.02 * len(pixels):
            return mask
    return bytearray(b"\x01" * len(pixels))


def product_regions(
    scene: Sequence[Detection], box: tuple[int, int, int, int]
) -> list[tuple[int, int, int, int]]:
    """The pixel boxes (left, top, right, bottom; right and bottom exclusive) of the tags of
    ``scene`` within the product's bounding ``box``, in render order.

    A lone product fills the box; several products (a person wearing them) each take their
    :data:`REGION_LAYOUT` part of it. Shoes are two tags: the left and the right half.
    """
    x0, y0, x1, y1 = box
    w, h = x1 - x0, y1 - y0
    out = []
    for group in scene:
        if len(scene) == 1:
            left, top, right, bottom = x0, y0, x1, y1
        else:
            fl, ft, fr, fb = REGION_LAYOUT[group]
            left, top = x0 + math.floor(fl * w), y0 + math.floor(ft * h)
            right = max(left + 1, x0 + math.ceil(fr * w))
            bottom = max(top + 1, y0 + math.ceil(fb * h))
        if group is Detection.SHOES:
            mid = max(left + 1, (left + right) // 2)
            out.append((left, top, mid, bottom))
            out.append((min(mid, right - 1), top, right, bottom))
        else:
            out.append((left, top, right, bottom))
    return out


def _measure_pixels(
    taxonomy: Taxonomy,
    width: int,
    height: int,
    pixels: list[tuple[int, int, int]],
    scene: Sequence[Detection],
) -> bytes:
    mask = _foreground(width, height, pixels)
    xs = [i % width for i, m in enumerate(mask) if m]
    ys = [i // width for i, m in enumerate(mask) if m]
    box = (min(xs), min(ys), max(xs) + 1, max(ys) + 1)
    # Named and palette colour of each colour at 5 bits per channel, shared by the regions.
    lookup: dict[tuple[int, int, int], tuple[int, int]] = {}
    measurements = []
    for left, top, right, bottom in product_regions(scene, box):
        rows = range(top, bottom)
        region = [r * width + c for r in rows for c in range(left, right)]
        product = [i for i in region if mask[i]]
        # The region's product pixels; a region that is mostly background is measured whole.
        chosen = product if 10 * len(product) >= len(region) else region
        measurements.append(_measure_region(taxonomy, width, height, pixels, chosen, lookup))
    return pack_measurements(measurements)


def _measure_region(
    taxonomy: Taxonomy,
    width: int,
    height: int,
    pixels: list[tuple[int, int, int]],
    chosen: list[int],
    lookup: dict[tuple[int, int, int], tuple[int, int]],
) -> bytes:
    total = len(chosen)
    quantised = Counter((pixels[i][0] >> 3, pixels[i][1] >> 3, pixels[i][2] >> 3) for i in chosen)
    named: Counter[int] = Counter()
    palette: Counter[int] = Counter()
    for q, n in quantised.items():
        found = lookup.get(q)
        if found is None:
            r, g, b = (q[0] << 3) + 4, (q[1] << 3) + 4, (q[2] << 3) + 4
            found = lookup[q] = (taxonomy.nearest_color(r, g, b), taxonomy.palette.nearest(r, g, b))
        named[found[0]] += n
        palette[found[1]] += n
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
    x = (sum(i % width for i in chosen) / total + 0.5) / width
    y = (sum(i // width for i in chosen) / total + 0.5) / height
    return pack_measurement(colors, details, x, y)
