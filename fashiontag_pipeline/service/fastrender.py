"""The reference analyzer's results rendered straight to JSON bytes (the bulk read hot path).

:mod:`.render` builds the response as msgspec structs that are then encoded; on a results page
that costs ~70 us per result, nearly all of it object construction. :class:`FastRenderer` draws
exactly the same random numbers in exactly the same order, but instead of building structs it
joins JSON fragments encoded once per language at start-up (``{"id":"C01","name":"top",
"confidence":`` and the like) and a table of the encoded form of every 4-decimal float in
[0, 1]. Its output decodes to the same value as ``msgspec.json.encode(render(...))`` (and is
byte-identical, since the fragments come from the same encoder); ``tests/service`` checks this
on thousands of random images, detections and languages.

Any change to the synthesis in :mod:`.render` must be mirrored here; the fragments and the
attribute draws it joins are in :mod:`._fragments`.
"""

from __future__ import annotations

import _random
import random
import threading
from bisect import bisect_right as _bisect_right
from typing import TYPE_CHECKING

import msgspec

from .._models import LANGUAGES, Detection
from ._fragments import CONF as _CONF
from ._fragments import FL as _FL
from ._fragments import Fragments as _Fragments
from ._fragments import draw_many as _many
from ._fragments import draw_one as _one
from ._fragments import encoded_float as _float
from ._fragments import k4 as _k4
from ._synthesis import BIT as _BIT
from ._synthesis import CLOTHING_MASK as _CLOTHING_MASK
from ._synthesis import DETECTIONS as _DETECTIONS
from ._synthesis import MIN_CONFIDENCE as _MIN_CONFIDENCE
from ._synthesis import NO_PRODUCT as _NO_PRODUCT
from ._synthesis import OBJECT_ORDER as _OBJECT_ORDER
from ._synthesis import SCENE_PRIMARY
from .pixels import Measurement

if TYPE_CHECKING:
    from .taxonomy import Taxonomy

__all__ = ["FastRenderer"]

_encode = msgspec.json.encode
_seed = _random.Random.seed
_CLOTHING = (Detection.TOP, Detection.BOTTOM, Detection.WHOLEBODY, Detection.SWIMWEAR)
# Group kinds: what a tag of the group carries beyond the common fields.
_KIND_OTHER, _KIND_CLOTHING, _KIND_CLOTHING_NO_SLEEVE, _KIND_SHOES, _KIND_BAG = range(5)
_CLOTHING_KINDS = (_KIND_CLOTHING, _KIND_CLOTHING_NO_SLEEVE)

_TOP, _BOTTOM = _DETECTIONS.index(Detection.TOP), _DETECTIONS.index(Detection.BOTTOM)
_EXTRAS = tuple(_DETECTIONS.index(d) for d in (Detection.SHOES, Detection.BAG, Detection.HAT))
_PRIMARY = SCENE_PRIMARY

_PRIMARY_P = tuple(p for p, _ in _PRIMARY)
_PRIMARY_GROUP = tuple(_DETECTIONS.index(d) for _, d in _PRIMARY)

_PAIR_INDEX = tuple(b',"pairIndex":%d' % i for i in range(101))


class FastRenderer:
    """Renders :class:`.analyzer.ReferenceAnalyzer` results as JSON bytes."""

    def __init__(self, tax: Taxonomy) -> None:
        self._tax = tax
        self._langs: list[_Fragments | None] = [None] * len(LANGUAGES)
        object_type = {d: tax.object_types[d] for d in _DETECTIONS}
        # Per group index (Detection order): (bit, object type, kind).
        kinds = dict.fromkeys(_DETECTIONS, _KIND_OTHER)
        kinds.update(dict.fromkeys(_CLOTHING, _KIND_CLOTHING))
        kinds[Detection.BOTTOM] = _KIND_CLOTHING_NO_SLEEVE
        kinds[Detection.SHOES] = _KIND_SHOES
        kinds[Detection.BAG] = _KIND_BAG
        self._groups = tuple((_BIT[d], object_type[d], kinds[d]) for d in _DETECTIONS)
        self._object_type = object_type
        self._type_key = {
            otype: _encode({"type": otype, "tags": []})[:-3] for otype in set(_OBJECT_ORDER)
        }
        self._no_product = _encode([{"type": _NO_PRODUCT, "tags": []}])
        self._wanted: dict[int, tuple[str, ...]] = {}
        self._n_colors = n_colors = len(tax.colors)
        self._color_pool = tuple(range(n_colors))
        self._palette_size = tax.palette.size
        self._local = threading.local()

    def fragments(self, lang: int) -> _Fragments:
        frags = self._langs[lang]
        if frags is None:
            frags = self._langs[lang] = _Fragments(self._tax, lang)
        return frags

    def _wanted_types(self, detection: int) -> tuple[str, ...]:
        wanted = self._wanted.get(detection)
        if wanted is None:
            present = {self._object_type[d] for d in _DETECTIONS if detection & _BIT[d]}
            wanted = self._wanted[detection] = tuple(o for o in _OBJECT_ORDER if o in present)
        return wanted

    def render(
        self,
        content_hash: int,
        measured: list[Measurement] | None,
        detection: int,
        lang: int,
    ) -> bytes:
        """The JSON of ``ReferenceAnalyzer.render`` for unpacked region measurements."""
        f = self._langs[lang] or self.fragments(lang)
        local = self._local
        try:
            rng: random.Random = local.rng
        except AttributeError:
            rng = local.rng = random.Random()
        # The C-level seed: what random.Random(h) does, minus the Python wrapper.
        _seed(rng, content_hash)
        rnd = rng.random
        model = rnd() < 0.5
        gender = int(rnd() * 3)

        # ---- the scene (mirrors _synthesis.draw_scene), as group indexes
        point = rnd()
        groups: list[int]
        if point < 0.03:
            groups = []
        else:
            primary = _PRIMARY_GROUP[_bisect_right(_PRIMARY_P, point)]
            groups = [primary]
            if model:
                if primary == _TOP:
                    if rnd() < 0.7:
                        groups.append(_BOTTOM)
                elif primary == _BOTTOM and rnd() < 0.7:
                    groups.append(_TOP)
                for extra in _EXTRAS:
                    if extra not in groups and rnd() < 0.25:
                        groups.append(extra)

        clothing_only = detection & ~_CLOTHING_MASK == 0
        wanted: dict[str, list[bytes]] = {}
        unmatched: dict[str, list[bytes]] = {}
        group_info = self._groups
        last = len(measured) - 1 if measured else -1
        at = 0  # the measurement of the product's (first) tag; shoes have two
        for group in groups:
            bit, otype, kind = group_info[group]
            # ---- one product (mirrors StructRenderer._tags)
            categories = f.categories[group]
            head, items = categories[int(rnd() * len(categories))]
            item = items[int(rnd() * len(items))]
            if measured:
                colour_part, x, y = _measured(f, measured[at if at < last else last])
            else:
                # ---- mirrors StructRenderer._colors
                n = 1 + int(rnd() * 3)
                # random.sample(range(n_colors), n), drawn exactly as the stdlib draws it.
                getrandbits = rng.getrandbits
                m = self._n_colors
                bits = m.bit_length()
                r = getrandbits(bits)
                while r >= m:
                    r = getrandbits(bits)
                if n == 1:
                    picks = [r]
                    shares = [rnd()]
                else:
                    pool = list(self._color_pool)
                    picks = [r]
                    pool[r] = pool[m - 1]
                    for i in range(1, n):
                        m1 = m - i
                        bits = m1.bit_length()
                        r = getrandbits(bits)
                        while r >= m1:
                            r = getrandbits(bits)
                        picks.append(pool[r])
                        pool[r] = pool[m1 - 1]
                    shares = [rnd(), rnd()] if n == 2 else [rnd(), rnd(), rnd()]
                    shares.sort(reverse=True)
                total = sum(shares)
                color_frags = f.colors
                conf = shares[0] / total
                colors = (
                    color_frags[picks[0]]
                    + _CONF[_k4(conf if conf > _MIN_CONFIDENCE else _MIN_CONFIDENCE)]
                )
                if n > 1:
                    conf = shares[1] / total
                    if conf >= _MIN_CONFIDENCE:
                        colors += b"," + color_frags[picks[1]] + _CONF[_k4(conf)]
                        if n > 2:
                            conf = shares[2] / total
                            if conf >= _MIN_CONFIDENCE:
                                colors += b"," + color_frags[picks[2]] + _CONF[_k4(conf)]
                palette = f.palette
                size = self._palette_size
                remaining = 1.0
                parts = []
                ks = []
                previous = 10001
                unsorted = False
                for _ in range(1 + int(rnd() * 4)):
                    frac = remaining * (0.4 + 0.5 * rnd())
                    remaining -= frac
                    k = _k4(frac)
                    if k > previous:
                        unsorted = True
                    previous = k
                    ks.append(k)
                    parts.append(palette[int(rnd() * size)] + _CONF[k])
                if unsorted:
                    # Largest fraction first; stable, like sort(key=-pixel_fraction).
                    order = sorted(range(len(ks)), key=ks.__getitem__, reverse=True)
                    parts = [parts[i] for i in order]
                colour_part = (
                    b',"colors":[' + colors + b'],"colorDetails":[' + b",".join(parts) + b"]"
                )
                x, y = 0.15 + 0.7 * rnd(), 0.15 + 0.7 * rnd()
            kx = _k4(x)
            y_part = b',"y":' + _FL[_k4(y)] + b"}"
            tail = []
            tail.append(b',"item":' + item + _CONF[_k4(0.05 + 0.94 * rnd())])
            materials = f.materials
            main_materials = _many(rnd, materials, 1, 1.0)
            sub_materials = _many(rnd, materials, 1, 0.4)
            looks = _many(rnd, f.looks, 2, 1.0)
            pair = b""
            twin = False
            if kind in _CLOTHING_KINDS:
                tag_details = _many(rnd, f.details, 3, 1.0)
                prints = _many(rnd, f.prints, 1, 1.0)
                textures = _many(rnd, f.textures, 2, 0.6)
                length = _one(rnd, f.length)
                fit = _one(rnd, f.fit)
                shape = _one(rnd, f.shape)
                if tag_details:
                    tail.append(b',"details":' + tag_details)
                if prints:
                    tail.append(b',"prints":' + prints)
                if textures:
                    tail.append(b',"textures":' + textures)
                if looks:
                    tail.append(b',"looks":' + looks)
                if length:
                    tail.append(b',"length":' + length)
                if kind == _KIND_CLOTHING:
                    sleeves = f.sleeve_length
                    tail.append(sleeves[int(rnd() * len(sleeves))])
                    neck_line = _one(rnd, f.neck_line)
                    if neck_line:
                        tail.append(b',"neckLine":' + neck_line)
                if fit:
                    tail.append(b',"fit":' + fit)
                if shape:
                    tail.append(b',"shape":' + shape)
            elif kind == _KIND_SHOES:
                if looks:
                    tail.append(b',"looks":' + looks)
                heel_height = _one(rnd, f.heel_height)
                toe_type = _one(rnd, f.toe_type)
                heel_shape = _one(rnd, f.heel_shape)
                sole_type = _one(rnd, f.sole_type)
                pair = _PAIR_INDEX[int(rnd() * 101)]
                twin = rnd() < 0.6
                if heel_height:
                    tail.append(b',"heelHeight":' + heel_height)
                if toe_type:
                    tail.append(b',"toeType":' + toe_type)
                if heel_shape:
                    tail.append(b',"heelShape":' + heel_shape)
                if sole_type:
                    tail.append(b',"soleType":' + sole_type)
            elif kind == _KIND_BAG:
                shape = _one(rnd, f.shape)
                bag_details = _many(rnd, f.details, 2, 0.5)
                if bag_details:
                    tail.append(b',"details":' + bag_details)
                if looks:
                    tail.append(b',"looks":' + looks)
                if shape:
                    tail.append(b',"shape":' + shape)
            elif looks:
                tail.append(b',"looks":' + looks)
            if main_materials:
                tail.append(b',"mainMaterials":' + main_materials)
            if sub_materials:
                tail.append(b',"subMaterials":' + sub_materials)
            tail.append(b"}")
            rest = b"".join(tail)
            tags = [head + _FL[kx] + y_part + pair + colour_part + rest]
            if twin:
                if measured:
                    # The right shoe: colours and position of its own region.
                    twin_part, x, y = _measured(f, measured[at + 1 if at + 1 < last else last])
                    tags.append(
                        head + _FL[_k4(x)] + b',"y":' + _FL[_k4(y)] + b"}" + pair + twin_part + rest
                    )
                else:
                    tags.append(
                        head + _FL[_k4(1.0 - kx / 10000)] + y_part + pair + colour_part + rest
                    )
            at += 2 if kind == _KIND_SHOES else 1
            if detection & bit:
                if otype in wanted:
                    wanted[otype] += tags
                else:
                    wanted[otype] = tags
            elif clothing_only:
                if otype in unmatched:
                    unmatched[otype] += tags
                else:
                    unmatched[otype] = tags

        type_key = self._type_key
        out = [b'{"status":"success","data":{"imageinfo":[', f.imageinfo[1 if model else 0]]
        if model:
            out.append(b'],"genderInfo":')
            out.append(f.gender[gender])
            out.append(b',"objects":')
        else:
            out.append(b'],"objects":')
        if wanted:
            sep = b"["
            for otype in self._wanted.get(detection) or self._wanted_types(detection):
                out.append(sep)
                out.append(type_key[otype])
                found = wanted.get(otype)
                if found:
                    out.append(b"[")
                    out.append(b",".join(found))
                    out.append(b"]}")
                else:
                    out.append(b"[]}")
                sep = b","
            out.append(b"]")
        else:
            out.append(self._no_product)
        if unmatched:
            out.append(b',"notmatchedobjects":')
            sep = b"["
            for otype in _OBJECT_ORDER:
                found = unmatched.get(otype)
                if found is not None:
                    out.append(sep)
                    out.append(type_key[otype])
                    out.append(b"[")
                    out.append(b",".join(found))
                    out.append(b"]}")
                    sep = b","
            out.append(b"]")
        out.append(b"}}")
        return b"".join(out)


def _measured(f: _Fragments, measurement: Measurement) -> tuple[bytes, float, float]:
    """Mirrors ``StructRenderer._measured``: the colours and colorDetails members of a tag (each
    present when not empty) and the position, from one region's measurement."""
    named, palette, x, y = measurement
    part = b""
    if named:
        colors = f.colors
        part = (
            b',"colors":['
            + b",".join([colors[index] + _float(round(conf, 4)) + b"}" for index, conf in named])
            + b"]"
        )
    if palette:
        codes = f.palette
        part += (
            b',"colorDetails":['
            + b",".join([codes[index] + _float(round(frac, 4)) + b"}" for index, frac in palette])
            + b"]"
        )
    return part, x, y
