"""Fetch mode: every tag's colours are colours of its own region of the image.

Real generated images (Pillow: flat-coloured garments on a plain background, and the plain
rectangle of the other service tests) are served on loopback and tagged with every detection
type through the single endpoint (by URL and as base64) and in bulk. For every tag:

* each ``colors`` name and ``colorDetails`` code is the named / palette colour of a pixel that
  really is in the tag's region, counted at the measurement's resolution (5 bits per channel,
  so a pixel's colour moves by at most 4 per channel before it is named);
* each ``colorDetails`` code is within :data:`PALETTE_TOLERANCE` RGB units of such a pixel: the
  palette is a hue x lightness x saturation grid (24 x 7 x 12 + 16 greys), and the farthest any
  RGB colour lies from its cell's colour is 75.6 (scan of the cube in steps of 3:
  (9, 186, 210) -> 05fafa), plus 4*sqrt(3) = 6.9 for the 5-bit counting, rounded up to 84. A
  made-up colour (the ``1c0808`` once reported for a red rectangle) is ~170 away;
* ``colorDetails`` are sorted by ``pixelFraction``, largest first, ``colors`` by confidence;
* the position lies in the region.

"Its region" is the service's documented layout (:data:`pixels.REGION_LAYOUT`) applied to the
product's bounding box, which this test finds on the full-size image itself; the region is
widened by two thumbnail pixels on each side, since the service measures a <= 64 px sample.
"""

from __future__ import annotations

import base64
import contextlib
import io
import math
import random
from collections.abc import AsyncIterator, Callable

import anyio
from aiohttp import web
from PIL import Image as PILImage
from PIL import ImageChops, ImageDraw

from fashiontag_pipeline import TaggerClient
from fashiontag_pipeline._models import (
    BulkContext,
    Context,
    Detection,
    Image,
    ImageType,
    Tag,
    TaggingRequest,
    TaggingResponse,
)
from fashiontag_pipeline.service import load_taxonomy
from fashiontag_pipeline.service.pixels import REGION_LAYOUT

from .conftest import StartService
from .test_single import product_png

TAX = load_taxonomy()
PALETTE_TOLERANCE = 84.0
#: Sample of the service: at most this many pixels on the long side.
THUMB = 64
COLOURS = [
    (200, 20, 30),
    (30, 60, 200),
    (20, 130, 40),
    (240, 200, 20),
    (120, 40, 150),
    (20, 20, 20),
    (250, 130, 10),
    (90, 60, 30),
    (0, 170, 170),
    (230, 100, 160),
]


def figure_png(seed: int) -> bytes:
    """A person, flatly: hat, top, bottom, left and right shoe and a bag, each its own colour."""
    rng = random.Random(seed)
    w, h = rng.choice([(160, 240), (200, 300), (120, 200)])
    img = PILImage.new("RGB", (w, h), rng.choice([(255, 255, 255), (238, 238, 232)]))
    draw = ImageDraw.Draw(img)
    fill = rng.sample(COLOURS, 6)
    for colour, (left, top, right, bottom) in zip(
        fill,
        [
            (0.38, 0.05, 0.62, 0.14),
            (0.25, 0.15, 0.75, 0.48),
            (0.3, 0.48, 0.7, 0.85),
            (0.27, 0.86, 0.47, 0.95),
            (0.53, 0.86, 0.73, 0.95),
            (0.77, 0.35, 0.9, 0.55),
        ],
        strict=True,
    ):
        draw.rectangle((left * w, top * h, right * w, bottom * h), fill=colour)
    out = io.BytesIO()
    img.save(out, format="PNG")
    return out.getvalue()


#: 24 figures (single products, pairs and singles of shoes, and several products at once) and
#: the red rectangle on white of the issue (a bottom, a top and a pair of shoes).
IMAGES: dict[str, bytes] = {f"figure-{s}": figure_png(s) for s in range(24)}
IMAGES["red-rectangle"] = product_png((200, 20, 30))
IMAGES["blue-rectangle"] = product_png((30, 60, 200))


def _quantised(c: tuple[int, int, int]) -> tuple[int, int, int]:
    r, g, b = c
    return ((r >> 3) << 3) + 4, ((g >> 3) << 3) + 4, ((b >> 3) << 3) + 4


def _rgb(code: str) -> tuple[int, int, int]:
    return int(code[0:2], 16), int(code[2:4], 16), int(code[4:6], 16)


class Regions:
    """The regions of one image's tags, on the full-size image."""

    def __init__(self, data: bytes) -> None:
        self.img = PILImage.open(io.BytesIO(data)).convert("RGB")
        w, h = self.img.size
        background = PILImage.new("RGB", self.img.size, self.img.getpixel((0, 0)))
        box = ImageChops.difference(self.img, background).getbbox()
        assert box is not None
        self.box = box
        self.margin = 2 * max(w, h) / THUMB

    def region(self, group: Detection, alone: bool, shoe: int) -> tuple[int, int, int, int]:
        x0, y0, x1, y1 = self.box
        if not alone:
            fl, ft, fr, fb = REGION_LAYOUT[group]
            bw, bh = x1 - x0, y1 - y0
            x0, y0, x1, y1 = x0 + fl * bw, y0 + ft * bh, x0 + fr * bw, y0 + fb * bh
        if group is Detection.SHOES:
            mid = (x0 + x1) / 2
            x0, x1 = (x0, mid) if shoe == 0 else (mid, x1)
        w, h = self.img.size
        m = self.margin
        return (
            max(0, math.floor(x0 - m)),
            max(0, math.floor(y0 - m)),
            min(w, math.ceil(x1 + m)),
            min(h, math.ceil(y1 + m)),
        )

    def colours(self, box: tuple[int, int, int, int]) -> list[tuple[int, int, int]]:
        found = self.img.crop(box).getcolors(maxcolors=1 << 16)
        assert found is not None
        return [c for _, c in found]


def check_tag(name: str, regions: Regions, tag: Tag, alone: bool, shoe: int) -> None:
    group = Detection(tag.info[0].id)
    box = regions.region(group, alone, shoe)
    pixels = regions.colours(box)
    where = f"{name} {group.value} tag {shoe}: region {box} has {pixels}"
    named = {TAX.colors[TAX.nearest_color(*_quantised(p))].id for p in pixels}
    codes = {TAX.palette.code(TAX.palette.nearest(*_quantised(p))) for p in pixels}
    assert tag.colors, where
    for colour in tag.colors:
        assert colour.id in named, f"{colour} is no colour of {where}"
    confidences = [c.confidence for c in tag.colors]
    assert confidences == sorted(confidences, reverse=True), where
    assert tag.color_details, where
    for detail in tag.color_details:
        assert detail.code in codes, f"{detail} is no colour of {where}"
        nearest = min(math.dist(_rgb(detail.code), p) for p in pixels)
        assert nearest <= PALETTE_TOLERANCE, f"{detail} is {nearest:.0f} from {where}"
    fractions = [d.pixel_fraction for d in tag.color_details]
    assert fractions == sorted(fractions, reverse=True), f"{fractions} unsorted: {where}"
    assert sum(fractions) <= 1.0001
    assert tag.position is not None
    w, h = regions.img.size
    assert box[0] <= tag.position.x * w <= box[2], f"{tag.position}: {where}"
    assert box[1] <= tag.position.y * h <= box[3], f"{tag.position}: {where}"


def check_response(name: str, response: TaggingResponse) -> list[Tag]:
    assert response.ok and response.data is not None, (name, response)
    tags = [t for o in response.data.objects for t in o.tags]
    assert not response.data.notmatchedobjects
    groups = {t.info[0].id for t in tags}
    regions = Regions(IMAGES[name])
    shoes = 0
    for tag in tags:
        check_tag(name, regions, tag, len(groups) == 1, shoes)
        shoes += tag.info[0].id == Detection.SHOES.value
    return tags


@contextlib.asynccontextmanager
async def image_server() -> AsyncIterator[str]:
    async def png(request: web.Request) -> web.Response:
        return web.Response(body=IMAGES[request.match_info["name"]], content_type="image/png")

    app = web.Application()
    app.router.add_get("/{name}.png", png)
    app.router.add_get("/again/{name}.png", png)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


async def test_every_tag_has_the_colours_of_its_region_single_and_bulk(
    start_service: StartService, client_for: Callable[..., TaggerClient]
) -> None:
    every = list(Detection)
    async with image_server() as images:
        service = await start_service(fetch=True)
        client = client_for(service.url)
        single: dict[str, TaggingResponse] = {}
        for name in IMAGES:
            url = Image(type=ImageType.URL, content=f"{images}/{name}.png")
            single[name] = await client.tag(url, Context(detection=every))
            check_response(name, single[name])
        for name in ("red-rectangle", "figure-2", "figure-7"):
            content = "data:image/png;base64," + base64.b64encode(IMAGES[name]).decode()
            as_base64 = await client.tag(
                Image(type=ImageType.BASE64, content=content), Context(detection=every)
            )
            assert as_base64 == single[name], name

        names = [*IMAGES, *(f"again/{n}" for n in IMAGES)]
        created = await client.create_task(
            [
                TaggingRequest(
                    image=Image(type=ImageType.URL, content=f"{images}/{name}.png"),
                    context=BulkContext(id=name, detection=every),
                )
                for name in names
            ]
        )
        with anyio.fail_after(20):
            while not (await client.task_status(created.task_id)).done:
                await anyio.sleep(0.02)
        page = await client.task_results(created.task_id, size=100)
        assert [r.id for r in page.results] == names
        bulk = {r.id: r.tagging_result for r in page.results}

    pairs = several = 0
    for name in IMAGES:
        tags = check_response(name, bulk[name])
        # Reproducible from the image content: same bytes, same result, whatever the URL or
        # the endpoint.
        assert bulk[name] == single[name] == bulk[f"again/{name}"], name
        groups = [t.info[0].id for t in tags]
        pairs += groups.count(Detection.SHOES.value) == 2
        several += len(set(groups)) >= 3
    # The images cover what the regions are about: pairs of shoes, several products at once.
    assert pairs >= 2 and several >= 2, (pairs, several)


def test_the_issue_red_rectangle_has_no_made_up_colours() -> None:
    """The issue's case at the analyzer: a red rectangle on white, every detection type."""
    from fashiontag_pipeline.service import ReferenceAnalyzer
    from fashiontag_pipeline.service.analyzer import ALL_DETECTIONS

    analyzer = ReferenceAnalyzer(TAX)
    response = analyzer.render(analyzer.from_bytes(IMAGES["red-rectangle"]), ALL_DETECTIONS, 0)
    tags = check_response("red-rectangle", response)
    assert len({t.info[0].id for t in tags}) >= 2
    for tag in tags:
        assert [c.name for c in tag.colors] == ["red"]
        assert [d.code for d in tag.color_details] == ["e41b1b"]
