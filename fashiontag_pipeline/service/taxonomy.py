"""The reference service's own catalogue: stable ids and names in en, ko, zh and ja.

The spec leaves the catalogues open (2.3 rule 4); DESIGN section 3 says the service ships its
own. It lives in ``data/taxonomy.json`` (package data) and is loaded once. Names are looked up
by a language *index* (``LANGUAGES.index(lang)``) so that rendering never hashes a string.

The detailed-colour palette (spec: "more than 2,000 colours") is a named grid over hue,
lightness and saturation: 24 hues x 7 lightness steps x 12 saturation steps plus 16 neutral
greys = 2,032 colours. Being a grid, the nearest palette colour of a pixel is found in O(1).
"""

from __future__ import annotations

import colorsys
import functools
import json
from dataclasses import dataclass
from importlib import resources
from typing import Any

from .._models import LANGUAGES, ColorDetail, Detection, IdName

__all__ = [
    "DEFAULT_LANGUAGE",
    "Entry",
    "Palette",
    "Taxonomy",
    "load_taxonomy",
    "parse_accept_language",
]

DEFAULT_LANGUAGE = "en"

_HUES = 24
_LIGHTNESS = 7
_SATURATION = 12
#: Below this HLS saturation a pixel counts as a neutral grey.
_NEUTRAL_SATURATION = 0.1


@dataclass(frozen=True, slots=True)
class Entry:
    """One catalogue entry: a stable id, an optional parent (category of an item, detection
    group of a category) and its name in each language, in :data:`LANGUAGES` order."""

    id: str
    names: tuple[str, str, str, str]
    parent: str = ""

    def id_name(self, lang: int) -> IdName:
        return _id_name(self.id, self.names[lang])


@functools.lru_cache(maxsize=4096)
def _id_name(id_: str, name: str) -> IdName:
    # IdName structs are immutable in practice and shared between renders.
    return IdName(id=id_, name=name)


class Palette:
    """The >2,000-colour named palette of ``colorDetails``."""

    def __init__(self, data: dict[str, Any]) -> None:
        self._hues: list[list[str]] = data["hues"]
        self._lightness: list[list[str]] = data["lightness"]
        self._saturation: list[list[str]] = data["saturation"]
        self._neutral: list[str] = data["neutral"]
        self._neutral_levels = int(data["neutralLevels"])
        if len(self._hues) != _HUES or len(self._lightness) != _LIGHTNESS:
            raise ValueError("palette data does not match the palette grid")
        if len(self._saturation) != _SATURATION:
            raise ValueError("palette data does not match the palette grid")
        self._chromatic = _HUES * _LIGHTNESS * _SATURATION
        self.size = self._chromatic + self._neutral_levels
        self._codes = [self._code(i) for i in range(self.size)]

    def _components(self, index: int) -> tuple[int, int, int]:
        hue, rest = divmod(index, _LIGHTNESS * _SATURATION)
        light, sat = divmod(rest, _SATURATION)
        return hue, light, sat

    def _code(self, index: int) -> str:
        if index >= self._chromatic:
            level = index - self._chromatic
            value = round(255 * level / (self._neutral_levels - 1))
            return f"{value:02x}{value:02x}{value:02x}"
        hue, light, sat = self._components(index)
        r, g, b = colorsys.hls_to_rgb(
            hue / _HUES, (light + 0.5) / _LIGHTNESS, (sat + 0.5) / _SATURATION
        )
        return f"{round(r * 255):02x}{round(g * 255):02x}{round(b * 255):02x}"

    def code(self, index: int) -> str:
        """Hexadecimal RGB of a palette colour (``"a1b2c3"``)."""
        return self._codes[index]

    @functools.lru_cache(maxsize=8192)  # noqa: B019 - one palette per process, never freed
    def name(self, index: int, lang: int) -> str:
        """Name of a palette colour in a language (by index)."""
        if index >= self._chromatic:
            level = index - self._chromatic
            return f"{self._neutral[lang]} {round(100 * level / (self._neutral_levels - 1))}"
        hue, light, sat = self._components(index)
        parts = (self._lightness[light][lang], self._saturation[sat][lang], self._hues[hue][lang])
        return "".join(parts) if lang >= 2 else " ".join(parts)

    def detail(self, index: int, lang: int, fraction: float) -> ColorDetail:
        return ColorDetail(
            code=self._codes[index], name=self.name(index, lang), pixel_fraction=fraction
        )

    def nearest(self, r: int, g: int, b: int) -> int:
        """Index of the palette colour nearest to an RGB pixel (grid quantisation)."""
        h, light, s = colorsys.rgb_to_hls(r / 255.0, g / 255.0, b / 255.0)
        if s < _NEUTRAL_SATURATION or light < 0.04 or light > 0.97:
            return self._chromatic + round(light * (self._neutral_levels - 1))
        hue = round(h * _HUES) % _HUES
        li = min(_LIGHTNESS - 1, int(light * _LIGHTNESS))
        si = min(_SATURATION - 1, int(s * _SATURATION))
        return (hue * _LIGHTNESS + li) * _SATURATION + si


class Taxonomy:
    """Every catalogue of the tagging response, loaded from package data."""

    def __init__(self, data: dict[str, Any]) -> None:
        if list(data["languages"]) != list(LANGUAGES):
            raise ValueError("taxonomy languages do not match the service languages")

        def entries(key: str) -> tuple[Entry, ...]:
            return tuple(Entry(row[0], tuple(row[1:5])) for row in data[key])

        self.imageinfo = entries("imageinfo")
        self.gender = entries("gender")
        self.details = entries("details")
        self.looks = entries("looks")
        self.prints = entries("prints")
        self.textures = entries("textures")
        self.length = entries("length")
        self.sleeve_length = entries("sleeveLength")
        self.neck_line = entries("neckLine")
        self.fit = entries("fit")
        self.shape = entries("shape")
        self.heel_height = entries("heelHeight")
        self.toe_type = entries("toeType")
        self.heel_shape = entries("heelShape")
        self.sole_type = entries("soleType")
        self.materials = entries("materials")
        self.colors = entries("colors")
        self.color_rgb: tuple[tuple[int, int, int], ...] = tuple(
            (int(row[5][0:2], 16), int(row[5][2:4], 16), int(row[5][4:6], 16))
            for row in data["colors"]
        )
        self.info: dict[Detection, Entry] = {
            Detection(row[0]): Entry(row[0], tuple(row[1:5])) for row in data["info"]
        }
        self.categories: dict[Detection, tuple[Entry, ...]] = dict.fromkeys(Detection, ())
        for row in data["category"]:
            group = Detection(row[1])
            entry = Entry(row[0], tuple(row[2:6]), parent=row[1])
            self.categories[group] = (*self.categories[group], entry)
        self.items: dict[str, tuple[Entry, ...]] = {}
        for row in data["item"]:
            entry = Entry(row[0], tuple(row[2:6]), parent=row[1])
            self.items[row[1]] = (*self.items.get(row[1], ()), entry)
        self.object_types: dict[Detection, str] = {
            Detection(k): v for k, v in data["objectTypes"].items() if k != "CLOTHING"
        }
        for d in (Detection.TOP, Detection.BOTTOM, Detection.WHOLEBODY, Detection.SWIMWEAR):
            self.object_types[d] = data["objectTypes"]["CLOTHING"]
        self.palette = Palette(data["palette"])

    def nearest_color(self, r: int, g: int, b: int) -> int:
        """Index of the nearest of the 18 named colours (weighted RGB distance)."""
        best, best_d = 0, 1 << 30
        for i, (cr, cg, cb) in enumerate(self.color_rgb):
            dr, dg, db = r - cr, g - cg, b - cb
            d = 2 * dr * dr + 4 * dg * dg + 3 * db * db
            if d < best_d:
                best, best_d = i, d
        return best

    def catalogue(self, lang: str = DEFAULT_LANGUAGE) -> dict[str, list[dict[str, str]]]:
        """Plain ``{attribute: [{id, name}]}`` in one language (documentation, tests)."""
        li = LANGUAGES.index(lang)
        out: dict[str, list[dict[str, str]]] = {}
        for key, seq in (
            ("imageinfo", self.imageinfo),
            ("details", self.details),
            ("looks", self.looks),
            ("prints", self.prints),
            ("textures", self.textures),
            ("length", self.length),
            ("sleeveLength", self.sleeve_length),
            ("neckLine", self.neck_line),
            ("fit", self.fit),
            ("shape", self.shape),
            ("heelHeight", self.heel_height),
            ("toeType", self.toe_type),
            ("heelShape", self.heel_shape),
            ("soleType", self.sole_type),
            ("materials", self.materials),
            ("colors", self.colors),
        ):
            out[key] = [{"id": e.id, "name": e.names[li]} for e in seq]
        out["category"] = [
            {"id": e.id, "name": e.names[li]} for group in self.categories.values() for e in group
        ]
        out["item"] = [
            {"id": e.id, "name": e.names[li]} for group in self.items.values() for e in group
        ]
        return out


@functools.cache
def load_taxonomy() -> Taxonomy:
    """The shipped taxonomy (loaded once per process)."""
    text = resources.files(__package__).joinpath("data/taxonomy.json").read_text("utf-8")
    return Taxonomy(json.loads(text))


@functools.lru_cache(maxsize=256)
def parse_accept_language(header: str | None) -> str:
    """The best supported language of an ``accept-language`` header; ``en`` otherwise.

    ``ko-KR,ko;q=0.9`` -> ``ko``; ``fr, ja;q=0.5`` -> ``ja``; ``*`` or junk -> ``en``.
    """
    if not header:
        return DEFAULT_LANGUAGE
    best, best_q = DEFAULT_LANGUAGE, -1.0
    for position, part in enumerate(header.split(",")):
        tag, _, params = part.strip().partition(";")
        primary = tag.strip().lower().split("-", 1)[0]
        if primary not in LANGUAGES:
            continue
        q = 1.0
        for param in params.split(";"):
            name, _, value = param.strip().partition("=")
            if name.strip().lower() == "q":
                try:
                    q = float(value)
                except ValueError:
                    q = 0.0
        if q <= 0.0:
            continue
        # Earlier entries win ties: the order of the header is the caller's preference.
        score = q - position * 1e-6
        if score > best_q:
            best, best_q = primary, score
    return best
