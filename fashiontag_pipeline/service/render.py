"""The readable renderer: an analysed image's tagging response, built as msgspec structs.

With pixels, every product's colours and position come from the measurement of its region of
the image (:mod:`.pixels`); without (``--no-fetch``) they are synthesized too. Everything else
is synthesized deterministically from the image's 64-bit content hash: the scene (which
products are in the image), category, item, details, looks, prints, textures, length, sleeve
length, neckline, fit, shape, shoe attributes, materials, pair index and gender. One generator
seeded with the hash draws every product of the scene in order, for any detection mask, so
that a product's tags never depend on what was asked for.

This is the reference (the oracle): :mod:`.fastrender` renders the same responses straight to
JSON bytes for the results hot path and must stay byte-identical to ``msgspec.json.encode`` of
what this module builds (``tests/service/test_fastrender.py``).
"""

from __future__ import annotations

import random

from .._models import (
    STATUS_SUCCESS,
    ColorDetail,
    DetectedObject,
    Detection,
    Position,
    ScoredTag,
    Tag,
    TaggingData,
    TaggingResponse,
)
from ._synthesis import (
    BIT,
    CLOTHING_MASK,
    DETECTIONS,
    MIN_CONFIDENCE,
    NO_PRODUCT,
    OBJECT_ORDER,
    draw_scene,
)
from .pixels import Measurement
from .taxonomy import Entry, Taxonomy

__all__ = ["StructRenderer"]


class StructRenderer:
    """Renders :class:`.analyzer.ReferenceAnalyzer` results as :class:`TaggingResponse`."""

    def __init__(self, taxonomy: Taxonomy) -> None:
        self.taxonomy = taxonomy

    def render(
        self, content_hash: int, measured: list[Measurement] | None, detection: int, lang: int
    ) -> TaggingResponse:
        """The tagging response of an image: its content hash, region measurements (None
        without pixels; :func:`.pixels.unpack_measurement`), detection mask and language."""
        tax = self.taxonomy
        h = content_hash
        # One generator per image: every product of the scene is synthesized in order for any
        # detection mask, so a product's tags never depend on what was asked for.
        rng = random.Random(h)
        model = rng.random() < 0.5
        gender = int(rng.random() * 3)
        groups = draw_scene(rng, model)
        wanted: dict[str, list[Tag]] = {}
        for d in DETECTIONS:
            if detection & BIT[d]:
                wanted.setdefault(tax.object_types[d], [])
        unmatched: dict[str, list[Tag]] = {}
        clothing_only = detection & ~CLOTHING_MASK == 0
        at = 0  # the measurement of the product's (first) tag; shoes have two
        for group in groups:
            otype = tax.object_types[group]
            tags = self._tags(rng, group, lang, measured, at)
            at += 2 if group is Detection.SHOES else 1
            if detection & BIT[group]:
                wanted[otype].extend(tags)
            elif clothing_only:
                unmatched.setdefault(otype, []).extend(tags)
        objects = [
            DetectedObject(type=otype, tags=wanted[otype])
            for otype in OBJECT_ORDER
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
                for otype in OBJECT_ORDER
                if otype in unmatched
            ],
        )
        return TaggingResponse(status=STATUS_SUCCESS, data=data)

    def _tags(
        self,
        rng: random.Random,
        group: Detection,
        lang: int,
        measured: list[Measurement] | None,
        at: int,
    ) -> list[Tag]:
        tax = self.taxonomy
        category = tax.categories[group][int(rng.random() * len(tax.categories[group]))]
        items = tax.items[category.id]
        item = items[int(rng.random() * len(items))]
        if measured:
            # Colours and position measured in the product's region (:mod:`.pixels`). A blob
            # of an older service holds one measurement, used for every product.
            scored_colors, details, x, y = self._measured(
                measured[min(at, len(measured) - 1)], lang
            )
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
                # Both shoes of a pair: same attributes and pairIndex. Measured, the right shoe
                # has the colours and position of its own region; synthesized, it mirrors.
                twin = Tag(**{f: getattr(tag, f) for f in Tag.__struct_fields__})
                assert tag.position is not None
                if measured:
                    twin.colors, twin.color_details, tx, ty = self._measured(
                        measured[min(at + 1, len(measured) - 1)], lang
                    )
                    twin.position = Position(x=round(tx, 4), y=round(ty, 4))
                else:
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
        # Largest share first (stable: equal fractions keep their draw order).
        details.sort(key=lambda d: -d.pixel_fraction)
        return colors, details

    def _measured(
        self, measurement: Measurement, lang: int
    ) -> tuple[list[ScoredTag], list[ColorDetail], float, float]:
        tax = self.taxonomy
        named, palette, x, y = measurement
        colors = [
            ScoredTag(id=tax.colors[i].id, name=tax.colors[i].names[lang], confidence=round(c, 4))
            for i, c in named
        ]
        details = [tax.palette.detail(i, lang, round(f, 4)) for i, f in palette]
        return colors, details, x, y

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
