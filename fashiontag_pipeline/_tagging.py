"""The tagging response (spec section 2.3): one image's tags, as the single endpoint answers
and as ``taggingResult`` of a bulk result. Re-exported by :mod:`fashiontag_pipeline._models`."""

from __future__ import annotations

import msgspec

__all__ = [
    "Color",
    "ColorDetail",
    "DetectedObject",
    "ErrorInfo",
    "IdName",
    "Position",
    "ScoredTag",
    "Tag",
    "TaggingData",
    "TaggingResponse",
]

STATUS_SUCCESS = "success"


def says_success(status: str) -> bool:
    """True when a ``status`` (a request's or a tagging result's) says success. The spec shows
    no values for it ("success or failure"); the reference service writes ``success``, and
    a service writing the word in another case (``SUCCESS``, ``Success``) or with spaces
    around it means the same."""
    return status == STATUS_SUCCESS or status.strip().casefold() == STATUS_SUCCESS


class IdName(msgspec.Struct, omit_defaults=True, gc=False):
    """An ``{id, name}`` pair (imageinfo, genderInfo, category, info, sleeveLength)."""

    id: str
    name: str


class ScoredTag(msgspec.Struct, omit_defaults=True, gc=False):
    """An ``{id, name, confidence}`` attribute."""

    id: str
    name: str
    confidence: float | None = None


#: The 18-colour result is the same shape as any scored attribute.
Color = ScoredTag


class ColorDetail(msgspec.Struct, omit_defaults=True, rename="camel", gc=False):
    """A detailed colour from the >2,000-colour palette."""

    code: str
    name: str
    pixel_fraction: float


class Position(msgspec.Struct, gc=False):
    """Bounding-box centre as a ratio of the image size."""

    x: float
    y: float


class Tag(msgspec.Struct, omit_defaults=True, rename="camel", gc=False):
    """One detected bounding box and its attributes (spec 2.3, data.objects[].tags[])."""

    info: list[IdName] = []
    category: IdName | None = None
    position: Position | None = None
    pair_index: int | None = None
    colors: list[ScoredTag] = []
    color_details: list[ColorDetail] = []
    item: ScoredTag | None = None
    details: list[ScoredTag] = []
    prints: list[ScoredTag] = []
    textures: list[ScoredTag] = []
    looks: list[ScoredTag] = []
    length: ScoredTag | None = None
    sleeve_length: IdName | None = None
    neck_line: ScoredTag | None = None
    fit: ScoredTag | None = None
    shape: ScoredTag | None = None
    heel_height: ScoredTag | None = None
    toe_type: ScoredTag | None = None
    heel_shape: ScoredTag | None = None
    sole_type: ScoredTag | None = None
    main_materials: list[ScoredTag] = []
    sub_materials: list[ScoredTag] = []


class DetectedObject(msgspec.Struct, gc=False):
    """One product kind found in the image (CLOTHING, SHOES, BAGS, ...).

    ``tags`` is always encoded: the spec wants an empty array when nothing matches.
    """

    type: str
    tags: list[Tag] = []


class TaggingData(msgspec.Struct, omit_defaults=True, rename="camel", gc=False):
    """``data`` of a tagging response."""

    imageinfo: list[IdName] = []
    gender_info: IdName | None = None
    objects: list[DetectedObject] = []
    notmatchedobjects: list[DetectedObject] = []


class ErrorInfo(msgspec.Struct, omit_defaults=True, gc=False):
    """Single-mode error object."""

    code: int
    message: str = ""


class TaggingResponse(msgspec.Struct, omit_defaults=True, gc=False):
    """Single-mode response, and the ``taggingResult`` of a bulk result."""

    status: str
    data: TaggingData | None = None
    error: ErrorInfo | None = None

    @property
    def ok(self) -> bool:
        """True when the service says the analysis succeeded."""
        return says_success(self.status)
