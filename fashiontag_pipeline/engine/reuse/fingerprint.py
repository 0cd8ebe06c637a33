"""The fingerprint of a tagging request: what decides whether a stored result can stand in.

Two requests get the same fingerprint exactly when the service would be asked the same
question: the same image URL, the same detection *after defaults are applied* (the row's own
list, else the run's ``default_detection``, else the service's clothing default; as a set,
order does not matter), the same language, and the same context fields other than ``id``
(gender, brand, currency, price, age, keywords, productContentName, season). The id is left
out on purpose: a product renamed in the catalogue (new id, same image and context) is reused.

Encoding: the canonical tuple ``(version, url, detection, language, gender, brand, currency,
price, age, keywords, productContentName, season)`` encoded with msgpack (a tuple of strings
and nulls has exactly one encoding), hashed with BLAKE2b to 16 bytes. ``version`` changes if
the tuple ever does, so an old store never answers for a question it was not asked.
"""

from __future__ import annotations

from collections.abc import Sequence
from hashlib import blake2b

import msgspec

from ..._models import (
    CLOTHING_DETECTION,
    BulkContext,
    Detection,
    Image,
    ImageType,
    TaggingRequest,
)

__all__ = ["FINGERPRINT_VERSION", "Fingerprinter"]

FINGERPRINT_VERSION = "fashiontag-reuse-1"


class Fingerprinter:
    """Fingerprints of the requests of one run (its language and default detection)."""

    def __init__(
        self, *, language: str = "en", default_detection: Sequence[Detection] | None = None
    ) -> None:
        self.language = language
        self._default = self._canonical(default_detection or CLOTHING_DETECTION)
        self._detections: dict[tuple[Detection, ...], tuple[str, ...]] = {}
        self._encode = msgspec.msgpack.Encoder().encode
        #: What the run asks of every row besides the row's own fields (its language and
        #: default detection), as text: rows fingerprinted under another are not this run's.
        self.question = f"{FINGERPRINT_VERSION} {language} {','.join(self._default)}"

    @staticmethod
    def _canonical(detection: Sequence[Detection]) -> tuple[str, ...]:
        return tuple(sorted({str(d) for d in detection}))

    def of(self, request: TaggingRequest | str) -> bytes:
        """The 16-byte fingerprint of ``request`` (a ``str``: a plain row's URL, its request
        that URL and an id alone: :mod:`~..plainbody`)."""
        if type(request) is str:
            request = TaggingRequest(Image(ImageType.URL, request), BulkContext(""))
        assert isinstance(request, TaggingRequest)
        c = request.context
        if c.detection:
            key = tuple(c.detection)
            detection = self._detections.get(key)
            if detection is None:
                detection = self._detections[key] = self._canonical(key)
        else:
            detection = self._default
        canonical = (
            FINGERPRINT_VERSION,
            request.image.content,
            detection,
            self.language,
            c.gender,
            c.brand,
            c.currency,
            c.price,
            tuple(c.age) if c.age is not None else None,
            c.keywords,
            c.product_content_name,
            c.season,
        )
        return blake2b(self._encode(canonical), digest_size=16).digest()
