"""The spec's rules for one field of a row, and where an image that is not an http(s) URL goes.

:class:`~.validate.Validator` applies these to every row (CSV or JSONL); each rule either returns
the value as the request takes it or raises :class:`RowError` with the reason that goes into the
row's rejects line.

* ``url``: an http(s) URL with a host and no whitespace (:func:`http_url`; a scheme in capitals,
  ``HTTPS://``, is sent lower-cased); anything else raises :class:`NotHttp` so that the caller
  can route it;
* where a non-http(s) image goes (:func:`single_target`): a local path (no URL scheme; relative
  to the run's working directory), a ``file:`` URL naming an absolute path, or a
  ``data:image/<ext>;base64,<content>`` URI go to the single endpoint as a
  :class:`SingleRequest`; any other scheme is a reject;
* ``detection``: values among the nine the spec allows (:class:`DetectionRule`; CSV: separated by
  ``|``).
"""

from __future__ import annotations

import os
import re
from typing import Any
from urllib.parse import unquote, urlsplit

import msgspec

from .._models import Context, Detection, TaggingRequest

__all__ = [
    "CONTEXT_FIELDS",
    "LONG_ID",
    "MAX_ID_BYTES",
    "NUL_ID",
    "PLAIN_URL",
    "SINGLE_DATA",
    "SINGLE_FILE",
    "STAGE_CLIENT",
    "DetectionRule",
    "Item",
    "NotHttp",
    "RowError",
    "SingleItem",
    "SingleRequest",
    "age_values",
    "http_url",
    "id_error",
    "jsonl_keys",
    "merged_context",
    "number_text",
    "single_request",
    "single_target",
    "unkeyable",
]

SINGLE_FILE = "file"
SINGLE_DATA = "data"


class SingleRequest(msgspec.Struct, gc=False):
    """A row routed to the single endpoint, as written ahead to the state store.

    ``kind`` is ``file`` (``content``: an absolute path) or ``data`` (``content``: the
    ``data:image/<ext>;base64,`` URI); ``context`` is the single-mode context (``age`` a
    string); ``line`` and ``source`` locate the row for its rejects line."""

    kind: str
    content: str
    context: Context
    line: int
    source: str


#: (id, position, request): a row that passed validation. The request of a row of an id and
#: a URL alone may be its URL, a ``str`` (:mod:`.plainbody`: built as bytes when sent).
Item = tuple[str, int, TaggingRequest | str]

#: (id, position, request): a row routed to the single endpoint.
SingleItem = tuple[str, int, SingleRequest]

#: The stage of a reject the validator writes.
STAGE_CLIENT = "client"
#: An id holding a NUL: no PostgreSQL text column takes one (a state there stopped the run,
#: every night), and few consumers of the outputs would.
NUL_ID = "id contains a NUL character"
#: The longest id a row may have, in UTF-8 bytes: every id is a key of the state store, and
#: PostgreSQL's index takes none of more than 2,704 bytes (the run failed on such a row, every
#: night); the daemon adds its job's prefix, the store a few bytes of its own.
MAX_ID_BYTES = 2048
#: Characters below which no id can pass :data:`MAX_ID_BYTES` (4 bytes at most each).
MAX_ID_SAFE_CHARS = MAX_ID_BYTES // 4
LONG_ID = (
    f"id is longer than {MAX_ID_BYTES} bytes (UTF-8): no state store keys a longer id (in a URL"
    " list the id is the URL: give such images an id column in a CSV)"
)


def id_error(ident: str) -> str | None:
    """The reason a row's id is refused (:data:`NUL_ID`, :data:`LONG_ID`), None for a good one."""
    if "\x00" in ident:
        return NUL_ID
    if (
        len(ident) > MAX_ID_SAFE_CHARS
        and len(ident.encode("utf-8", "surrogatepass")) > MAX_ID_BYTES
    ):
        return LONG_ID
    return None


def unkeyable(ident: str) -> bool:
    """Whether no state store takes ``ident`` as a key (a reject of such a row holds it, and
    the dedupe never takes it in)."""
    return id_error(ident) is not None


class RowError(Exception):
    """The row breaks a rule; the message is the reject's reason."""


class NotHttp(Exception):
    """The image is not an http(s) URL: a reject in bulk-only mode, else maybe routable."""


#: Context columns (CSV header or JSONL key) -> the request's field.
CONTEXT_FIELDS = {
    "gender": "gender",
    "brand": "brand",
    "currency": "currency",
    "price": "price",
    "keywords": "keywords",
    "productContentName": "product_content_name",
    "product_content_name": "product_content_name",
    "season": "season",
}

#: The keys a JSONL row is read by, by their name in lower case: taken in any case (``ID``,
#: ``Brand``), as a CSV header's names are.
_JSONL_KEYS = {
    k.lower(): k for k in ("id", "url", "image", "context", "detection", "age", *CONTEXT_FIELDS)
}

_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*:")
#: What :func:`http_url` accepts, as one regex: http(s)://, a non-empty host (the text up to
#: the first / or ?), no whitespace anywhere (``\s`` is exactly what ``str.split()`` cuts at,
#: checked over every code point).
PLAIN_URL = re.compile(r"https?://[^/?\s]\S*")
#: A second URL after a separator (``url1|url2``: a product export's gallery column) in what
#: would pass as one URL. (An image proxy's URL holding another, ``.../fetch/https://...``,
#: has a slash or ``=`` before it: one image.) Fast paths taking URLs by :data:`PLAIN_URL`
#: send on only a block with one ``://`` a URL, the others checked here.
_JOINED = re.compile(r"([|,;])[Hh][Tt][Tt][Pp][Ss]?://")
#: The same spaced as exports write it (WooCommerce's ``url1, url2``, ``url1 | url2``, URLs
#: separated by spaces alone): told to write its space as %20, such a cell was sent as one URL.
_SPACED = re.compile(r"\s*([|,;])\s*[Hh][Tt][Tt][Pp][Ss]?://|\s+[Hh][Tt][Tt][Pp][Ss]?://")
_SEVERAL = "url holds several URLs ({}): give each image a row of its own"
_BULK_ONLY = "url must be an http:// or https:// URL (bulk mode takes URLs only)"
_BAD_SCHEME = (
    "url must be an http:// or https:// URL, a file:// URL, a data:image/<ext>;base64, URI"
    " or a local file path (scheme {scheme!r} is not supported)"
)
_BAD_DATA = "data: URI must be data:image/<ext>;base64,<content>"
_ALLOWED = {d.value: d for d in Detection}
_ALLOWED_TEXT = ", ".join(_ALLOWED)
_MAX_CACHE = 4096


def http_url(value: Any) -> str:
    """``value`` if it is an http(s) URL with a host and no whitespace (its scheme lower-cased:
    ``HTTPS://`` is sent as ``https://``); NotHttp for another kind of image (the caller may
    route it); RowError for a bad or missing URL."""
    if not isinstance(value, str) or not value:
        if isinstance(value, list) and value:  # (a JSON export's list of images)
            raise RowError(_SEVERAL.format("a JSON array"))
        raise RowError("url is missing")
    url: str = value
    if not url.startswith(("http://", "https://")):
        url = _lower_scheme(url)
        if not url.startswith(("http://", "https://")):
            if _lower_scheme(url.strip()).startswith(("http://", "https://")):  # not a file
                raise RowError("url has spaces around it (an http(s) URL holds none)")
            if url.startswith("[") and "://" in url:  # (a gallery column: a JSON array)
                raise RowError(_SEVERAL.format("a JSON array"))
            raise NotHttp(value)
    rest = url.split("://", 1)[1]
    host = rest.split("/", 1)[0].split("?", 1)[0]
    # ``str.split()`` cuts at every (Unicode) whitespace: one part equal to the value means the
    # URL holds none, checked in C rather than per character.
    if not host:
        raise RowError("url is not a valid http(s) URL")
    if url.split() != [url]:  # (a file name with a space: Blue Shirt.jpg)
        if len(url.split()) == 1:  # (a padded cell: "https://x/a.jpg ")
            raise RowError("url has spaces around it (an http(s) URL holds none)")
        if spaced := _SPACED.search(rest):
            raise RowError(_SEVERAL.format(f"separated by {spaced[1] or ' '!r}"))
        raise RowError("url holds whitespace (a space: write it as %20 in a URL)")
    if "://" in rest and (joined := _JOINED.search(rest)):
        raise RowError(_SEVERAL.format(f"separated by {joined[1]!r}"))
    return url


def _lower_scheme(value: str) -> str:
    """``value`` with an http(s) scheme written in capitals (``HTTPS://``, ``Http://``: a
    scheme is case-insensitive, RFC 3986) lower-cased, as the service's bulk endpoint takes it;
    any other value as it is."""
    head = value[:8].lower()
    for scheme in ("http://", "https://"):
        if head.startswith(scheme):
            return scheme + value[len(scheme) :]
    return value


def jsonl_keys(keys: tuple[str, ...]) -> list[tuple[str, str]] | str:
    """(key as written, name read) of each key of a JSONL object that names a read key in
    another case (``ID``: ``id``; none for the usual row); the reason of a reject when two keys
    name one field (``brand`` and ``Brand``, ``productContentName`` and
    ``product_content_name``: which holds the value would be a guess)."""
    renames: list[tuple[str, str]] = []
    seen: dict[str, str] = {}
    for key in keys:
        name = _JSONL_KEYS.get(key.lower())
        if name is None:
            continue
        first = seen.setdefault(CONTEXT_FIELDS.get(name, name), key)
        if first != key:
            return f"keys {first!r} and {key!r} name the same field: keep one"
        if key != name:
            renames.append((key, name))
    return renames


#: The keys a JSONL row's ``context`` object gives the request, each with its field's
#: spellings (``productContentName``, ``product_content_name``).
_CONTEXT_KEYS = [
    (key, [k for k, f in CONTEXT_FIELDS.items() if f == CONTEXT_FIELDS.get(key, key)] or [key])
    for key in ("id", "detection", "age", *CONTEXT_FIELDS)
]


#: Field values that give nothing (what :func:`merged_context` takes for no value).
_EMPTY: tuple[Any, ...] = (None, "", [])


def merged_context(row: dict[str, Any], context: dict[str, Any]) -> dict[str, Any]:
    """The fields of a JSONL row and of its ``context`` object, as one object: a field given in
    only one place is taken from there; one given in both with two values is a RowError
    (which was meant would be a guess). An empty field (``""``, ``[]``: an export writing
    every column) is given nowhere, as it sends nothing."""
    merged = dict(row)
    for key, spellings in _CONTEXT_KEYS:
        value = context.get(key)
        if value is None or value == "" or value == []:
            continue
        given = [merged[k] for k in spellings if merged.get(k) not in _EMPTY]
        if not given:
            merged[key] = value
        elif given[0] != value and _text(given[0]) != _text(value):  # (5 and "5" agree)
            raise RowError(
                f"{key} is given both in the row and in its context object, with different"
                " values: keep one"
            )
    return merged


def age_values(value: str | list[str]) -> list[str] | None:
    """``age`` as a bulk request takes it (an array of strings): a text is its values separated
    by ``|`` (a CSV cell, a JSONL string alike), a list its items; each value without the
    spaces around it, an empty one dropped; None when none is left (an empty field sends
    nothing)."""
    parts = value.split("|") if isinstance(value, str) else value
    return [p.strip() for p in parts if p.strip()] or None


def number_text(value: Any) -> str | None:
    """The text of a JSON number (an int in decimal, a float as its shortest round-trip text:
    :mod:`.jsonnums`); None for any other value (a bool is no number)."""
    kind = type(value)
    if kind is int:
        return str(value)  # (msgspec reads no integer longer than str() writes)
    if kind is float:
        return repr(value)
    return None


def _text(value: Any) -> Any:
    """``value``, a number as its text."""
    text = number_text(value)
    return value if text is None else text


#: A URL written without its scheme (``//cdn.example.com/x.jpg``: a storefront theme's, meant to
#: take the page's): its host, a name with a dot. Never a local path anyone writes.
_SCHEME_RELATIVE = re.compile(r"//[^/\s.]+\.[^/\s]+/")
_NO_SCHEME = (
    "url has no scheme (//host/...: a scheme-relative URL): write it with its scheme,"
    " https://host/..."
)


#: A host and port written without the scheme (``cdn.example.com:8443/x.jpg``), which would
#: otherwise read as a URL of the scheme ``cdn.example.com``.
_HOST_PORT = re.compile(
    r"(?:localhost|[0-9]{1,3}(?:\.[0-9]{1,3}){3}|(?:[A-Za-z0-9-]+\.)+[A-Za-z]{2,24}):[0-9]{1,5}(?:/|$)"
)


#: An http(s) scheme without its two slashes (``http:/host``, ``https:host``) or its colon
#: (``https//host``), which would read as another scheme or a local path.
_MISTYPED = re.compile(r"(?i:https?)(?::/?(?!/)|//)")


def single_target(value: str, route: bool, cwd: str) -> tuple[str, str]:
    """(kind, content) of a non-http(s) image that can go to the single endpoint; RowError
    when it cannot (or when ``route`` is off: bulk-only validation)."""
    if _SCHEME_RELATIVE.match(value) is not None:
        raise RowError(_NO_SCHEME)
    if _MISTYPED.match(value) is not None:  # (http:/host, https:host, https//host)
        raise RowError(
            "url is not a valid http(s) URL: its scheme is mistyped (write it http:// or"
            " https://, a colon and two slashes, before the host)"
        )
    if _HOST_PORT.match(value) is not None:
        raise RowError(
            f"url has no scheme (host:port/...): write it with its scheme, https://{value}"
        )
    if not route:
        raise RowError(_BULK_ONLY)
    if value[:5].lower() == "data:":
        head, sep, payload = value.partition(",")
        if not head.startswith("data:image/") or not head.endswith(";base64"):
            # Its scheme, media type and ;base64 in any case (RFC 2397): sent lower-cased.
            head = head.lower()
            value = head + sep + payload
        ext = head[len("data:image/") : -len(";base64")]
        if (
            not sep
            or not payload
            or not head.startswith("data:image/")
            or not head.endswith(";base64")
            or not ext
            or "/" in ext
        ):
            raise RowError(_BAD_DATA)
        return SINGLE_DATA, value
    if "\x00" in value:
        raise RowError("local path contains a NUL character")
    if value[:5].lower() == "file:":
        parts = urlsplit(value)
        path = unquote(parts.path)
        if parts.netloc not in ("", "localhost") or not path.startswith("/"):
            raise RowError("file URL must name an absolute local path (file:///path)")
        if "\x00" in path:  # (%00: no file's name holds one)
            raise RowError("file URL's path contains a NUL character (%00)")
        return SINGLE_FILE, path
    scheme = _SCHEME.match(value)
    if scheme is not None:
        if len(scheme.group()) == 2 and value[2:3] in ("\\", "/"):  # C:\images\a.jpg
            raise RowError(
                f"url is a Windows path ({value[:3]}...), no path on this machine: give the"
                " image's path here, or an http(s) URL"
            )
        raise RowError(_BAD_SCHEME.format(scheme=scheme.group()[:-1]))
    return SINGLE_FILE, os.path.join(cwd, value)


def single_request(
    target: tuple[str, str], ident: str, kwargs: dict[str, Any], line: int, name: str
) -> SingleRequest:
    """The single-endpoint request of a routed row (its context's ``age`` joined by commas)."""
    age = kwargs.pop("age", None)
    context = Context(id=ident, age=",".join(age) if age else None, **kwargs)
    return SingleRequest(target[0], target[1], context, line, name)


class DetectionRule:
    """``detection`` values, checked against the spec's nine (CSV text parsed once per
    distinct value: manifests repeat a handful of them)."""

    def __init__(self) -> None:
        self._cache: dict[str, list[Detection]] = {}

    def __call__(self, value: Any) -> list[Detection] | None:
        if value is None or value == "":
            return None
        if isinstance(value, str):
            cached = self._cache.get(value)
            if cached is not None:
                return cached
            parts = [p.strip() for p in value.split("|")]
            try:
                out = self._values([p for p in parts if p])
            except RowError:
                if "," not in value and ";" not in value:
                    raise
                # ``TOP,SHOES``, as ``--detection`` takes them: say the separator, once every
                # value is known (an unknown one is named first).
                values = [p.strip() for p in re.split(r"[|,;]", value) if p.strip()]
                good = "|".join(d.value for d in self._values(values))
                raise RowError(
                    f"detection {value!r}: in a manifest its values are separated by |, not by"
                    f" commas or semicolons: write {good}"
                ) from None
            if len(self._cache) < _MAX_CACHE:
                self._cache[value] = out
            return out
        if isinstance(value, list):
            return self._values(value)
        raise RowError("detection must be a list of strings (CSV: values separated by |)")

    @staticmethod
    def _values(values: list[Any]) -> list[Detection]:
        out: list[Detection] = []
        for v in values:
            if not isinstance(v, str):
                raise RowError("detection values must be strings")
            d = _ALLOWED.get(v.strip().upper())
            if d is None:
                raise RowError(f"invalid detection value {v!r} (allowed: {_ALLOWED_TEXT})")
            if d not in out:
                out.append(d)
        return out
