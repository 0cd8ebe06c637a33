"""Secrets out of aiohttp's errors: the request an error keeps (``request_info``) shows every
header sent and the URL in its repr, which an error reporter records."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Iterable

    from yarl import URL

# aiohttp is imported when an error is scrubbed, never here: ``_http`` imports it under
# ``_tls.deferred_trust_store`` (its SSL contexts load their trust store on first use), and
# this module is imported before that.

__all__ = [
    "credential_forms",
    "mask_location",
    "mask_secrets",
    "scrub_request_info",
    "secret_forms",
]

_MASK = "********"
#: Request headers that carry a secret: the API key, and the ``Authorization: Basic`` header
#: aiohttp makes of a base URL's ``user:password@`` (a secret too: ``shown_url``).
_SECRET_HEADERS = ("x-api-key", "Authorization", "Proxy-Authorization")


def secret_forms(values: Iterable[str]) -> tuple[bytes, ...]:
    """The byte strings an answer may echo ``values`` (the keys sent) as: UTF-8, and as a JSON
    string holds them (escaped; ``/`` as ``\\/`` too, as PHP's ``json_encode`` writes it: a
    base64 key holds some), as a URL's query holds them (percent-encoded: a redirect's
    ``Location``), longest first (a key that holds another is masked whole). A key with white
    space around it (an env file's) is read by the service without it."""
    from urllib.parse import quote

    import msgspec

    keys = {k for v in values for k in (v, v.strip()) if k}
    escaped = {msgspec.json.encode(k)[1:-1] for k in keys}
    escaped |= {form.replace(b"/", b"\\/") for form in escaped}
    escaped |= {_u_escaped(form, *way) for form in escaped for way in _U_ESCAPES}
    forms = {k.encode("utf-8", "replace") for k in keys} | escaped
    forms |= {quote(k, safe=safe).encode() for k in keys for safe in ("", "/")}
    return tuple(sorted(forms, key=len, reverse=True))


#: How JSON encoders write characters as ``\\u00XX`` that msgspec writes as they are: (those
#: characters, the digits' case, whether every non-ASCII one too). System.Text.Json's default
#: (ASP.NET Core: ``+`` as ``\\u002B``, a base64 key's), Go's (``<``, ``>``, ``&``), Python's
#: and PHP's (non-ASCII).
_U_ESCAPES = (("+`<>&'\"", "%04X", True), ("<>&", "%04x", False), ("", "%04x", True))


def _u_escaped(form: bytes, chars: str, digits: str, non_ascii: bool) -> bytes:
    text = form.decode("utf-8", "surrogateescape").replace('\\"', '"')
    out = [
        "\\u" + digits % ord(c) if c in chars or (non_ascii and 0x7F < ord(c) < 0x10000) else c
        for c in text
    ]
    return "".join(out).replace('"', '\\"').encode("utf-8", "surrogateescape")


def basic_secrets(authorization: str) -> list[str]:
    """The secrets of an ``Authorization: Basic`` header (a base URL's ``user:password@``, a
    proxy's): its token, and the password in it (the user given alone: a token), which an
    error page that quotes the request's headers would show. A password shorter than 4
    characters is not masked (each of its letters would be, in every message)."""
    import base64
    import binascii

    token = authorization.removeprefix("Basic ").strip()
    try:
        user, _, password = base64.b64decode(token).decode("latin-1").partition(":")
    except (binascii.Error, ValueError):
        return [token]
    secret = password if password else user
    return [token, secret] if len(secret.strip()) >= 4 else [token]


def credential_forms(keys: Iterable[str], base_url: str, proxy: Any = None) -> tuple[bytes, ...]:
    """:func:`secret_forms` of the keys sent, and of the basic auth of the base URL's
    ``user:password@`` and of a :class:`~._proxies.ProxyRoute`'s credentials."""
    return secret_forms([*keys, *url_secrets(base_url), *proxy_secrets(proxy)])


def proxy_secrets(proxy: Any) -> list[str]:
    """:func:`basic_secrets` of a :class:`~._proxies.ProxyRoute`'s credentials (none without)."""
    authorization = proxy.headers.get("Proxy-Authorization") if proxy is not None else None
    return basic_secrets(authorization) if authorization else []


def url_secrets(url: str) -> list[str]:
    """:func:`basic_secrets` of the ``Authorization`` aiohttp sends for ``url``'s
    ``user:password@`` (none without one)."""
    if "@" not in url:
        return []
    import aiohttp
    from yarl import URL

    try:
        auth = aiohttp.BasicAuth.from_url(URL(url))
        return [] if auth is None else basic_secrets(auth.encode())
    except (ValueError, TypeError, UnicodeError):  # (a URL the client refuses anyway)
        return []


def mask_secrets(data: bytes, forms: Iterable[bytes]) -> bytes:
    """``data`` with every one of ``forms`` (:func:`secret_forms`) masked: a gateway's refusal
    that echoes the key it was sent (``{"error": "invalid api key sk-..."}``) would put the key
    into the error's message, the run's one-line reason and a ``--summary``."""
    for form in forms:
        if form in data:
            data = data.replace(form, _MASK.encode())
    return data


def mask_location(headers: Any, forms: Iterable[bytes]) -> Any:
    """An answer's ``headers`` with ``forms`` masked in its ``Location``: a redirect's target,
    which the refusal names, may carry the key the request came with (a gateway sending it to
    a login page: ``?api_key=sk-...``)."""
    location = headers.get("Location")
    if not location:
        return headers
    raw = location.encode("utf-8", "surrogateescape")
    masked = mask_secrets(raw, forms)
    if masked == raw:
        return headers
    from multidict import CIMultiDict  # (aiohttp's own dependency)

    copy = CIMultiDict(headers)
    copy["Location"] = masked.decode("utf-8", "surrogateescape")
    return copy


def scrub_request_info(err: BaseException, forms: Iterable[bytes] = ()) -> None:
    """Mask the secrets in the request aiohttp keeps on an error it raises after sending
    (``ClientResponseError.request_info``, a proxy's refusal of the CONNECT included, whose
    request holds ``Proxy-Authorization``: its repr shows every header, ``x-api-key`` and the
    ``Authorization`` of a base URL's password too, and the URL), on ``err`` and the errors it
    chains, since ours chain it (``raise ... from err``); and ``forms`` (:func:`secret_forms`)
    in their words: the parser's quote the line of an answer it could not read, which may
    echo the key (``Bad status line: b'HTTP/1.1 4O1 key sk-...'``)."""
    import aiohttp

    seen: set[int] = set()
    item: BaseException | None = err
    while item is not None and id(item) not in seen:
        seen.add(id(item))
        if forms:
            _mask_words(item, forms)
        info = getattr(item, "request_info", None)
        if isinstance(info, aiohttp.RequestInfo):
            headers = info.headers.copy()  # (a CIMultiDict, aiohttp's own dependency)
            for name in _SECRET_HEADERS:
                if name in headers:
                    headers[name] = _MASK
            masked = aiohttp.RequestInfo(
                _without_password(info.url),
                info.method,
                type(info.headers)(headers),
                _without_password(info.real_url),
            )
            item.request_info = masked  # type: ignore[attr-defined]
            if isinstance(item, aiohttp.ClientResponseError):
                item.args = (masked, item.history)
        item = item.__cause__ or item.__context__


def _mask_words(err: BaseException, forms: Iterable[bytes]) -> None:
    """``forms`` masked in the text ``err`` holds: its args and attributes (``message``,
    ``line``)."""

    def masked(value: object) -> object:
        if isinstance(value, str):
            raw = value.encode("utf-8", "surrogateescape")
            return mask_secrets(raw, forms).decode("utf-8", "surrogateescape")
        return mask_secrets(value, forms) if isinstance(value, bytes) else value

    err.args = tuple(masked(arg) for arg in err.args)
    for name, value in list(vars(err).items()):
        if isinstance(value, (str, bytes)):
            setattr(err, name, masked(value))


def _without_password(url: URL) -> URL:
    if url.password:
        return url.with_password(_MASK)
    return url.with_user(_MASK) if url.user else url  # (a token given as the user alone)
