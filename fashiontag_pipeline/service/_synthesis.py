"""Constants of the reference analyzer's synthesis, shared by its two renderers.

:mod:`.analyzer` renders results as structs (the readable reference) and :mod:`.fastrender` as
pre-encoded bytes (the hot path); both must draw from the same tables, so the tables live here
once. A byte-equality test binds the two renderers' logic.
"""

from __future__ import annotations

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
