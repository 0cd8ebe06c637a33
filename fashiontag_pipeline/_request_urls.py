"""Request URLs: a base URL's text and an encoded path and query, as one ``yarl.URL``.

A request (one per 100 results read) had its URL parsed from the text ``base + path + query``
(``URL(text, encoded=True)``: ~24,000 instructions); :class:`RequestUrls` builds the same URL
from the base's parts, split once, and the request's (``URL.build``: ~7,600), and parses the
text only when the base is not ``scheme://authority`` and a path prefix.
"""

from __future__ import annotations

from yarl import URL

__all__ = ["RequestUrls"]


class RequestUrls:
    """The URLs of requests to one base URL (its encoded text)."""

    def __init__(self, base_encoded: str) -> None:
        self.base = base_encoded
        url = URL(base_encoded, encoded=True)
        head = f"{url.scheme}://{url.raw_authority}"
        #: (scheme, authority, path prefix) as the base's text has them; None: parsed as text.
        self.parts = (
            (url.scheme, url.raw_authority, base_encoded[len(head) :])
            if url.raw_authority
            and base_encoded.startswith(head)
            and not (url.raw_query_string or url.raw_fragment)
            else None
        )

    def url(self, path: str, query: str) -> URL:
        """The URL of ``path`` (encoded) and ``query`` (``""`` or an encoded ``?k=v&...``):
        the URL the text ``base + path + query`` parses to."""
        parts = self.parts
        if parts is None:
            return URL(self.base + path + query, encoded=True)
        scheme, authority, prefix = parts
        return URL.build(
            scheme=scheme,
            authority=authority,
            path=prefix + path,
            query_string=query[1:],
            encoded=True,
        )
