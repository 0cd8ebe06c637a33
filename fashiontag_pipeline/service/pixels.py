"""Pixel measurement: the part of the reference analyzer that looks at the image.

An image's bytes (downloaded in fetch mode, or a base64 image) are checked against the service's
limits (error codes 805-809 of DESIGN section 3), decoded with Pillow at thumbnail size, and
measured: the product is separated from a plain background (the dominant border colour), and
the product pixels give the top 1-3 of the 18 named colours (confidence = share of product
pixels), ``colorDetails`` from the 2,032-colour palette (``pixelFraction``) and the product's
centroid (the tag ``position``). The measurement is packed into a few bytes, which is what the
service stores per image; the renderers unpack it.
"""

from __future__ import annotations

import base64
import binascii
import io
import struct
from collections import Counter

from ._synthesis import MIN_CONFIDENCE
from .taxonomy import Taxonomy

__all__ = [
    "ImageRejected",
    "Measurement",
    "decode_base64_image",
    "measure_colors",
    "pack_measurement",
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
    out = bytearray(_MEASURE_HEAD.pack(len(colors), len(details)))
    for index, conf in colors:
        out += struct.pack("<BH", index, round(conf * 10000))
    for index, frac in details:
        out += struct.pack("<HH", index, round(frac * 10000))
    out += struct.pack("<BB", round(x * 200), round(y * 200))
    return bytes(out)


def unpack_measurement(
    blob: bytes,
) -> Measurement:
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
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError) as err:
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
    return pack_measurement(colors, details, x, y)
