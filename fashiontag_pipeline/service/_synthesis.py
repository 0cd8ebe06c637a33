"""Constants of the reference analyzer's synthesis, shared by its two renderers.

:mod:`.analyzer` renders results as structs (the readable reference) and :mod:`.fastrender` as
pre-encoded bytes (the hot path); both must draw from the same tables, so the tables live here
once, with the scene draw that the pixel measurement needs too (:func:`scene_of`). A
byte-equality test binds the two renderers' logic.
"""

from __future__ import annotations

import random

from .._models import Detection

DETECTIONS: tuple[Detection, ...] = tuple(Detection)
#: One bit per detection value, in enum order (stored masks depend on this order).
BIT = {d: 1 << i for i, d in enumerate(DETECTIONS)}
CLOTHING_MASK = (
    BIT[Detection.TOP] | BIT[Detection.BOTTOM] | BIT[Detection.WHOLEBODY] | BIT[Detection.SWIMWEAR]
)
ALL_DETECTIONS = (1 << len(DETECTIONS)) - 1
#: Order of data.objects[] in a response.
OBJECT_ORDER = ("CLOTHING", "SHOES", "BAGS", "HATS", "JEWELRIES", "ACCESSORIES")
NO_PRODUCT = "no detected product"
#: Spec 2.3 rule 3: attributes other than item are returned only at this confidence or above.
MIN_CONFIDENCE = 0.2
#: The scene's primary product: the first entry whose bound exceeds the content hash's draw.
SCENE_PRIMARY: tuple[tuple[float, Detection], ...] = (
    (0.28, Detection.TOP),
    (0.46, Detection.BOTTOM),
    (0.61, Detection.WHOLEBODY),
    (0.66, Detection.SWIMWEAR),
    (0.80, Detection.SHOES),
    (0.90, Detection.BAG),
    (0.94, Detection.HAT),
    (0.97, Detection.JEWELRY),
    (1.01, Detection.ACCESSORY),
)


def draw_scene(rng: random.Random, model: bool) -> list[Detection]:
    """The products in the image, drawn right after ``model`` and the gender."""
    point = rng.random()
    if point < 0.03:
        return []
    primary = next(d for p, d in SCENE_PRIMARY if point < p)
    groups = [primary]
    if model:
        if primary is Detection.TOP and rng.random() < 0.7:
            groups.append(Detection.BOTTOM)
        elif primary is Detection.BOTTOM and rng.random() < 0.7:
            groups.append(Detection.TOP)
        for extra in (Detection.SHOES, Detection.BAG, Detection.HAT):
            if extra not in groups and rng.random() < 0.25:
                groups.append(extra)
    return groups


def scene_of(content_hash: int) -> list[Detection]:
    """The products in an image (a function of its content hash only), in render order: what
    the pixel measurement needs to know which regions to measure."""
    rng = random.Random(content_hash)
    model = rng.random() < 0.5
    rng.random()  # the gender
    return draw_scene(rng, model)
