"""Single mode: url and base64 images, pixel colours, languages, error codes."""

from __future__ import annotations

import base64
import io
import time
from collections.abc import Awaitable, Callable

import anyio
import pytest
from PIL import Image as PILImage

from fashiontag_pipeline import TaggerClient
from fashiontag_pipeline._exceptions import ValidationError
from fashiontag_pipeline._models import Context, Detection, Image, ImageType
from fashiontag_pipeline.service import RunningService

from .conftest import requests
from .test_bulk import raw

SINGLE = "/tagger/v2/tags"


def product_png(color: tuple[int, int, int], size: tuple[int, int] = (120, 160)) -> bytes:
    """A plain white background with a coloured product in the middle."""
    img = PILImage.new("RGB", size, (255, 255, 255))
    w, h = size
    img.paste(PILImage.new("RGB", (w // 2, h // 2), color), (w // 4, h // 4))
    out = io.BytesIO()
    img.save(out, format="PNG")
    return out.getvalue()


def data_url(data: bytes, ext: str = "png") -> str:
    return f"data:image/{ext};base64," + base64.b64encode(data).decode()


async def test_url_no_fetch_is_deterministic(client: TaggerClient) -> None:
    image = Image(type=ImageType.URL, content="https://cdn.test/p/1.jpg")
    first = await client.tag(image)
    second = await client.tag(image)
    assert first.ok and first == second
    assert first.data is not None
    assert {o.type for o in first.data.objects} <= {"CLOTHING", "no detected product"}


async def test_base64_colours_are_measured(client: TaggerClient) -> None:
    for color, name in (((200, 20, 30), "red"), ((30, 60, 200), "blue"), ((20, 20, 20), "black")):
        image = Image(type=ImageType.BASE64, content=data_url(product_png(color)))
        response = await client.tag(image, Context(detection=list(Detection)))
        assert response.ok and response.data is not None
        tags = [t for o in response.data.objects for t in o.tags]
        assert tags, response
        top = tags[0]
        assert top.colors[0].name == name
        assert top.colors[0].confidence is not None and top.colors[0].confidence > 0.9
        assert top.color_details and top.color_details[0].pixel_fraction > 0.6
        assert sum(d.pixel_fraction for d in top.color_details) <= 1.0001
        assert top.position is not None
        # Inside the product (the middle half of the image): its region's centroid.
        assert 0.25 <= top.position.x <= 0.75
        assert 0.25 <= top.position.y <= 0.75


async def test_languages(service: RunningService, client: TaggerClient) -> None:
    image = Image(type=ImageType.BASE64, content=data_url(product_png((200, 20, 30))))
    names = {}
    for lang in ("en", "ko", "zh", "ja"):
        response = await client.tag(image, Context(detection=list(Detection)), language=lang)
        assert response.data is not None
        names[lang] = response.data.objects[0].tags[0].colors[0].name
    assert names == {"en": "red", "ko": "레드", "zh": "红色", "ja": "レッド"}
    body = {
        "image": {"type": "base64", "content": image.content},
        "context": {"detection": [d.value for d in Detection]},
    }
    for header, expected in (
        ("ko-KR,ko;q=0.9", "레드"),
        ("fr-FR", "red"),
        ("de, ja;q=0.5", "レッド"),
    ):
        status, payload, _ = await raw(
            service,
            "POST",
            SINGLE,
            body,
            key="single-SECRET-key-0001",
            headers={"accept-language": header},
        )
        assert status == 200
        tags = [t for o in payload["data"]["objects"] for t in o["tags"]]
        assert tags[0]["colors"][0]["name"] == expected


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        ({"image": {"type": "file", "content": "x"}}, 400, 804),
        ({"image": {"type": "base64", "content": "AAAA"}}, 400, 801),
        (
            {
                "image": {"type": "url", "content": "https://x.test/a.jpg"},
                "context": {"detection": ["X"]},
            },
            400,
            825,
        ),
        ({"context": {}}, 400, 824),
        ({"image": {"type": "base64", "content": "data:image/png;base64,!!!"}}, 200, 802),
        ({"image": {"type": "base64", "content": data_url(b"not an image")}}, 200, 805),
        (
            {"image": {"type": "base64", "content": data_url(product_png((1, 2, 3), (4, 4)))}},
            200,
            807,
        ),
        (
            {"image": {"type": "base64", "content": data_url(product_png((1, 2, 3), (800, 20)))}},
            200,
            806,
        ),
    ],
)
async def test_single_error_codes(
    service: RunningService, body: dict[str, object], status: int, code: int
) -> None:
    got, payload, _ = await raw(service, "POST", SINGLE, body, key="single-SECRET-key-0001")
    assert got == status
    assert payload["status"] == "failure" and payload["error"]["code"] == code
    assert payload["error"]["message"]


async def test_single_malformed_json(service: RunningService) -> None:
    status, payload, _ = await raw(
        service, "POST", SINGLE, data=b"{nope", key="single-SECRET-key-0001"
    )
    assert status == 400 and payload["error"]["code"] == 824


async def test_client_maps_single_400(client: TaggerClient) -> None:
    with pytest.raises(ValidationError):
        await client.tag(Image(type=ImageType.BASE64, content="no prefix"))


async def test_detection_rules_single(
    client_for: Callable[..., TaggerClient], service: RunningService
) -> None:
    client = client_for(service.url)
    seen_unmatched = False
    for i in range(60):
        image = Image(type=ImageType.URL, content=f"https://cdn.test/r/{i}.jpg")
        shoes = await client.tag(image, Context(detection=[Detection.SHOES]))
        assert shoes.data is not None
        assert {o.type for o in shoes.data.objects} <= {"SHOES", "no detected product"}
        assert shoes.data.notmatchedobjects == []
        bottom = await client.tag(image, Context(detection=[Detection.BOTTOM]))
        assert bottom.data is not None
        for obj in bottom.data.objects:
            for tag in obj.tags:
                assert tag.info[0].id == "BOTTOM"
        seen_unmatched = seen_unmatched or bool(bottom.data.notmatchedobjects)
    assert seen_unmatched


async def test_single_mode_counts_against_rate(
    start_service: Callable[..., Awaitable[RunningService]],
    client_for: Callable[..., TaggerClient],
) -> None:
    # 20 images/s, a burst of one: 10 single requests need >= 9 / 20 s.
    service = await start_service(rate=20.0)
    client = client_for(service.url)
    image = Image(type=ImageType.URL, content="https://cdn.test/p/rate.jpg")
    started = time.monotonic()
    async with anyio.create_task_group() as tg:
        for _ in range(10):
            tg.start_soon(client.tag, image)
    assert time.monotonic() - started >= 0.4

    # Bulk and single mode share one bucket: 10 bulk + 10 single images take >= 19 / 20 s.
    started = time.monotonic()
    created = await client.create_task(requests(10))
    async with anyio.create_task_group() as tg:
        for _ in range(10):
            tg.start_soon(client.tag, image)
    with anyio.fail_after(10):
        while not (await client.task_status(created.task_id)).done:
            await anyio.sleep(0.01)
    assert time.monotonic() - started >= 0.9


async def test_single_mode_without_rate_does_not_wait(
    service: RunningService, client: TaggerClient
) -> None:
    assert service.state.worker.bucket is None
    image = Image(type=ImageType.URL, content="https://cdn.test/p/free.jpg")
    started = time.monotonic()
    for _ in range(20):
        assert (await client.tag(image)).ok
    assert time.monotonic() - started < 2.0
