"""The service's base URL: how it is cleaned, checked and shown (a password in it masked).

Used by the client's configuration (:mod:`._config`, which re-exports these) and by every
message that names the service or a proxy.
"""

from __future__ import annotations

from urllib.parse import urlsplit

__all__ = [
    "NAME_RULES",
    "api_path_in_base",
    "base_url_problem",
    "clean_base_url",
    "no_ipv4_as_written",
    "not_a_host_name",
    "shown_url",
]


def shown_url(url: str) -> str:
    """``url`` as messages show it: its password (``https://user:PASSWORD@host``), or an
    ``http(s)://`` URL's user given alone (``https://TOKEN@gw``, sent as basic auth), masked.
    Everything between ``://`` and the last ``@`` is the user's part (so a password holding an
    unencoded ``/`` or ``@`` is masked too)."""
    scheme, sep, rest = url.partition("://")
    head, at, tail = rest.rpartition("@")
    if sep and at and ":" not in head and scheme.lower() in ("http", "https"):
        return f"{scheme}://***@{tail}"
    return f"{scheme}://{head.partition(':')[0]}:***@{tail}" if sep and at and ":" in head else url


#: The API's own paths, which the client puts after the base URL (the longest first).
_API_PATHS = ("/tagger/v2.12/bulk", "/tagger/v2.12", "/tagger/v2/tags", "/tagger/v2", "/tagger")


def api_path_in_base(base: str) -> str:
    """The words added to an endpoint's 404 when ``base`` (shown) ends with a path the client
    adds itself (the endpoint's URL copied from the spec as the base URL): which base to give.
    Empty otherwise (a gateway's prefix left out or mistyped)."""
    stem = base.rstrip("/")
    for path in _API_PATHS:
        if stem.lower().endswith(path) and (given := stem[: -len(path)]).count("/") >= 2:
            return (
                f" It ends with {path}, which the client adds itself: give {given} as the base URL"
            )
    return ""


def clean_base_url(url: str) -> str:
    """``url`` without the white space around it (the line end of a value read from a file,
    ``FASHIONTAG_BASE_URL=$(cat url.txt)`` from a CRLF file, a space pasted after it: sent,
    it would be part of every request's path) and with its scheme in lower case."""
    url = url.strip()
    scheme, sep, rest = url.partition("://")
    if sep and scheme.lower() in ("http", "https"):
        return scheme.lower() + sep + rest
    return url


def base_url_problem(url: str) -> str | None:
    """Why ``url`` (cleaned by :func:`clean_base_url`) cannot be the service's base URL, as
    the end of a sentence that starts with "base_url" (None when it can). A path prefix (an API
    gateway's ``https://gw.example/tagging/v1``) is fine; the URL is shown with its password
    masked, a query never (it may hold a key)."""
    if not url.startswith(("http://", "https://")):
        quoted = len(url) > 1 and url[0] == url[-1] and url[0] in "'\""
        # (``VAR="http://..."`` in a Docker ``--env-file``, which keeps the quotes)
        why = " (it starts and ends with a quote, part of the value: remove them)" if quoted else ""
        return f"must start with http:// or https://, got {shown_url(url)!r}{why}"
    user = url.partition("://")[2].rpartition("@")[0]
    if "?" in user or "#" in user:
        # A password holding an unencoded ``#`` or ``?`` (pasted as generated): cut there
        # as a query would be, its start was shown as the URL to give. Shown masked whole.
        return (
            "must not hold a query (?...) or fragment (#...), nor a password with an unencoded"
            f" '#' or '?' (percent-encode them: %23, %3F): {shown_url(url)!r}"
        )
    if "/" in user:
        # A token or password holding an unencoded ``/``: the host is read up to it, so its
        # head was the host requests went to (looked up in DNS), shown as the host after it.
        # (Or an ``@`` in the path, which messages took for the end of a user part.)
        return (
            "has an '@' after a '/': a user or password holding an unencoded '/' (percent-"
            f"encode it: %2F), or an '@' in the path (write it as %40): {shown_url(url)!r}"
        )
    if "?" in url or "#" in url:
        # Request URLs are this text and a path: a query would come before the path (every
        # request a 404), and a key put there would show in every retry line. Not echoed.
        head = shown_url(url.split("?", 1)[0].split("#", 1)[0])
        return (
            f"must not hold a query (?...) or fragment (#...): give {head!r}; keys go in"
            " FASHIONTAG_API_KEY / FASHIONTAG_BULK_API_KEY or the [client] table"
        )
    if any(ord(char) < 0x20 or ord(char) == 0x7F for char in url):
        return f"holds a control character: {shown_url(url)!r}"
    from yarl import URL  # (aiohttp's own; imported here, when a URL is checked)

    try:
        parsed = URL(url)
        # A port that is no number, or out of range, fails here; so does one with a space or
        # a sign, which yarl's int() takes (the proxy look-up's urlsplit then failed on it).
        port = urlsplit(url).port or parsed.port
    except (ValueError, TypeError) as err:
        reason = str(err).removeprefix("Invalid URL: ")
        if user and user in reason:  # (yarl's messages do not quote the URL; never show it)
            reason = "not a URL"
        return f"is not a valid URL ({reason}): {shown_url(url)!r}"
    host = parsed.raw_host
    if not host:
        return f"has no host: {shown_url(url)!r}"
    if " " in host or port == 0:
        return f"has no valid host and port: {shown_url(url)!r}"
    if no_ipv4_as_written(host):
        # (aiohttp refuses to connect to ``127.1``, ``2130706433``, an octet past 255 or with
        # a leading zero, a trailing dot: taken for an outage, retried until the give-up.)
        return (
            "has a host that is no IPv4 address as written (four numbers 0-255, no leading"
            f" zero, no trailing dot: 10.0.0.1): {shown_url(url)!r}"
        )
    if not_a_host_name(host):
        return f"has a host that is no valid name ({NAME_RULES}): {shown_url(url)!r}"
    return None


#: What :func:`not_a_host_name` finds, said.
NAME_RULES = "no empty label as '..' makes, none longer than 63 characters, xn-- as punycode"


def not_a_host_name(host: str) -> bool:
    """Whether the resolver's IDNA codec refuses ``host`` (yarl's ``raw_host``): an empty label
    (``tagger..example.com``), one longer than 63 characters, ``xn--`` that is no punycode.
    aiohttp meets it at the first request, as a ``UnicodeError`` no error of ours wraps: a
    traceback."""
    if ":" in host:  # (an IPv6 address)
        return False
    if host.isascii() and "xn--" not in host.lower():  # (the codec's checks, without it:
        # importing it costs every run ~0.6 ms; a trailing dot's empty label is allowed)
        labels = host[:-1].split(".") if host.endswith(".") else host.split(".")
        return host != "" and not all(0 < len(label) < 64 for label in labels)
    from yarl import URL  # (aiohttp's own; imported here, when a URL is checked)

    try:
        host.encode("idna")  # (as the resolver asks: an empty label, one too long)
        # As aiohttp reads it: yarl decodes ``xn--`` by IDNA 2008 first (``straße``, which
        # IDNA 2003's round trip refuses), by the codec if not.
        URL.build(scheme="http", host=host, encoded=True).host  # noqa: B018
    except UnicodeError:
        return True
    return False


def no_ipv4_as_written(host: str) -> bool:
    """Whether ``host`` is digits and dots but no IPv4 address as aiohttp connects to one
    (four numbers 0-255, none with a leading zero): ``127.1``, ``10.0.0.300``, ``10.0.0.010``,
    ``2130706433``, a trailing dot. aiohttp refuses those at each request (InvalidURL)."""
    if ":" in host or not host.replace(".", "").isdigit():
        return False
    parts = host.split(".")
    return len(parts) != 4 or not all(
        part.isascii() and part.isdigit() and str(int(part)) == part and int(part) <= 255
        for part in parts
    )
