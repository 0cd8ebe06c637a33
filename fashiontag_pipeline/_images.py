"""A local image file read for the single endpoint, as ``run`` (its single router) and ``tag``
read it: a regular file only, at most ``max_bytes``, its type from its magic bytes.

The file is opened without blocking and checked again through its descriptor, so a path that
is (or has just become) a FIFO, a device (``/dev/zero``) or a directory is refused, never read
for ever, and no more than ``max_bytes + 1`` bytes are ever read, whatever the file holds.
"""

from __future__ import annotations

import base64
import binascii
import errno
import os
import re
import stat
from urllib.parse import unquote

__all__ = [
    "DEFAULT_SINGLE_MAX_BYTES",
    "ImageFileError",
    "ImageFileShortage",
    "data_uri_image",
    "manifest_kind",
    "read_image_file",
    "sniff_ext",
    "spec_data_uri",
]

#: The largest local image file sent, by default (``[engine] single_max_bytes``; ``tag``).
DEFAULT_SINGLE_MAX_BYTES = 20 * 1024 * 1024

_SUFFIXES = {"jpg": "jpeg", "jpe": "jpeg", "tif": "tiff"}

#: A host name (with a dot and a top-level domain of letters; a port may follow): the first part
#: of a missing path that is an image URL written without ``https://`` (an export that drops it).
_HOST = re.compile(r"(?:[A-Za-z0-9-]+\.)+[A-Za-z]{2,24}(?::[0-9]{1,5})?")


class ImageFileError(Exception):
    """A local path that holds no image to send; the message says why and names the path."""


class ImageFileShortage(ImageFileError):
    """A local file not read for the process's lack of a resource (its limit of open files,
    the system's file table, memory): nothing is known of the file; a later read may succeed."""


#: ``errno`` values of an ``open`` or a read that fail for such a lack, not for the file.
_SHORTAGES = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOBUFS})


def spec_data_uri(uri: str) -> str:
    """A ``data:image/<ext>[;param=value...];base64,<content>`` URI (its head in any case) with
    the spec's prefix exactly, ``data:image/<ext>;base64,``: a parameter RFC 2397 allows before
    ``;base64`` (``name=front.png``, ``charset=binary``) is dropped, as a service holding to
    the prefix refuses it (801) though the image is a good one."""
    head, sep, payload = uri.partition(",")
    lowered = head.lower()
    if lowered.startswith("data:image/") and lowered.endswith(";base64") and head.count(";") > 1:
        ext = head[len("data:image/") :].split(";", 1)[0]
        return f"data:image/{ext};base64{sep}{payload}"
    return uri


#: What an exporter writes into base64 that the spec's alphabet has not: line breaks and
#: spaces (MIME's lines of 76, ``base64 FILE``), and the URL-safe alphabet's ``-`` and ``_``.
_WRAPPING = str.maketrans({" ": None, "\t": None, "\r": None, "\n": None, "-": "+", "_": "/"})


def data_uri_image(uri: str, max_bytes: int) -> str:
    """The spec's ``data:image/<ext>;base64,<content>`` of a ``data:image/`` URI (its head
    lower-cased already), its image at most ``max_bytes``: base64 wrapped in lines, spaced,
    URL-safe, unpadded or percent-encoded (RFC 2397: the URI is a URL) is the same image, sent
    in the standard alphabet, padded. Raises :class:`ImageFileError` saying why when the
    content does not decode or its image is larger than ``max_bytes``."""
    uri = spec_data_uri(uri)
    head, _, payload = uri.partition(",")
    # Refused before it is decoded (a copy of its size) when its base64 characters alone say
    # so: a line break, a space or a percent escape's two digits is no image byte.
    chars = len(payload) - sum(payload.count(c) for c in " \t\r\n") - 2 * payload.count("%")
    if chars > (max_bytes + 2) // 3 * 4:
        raise ImageFileError(f"data: URI image is larger than {max_bytes} bytes")
    try:
        data = base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        try:
            if "%" in payload:
                payload = unquote(payload, errors="strict")
            payload = payload.translate(_WRAPPING)
            payload += "=" * (-len(payload) % 4)
            data = base64.b64decode(payload, validate=True)
        except (binascii.Error, ValueError):
            raise ImageFileError("data: URI base64 content does not decode") from None
        uri = f"{head},{payload}"
    if len(data) > max_bytes:
        raise ImageFileError(f"data: URI image is larger than {max_bytes} bytes ({len(data)})")
    return uri


def sniff_ext(data: bytes, path: str) -> str:
    """The ``<ext>`` of ``data:image/<ext>;base64,``: from the magic bytes, else the suffix."""
    if data.startswith(b"\x89PNG\r\n\x1a\n"):
        return "png"
    if data.startswith(b"\xff\xd8\xff"):
        return "jpeg"
    if data.startswith((b"GIF87a", b"GIF89a")):
        return "gif"
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "webp"
    if data.startswith((b"II*\x00", b"MM\x00*")):
        return "tiff"
    if data.startswith(b"BM"):
        return "bmp"
    suffix = os.path.splitext(path)[1][1:].lower()
    if suffix.isalnum():
        return _SUFFIXES.get(suffix, suffix)
    return "octet-stream"


#: The first bytes of the images :func:`sniff_ext` knows (a file starting so is an image).
_IMAGE_MAGIC = (b"\x89PNG", b"\xff\xd8\xff", b"GIF8", b"RIFF", b"II*\x00", b"MM\x00*", b"BM")


def manifest_kind(data: bytes) -> str | None:
    """What ``data`` (a file given to ``tag``) is when it is no image but a manifest, a list
    of images for ``run`` (``fashiontag tag catalogue.csv``): a CSV whose header names a url
    column, JSON Lines, a list of URLs, or gzip-compressed. None otherwise (an image, or a
    file of no such shape: sent, the service says whether it is an image)."""
    if data.startswith(_IMAGE_MAGIC):
        return None
    if data.startswith(b"\x1f\x8b"):
        return "gzip-compressed (a manifest?)"
    first = data[:4096].removeprefix(b"\xef\xbb\xbf").split(b"\n", 1)[0].strip().lower()
    if first.startswith((b"http://", b"https://")):
        return "a list of image URLs"
    if first.startswith(b"{") and first.endswith(b"}"):
        return "JSON Lines"
    if b"url" in first and any(sep in first for sep in (b",", b";", b"\t")):
        return "a CSV of images"
    return None


def _missing(path: str) -> str:
    """The reason for a missing ``path``: when the first of its folders that does not exist is
    a host name (``www.shop.example/img/1.jpg``), it says how to write it as a URL."""
    parts = path.split("/")
    for i, name in enumerate(parts[:-1]):
        if name and not os.path.lexists("/".join(parts[: i + 1])):
            if _HOST.fullmatch(name) is not None:
                url = "https://" + "/".join(parts[i:])
                return (
                    f"local file not found: {path} (a web address? write it with its scheme: {url})"
                )
            break
    return f"local file not found: {path}"


def _check(info: os.stat_result, path: str, max_bytes: int) -> None:
    if stat.S_ISDIR(info.st_mode):
        raise ImageFileError(f"local path is a directory, not an image file: {path}")
    if not stat.S_ISREG(info.st_mode):
        raise ImageFileError(f"local path is not a regular file: {path}")
    if info.st_size > max_bytes:
        raise ImageFileError(
            f"local file is larger than {max_bytes} bytes ({info.st_size}): {path}"
        )


def read_image_file(path: str, max_bytes: int) -> bytes:
    """The bytes of the image file at ``path`` (blocking). Raises :class:`ImageFileError`
    when it is missing, unreadable, not a regular file, empty or larger than ``max_bytes``."""
    if "\x00" in path:  # (os.stat's ValueError, no OSError: a row written ahead before)
        raise ImageFileError(f"local path contains a NUL character: {path!r}")
    try:
        _check(os.stat(path), path, max_bytes)  # a device is never opened
        # Without blocking: a path made a FIFO since the stat opens at once, and its fstat
        # refuses it.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        with os.fdopen(fd, "rb") as fh:
            _check(os.fstat(fd), path, max_bytes)
            data = fh.read(max_bytes + 1)
    except FileNotFoundError:
        raise ImageFileError(_missing(path)) from None
    except OSError as err:
        kind = ImageFileShortage if err.errno in _SHORTAGES else ImageFileError
        raise kind(f"local file unreadable ({err.strerror}): {path}") from None
    if not data:
        raise ImageFileError(f"local file is empty: {path}")
    if len(data) > max_bytes:  # grew since its stat
        raise ImageFileError(f"local file is larger than {max_bytes} bytes: {path}")
    return data
