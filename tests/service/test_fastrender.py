"""The fast JSON rendering path gives exactly what the msgspec-struct rendering gives."""

from __future__ import annotations

import random
from typing import Any

import aiohttp
import anyio
import msgspec

from fashiontag_pipeline._models import (
    LANGUAGES,
    STATUS_SUCCESS,
    Detection,
    ResultItem,
    TaskInfo,
    TaskResultsData,
    TaskResultsResponse,
)
from fashiontag_pipeline.service import RunningService
from fashiontag_pipeline.service.analyzer import (
    ALL_DETECTIONS,
    CLOTHING_MASK,
    Analysis,
    ImageRejected,
    ReferenceAnalyzer,
    content_hash,
    failure_response,
)
from fashiontag_pipeline.service.errors import FAILURE_MESSAGES
from fashiontag_pipeline.service.pixels import pack_measurement, pack_measurements
from fashiontag_pipeline.service.store import OUTCOME_DONE

from .conftest import BULK_KEY, StartService

ANALYZER = ReferenceAnalyzer()
ENCODER = msgspec.json.Encoder()
BULK = "/tagger/v2.12/bulk"


def random_measurement(rng: random.Random) -> bytes:
    """A packed colour measurement like the ones fetch mode stores: 0-8 region measurements
    (more or fewer than the scene has tags, too), or one whole-product measurement as services
    before per-region measurement stored."""
    tax = ANALYZER.taxonomy

    def region() -> bytes:
        n = rng.randint(1, 3)
        colors = [(i, rng.random()) for i in rng.sample(range(len(tax.colors)), n)]
        details = [
            (rng.randrange(tax.palette.size), rng.random()) for _ in range(rng.randint(1, 5))
        ]
        return pack_measurement(colors, details, rng.random(), rng.random())

    if rng.random() < 0.2:
        return region()
    return pack_measurements([region() for _ in range(rng.randint(0, 8))])


def random_mask(rng: random.Random) -> int:
    return rng.choice([CLOTHING_MASK, ALL_DETECTIONS, rng.randrange(1, ALL_DETECTIONS + 1)])


def slow_json(analysis: Analysis, mask: int, lang: int) -> bytes:
    return ENCODER.encode(ReferenceAnalyzer.render(ANALYZER, analysis, mask, lang))


def test_fast_render_equals_struct_render_no_fetch_and_fetch() -> None:
    rng = random.Random(20260101)
    for i in range(4000):
        h = rng.getrandbits(64)
        measured = random_measurement(rng) if i % 2 else None
        analysis = Analysis(h, measured)
        mask, lang = random_mask(rng), rng.randrange(len(LANGUAGES))
        fast = ANALYZER.render_json(analysis, mask, lang)
        slow = slow_json(analysis, mask, lang)
        assert msgspec.json.decode(fast) == msgspec.json.decode(slow), (h, measured, mask, lang)
        # Same encoder, same fragments: the bytes match too.
        assert fast == slow


def test_fast_render_equals_struct_render_measured_images() -> None:
    """Real measurements: figures whose scenes have several products, pairs of shoes and
    single shoes, each tag with its own region's colours."""
    from .test_colors import IMAGES

    rng = random.Random(20261123)
    for data in IMAGES.values():
        analysis = ANALYZER.from_bytes(data)
        for mask in (ALL_DETECTIONS, CLOTHING_MASK, rng.randrange(1, ALL_DETECTIONS + 1)):
            for lang in range(len(LANGUAGES)):
                assert ANALYZER.render_json(analysis, mask, lang) == slow_json(analysis, mask, lang)


def test_rounding_ties_and_edges_match_round() -> None:
    from fashiontag_pipeline.service._fragments import k4 as _k4

    rng = random.Random(7)
    edges = [0.0, 1.0, 0.2, 0.19995, 0.03125, 1 / 32 * 3, 0.00005, 0.99995, 1.275, 1.99994]
    edges += [k / 32 for k in range(64)] + [k / 20000 for k in range(0, 40000, 7)]
    edges += [rng.random() for _ in range(20000)]
    for x in edges:
        assert _k4(x) / 10000 == round(x, 4), x


def test_subclass_overriding_render_is_encoded() -> None:
    class Custom(ReferenceAnalyzer):
        def render(self, analysis: Analysis, detection: int, lang: int) -> Any:
            return failure_response(500, "custom")

    out = Custom(ANALYZER.taxonomy).render_json(Analysis(1), CLOTHING_MASK, 0)
    assert msgspec.json.decode(out) == {
        "status": "failure",
        "error": {"code": 500, "message": "custom"},
    }


class FakeFetchAnalyzer(ReferenceAnalyzer):
    """Fetch mode without a network: a URL gives a measurement, or fails (every 7th)."""

    async def from_url(self, url: str) -> Analysis:
        h = content_hash(url.encode())
        if h % 7 == 0:
            raise ImageRejected(803 if h % 2 else 805, "no")
        return Analysis(h, random_measurement(random.Random(h)))


async def _page(service: RunningService, task_id: str, offset: int, lang: str) -> bytes:
    async with (
        aiohttp.ClientSession() as session,
        session.get(
            f"{service.url}{BULK}/{task_id}",
            params={"offset": str(offset), "size": "100"},
            headers={"x-api-key": BULK_KEY, "accept-language": lang},
        ) as resp,
    ):
        assert resp.status == 200
        return await resp.read()


def _slow_page(service: RunningService, task_id: str, offset: int, lang: int) -> bytes:
    """The results page as the service rendered it before the fast path (structs)."""
    task = service.store.tasks[task_id]
    results = []
    for index in range(offset, min(offset + 100, task.total)):
        outcome = task.outcome(index)
        if outcome == OUTCOME_DONE:
            tagging = ReferenceAnalyzer.render(
                service.state.analyzer,  # type: ignore[arg-type]
                task.analysis(index),
                task.masks[index],
                lang,
            )
        else:
            tagging = failure_response(outcome, FAILURE_MESSAGES.get(outcome, "tagging failed"))
        results.append(ResultItem(id=task.ids[index], tagging_result=tagging))
    return ENCODER.encode(
        TaskResultsResponse(
            status=STATUS_SUCCESS,
            data=TaskResultsData(
                task_info=TaskInfo(total_count=task.total, offset=offset, size=100),
                results=results,
            ),
        )
    )


async def _create(service: RunningService, n: int, seed: int) -> str:
    rng = random.Random(seed)
    detections = [d.value for d in Detection]
    body = {
        "taggingRequest": [
            {
                "image": {"type": "url", "content": f"https://cdn.test/fast/{seed}/{i}.jpg"},
                "context": {
                    # ids that need JSON escaping too
                    "id": f'id-{i}-"\\ü\n' if i % 5 == 0 else f"id-{i}",
                    **(
                        {"detection": rng.sample(detections, rng.randint(1, len(detections)))}
                        if i % 3
                        else {}
                    ),
                },
            }
            for i in range(n)
        ]
    }
    async with (
        aiohttp.ClientSession() as session,
        session.post(service.url + BULK, json=body, headers={"x-api-key": BULK_KEY}) as resp,
    ):
        assert resp.status == 202
        task_id: str = (await resp.json())["taskId"]
    with anyio.fail_after(10):
        while service.store.tasks[task_id].processed < n:
            await anyio.sleep(0.01)
    return task_id


async def test_results_pages_equal_struct_rendering_no_fetch(
    start_service: StartService,
) -> None:
    service = await start_service()
    task_id = await _create(service, 1000, seed=1)
    for offset in range(0, 1000, 100):
        for lang in range(len(LANGUAGES)):
            fast = await _page(service, task_id, offset, LANGUAGES[lang])
            slow = _slow_page(service, task_id, offset, lang)
            assert msgspec.json.decode(fast) == msgspec.json.decode(slow)
            assert fast == slow
    # A page past the end has no results.
    fast = await _page(service, task_id, 1000, "en")
    assert msgspec.json.decode(fast) == msgspec.json.decode(_slow_page(service, task_id, 1000, 0))


async def test_results_pages_equal_struct_rendering_fetch(start_service: StartService) -> None:
    service = await start_service(fetch=True, analyzer=FakeFetchAnalyzer())
    task_id = await _create(service, 600, seed=2)
    task = service.store.tasks[task_id]
    assert 0 < task.failures < task.total
    for offset in range(0, 600, 100):
        for lang in range(len(LANGUAGES)):
            fast = await _page(service, task_id, offset, LANGUAGES[lang])
            slow = _slow_page(service, task_id, offset, lang)
            assert msgspec.json.decode(fast) == msgspec.json.decode(slow)
            assert fast == slow
