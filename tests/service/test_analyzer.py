"""The reference analyzer and taxonomy: every rule of spec 2.3, for any content and detection."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from fashiontag_pipeline._models import LANGUAGES, Detection, Tag, TaggingResponse
from fashiontag_pipeline.service import ReferenceAnalyzer, load_taxonomy, parse_accept_language
from fashiontag_pipeline.service.analyzer import CLOTHING_MASK, Analysis, detection_mask

ANALYZER = ReferenceAnalyzer()
CLOTHING = {Detection.TOP, Detection.BOTTOM, Detection.WHOLEBODY, Detection.SWIMWEAR}
TYPE_OF = {
    Detection.TOP: "CLOTHING",
    Detection.BOTTOM: "CLOTHING",
    Detection.WHOLEBODY: "CLOTHING",
    Detection.SWIMWEAR: "CLOTHING",
    Detection.SHOES: "SHOES",
    Detection.BAG: "BAGS",
    Detection.HAT: "HATS",
    Detection.JEWELRY: "JEWELRIES",
    Detection.ACCESSORY: "ACCESSORIES",
}


def check_tag(tag: Tag) -> None:
    assert 1 <= len(tag.colors) <= 3
    assert tag.item is not None and tag.item.confidence is not None
    assert tag.category is not None and tag.info
    assert tag.position is not None and 0 <= tag.position.x <= 1 and 0 <= tag.position.y <= 1
    scored = [*tag.colors, *tag.details, *tag.prints, *tag.textures, *tag.looks]
    scored += [*tag.main_materials, *tag.sub_materials]
    scored += [
        s
        for s in (
            tag.length,
            tag.neck_line,
            tag.fit,
            tag.shape,
            tag.heel_height,
            tag.toe_type,
            tag.heel_shape,
            tag.sole_type,
        )
        if s is not None
    ]
    for s in scored:
        assert s.confidence is not None and 0.2 <= s.confidence <= 1.0, s
    assert tag.color_details
    assert sum(d.pixel_fraction for d in tag.color_details) <= 1.0001
    fractions = [d.pixel_fraction for d in tag.color_details]
    assert fractions == sorted(fractions, reverse=True)
    confidences = [c.confidence or 0.0 for c in tag.colors]
    assert confidences == sorted(confidences, reverse=True)
    for d in tag.color_details:
        assert len(d.code) == 6 and int(d.code, 16) >= 0 and d.name
    if tag.pair_index is not None:
        assert 0 <= tag.pair_index <= 100


def check_response(response: TaggingResponse, wanted: set[Detection]) -> None:
    assert response.ok and response.data is not None
    data = response.data
    allowed_types = {TYPE_OF[d] for d in wanted}
    types = [o.type for o in data.objects]
    assert len(types) == len(set(types))
    if types != ["no detected product"]:
        assert set(types) <= allowed_types
    for obj in data.objects:
        for tag in obj.tags:
            check_tag(tag)
            assert Detection(tag.info[0].id) in wanted
        if obj.type == "SHOES":
            pairs: dict[int, int] = {}
            for tag in obj.tags:
                assert tag.pair_index is not None
                pairs[tag.pair_index] = pairs.get(tag.pair_index, 0) + 1
            assert all(n <= 2 for n in pairs.values())
    if not wanted <= CLOTHING:
        assert data.notmatchedobjects == []
    for obj in data.notmatchedobjects:
        for tag in obj.tags:
            assert Detection(tag.info[0].id) not in wanted
            check_tag(tag)
    if data.gender_info is not None:
        assert data.gender_info.name in ("male", "female", "unknown")


@settings(max_examples=300, deadline=None)
@given(
    h=st.integers(min_value=0, max_value=2**64 - 1),
    wanted=st.sets(st.sampled_from(list(Detection)), min_size=1),
    lang=st.integers(min_value=0, max_value=3),
)
def test_rules_hold_for_any_content(h: int, wanted: set[Detection], lang: int) -> None:
    response = ANALYZER.render(Analysis(h), detection_mask(sorted(wanted), 0), lang)
    check_response(response, wanted)


def test_render_is_pure_and_language_only_changes_names() -> None:
    for h in range(50):
        en = ANALYZER.render(Analysis(h * 7919), CLOTHING_MASK, 0)
        assert en == ANALYZER.render(Analysis(h * 7919), CLOTHING_MASK, 0)
        ko = ANALYZER.render(Analysis(h * 7919), CLOTHING_MASK, 1)
        assert en.data is not None and ko.data is not None
        en_ids = [t.item.id for o in en.data.objects for t in o.tags if t.item]
        ko_ids = [t.item.id for o in ko.data.objects for t in o.tags if t.item]
        assert en_ids == ko_ids


def test_shoe_pairs_share_pair_index() -> None:
    pairs = 0
    for h in range(400):
        response = ANALYZER.render(Analysis(h), detection_mask([Detection.SHOES], 0), 0)
        assert response.data is not None
        for obj in response.data.objects:
            if obj.type == "SHOES" and len(obj.tags) == 2:
                assert obj.tags[0].pair_index == obj.tags[1].pair_index
                pairs += 1
    assert pairs > 10


def test_text_hash_differs_by_url() -> None:
    assert ANALYZER.from_text("https://a/1.jpg") != ANALYZER.from_text("https://a/2.jpg")


def test_taxonomy_has_every_language_and_a_big_palette() -> None:
    tax = load_taxonomy()
    assert tax.palette.size > 2000
    codes = {tax.palette.code(i) for i in range(tax.palette.size)}
    assert len(codes) > 1900
    assert len(tax.colors) == 18
    for lang in LANGUAGES:
        catalogue = tax.catalogue(lang)
        for entries in catalogue.values():
            assert entries and all(e["id"] and e["name"] for e in entries)
    en = tax.catalogue("en")
    ko = tax.catalogue("ko")
    assert [e["id"] for e in en["item"]] == [e["id"] for e in ko["item"]]
    assert en["item"][0]["name"] != ko["item"][0]["name"]
    assert tax.palette.name(5, 0) != tax.palette.name(5, 3)
    assert tax.palette.nearest(255, 0, 0) != tax.palette.nearest(0, 0, 255)
    assert tax.palette.code(tax.palette.nearest(128, 128, 128)) in ("777777", "888888")


def test_accept_language() -> None:
    assert parse_accept_language("ko-KR,ko;q=0.9") == "ko"
    assert parse_accept_language("zh-CN") == "zh"
    assert parse_accept_language("fr, ja;q=0.5, ko;q=0.7") == "ko"
    assert parse_accept_language("ja;q=0, en;q=0.1") == "en"
    assert parse_accept_language("xx") == "en"
    assert parse_accept_language("") == "en"
    assert parse_accept_language(None) == "en"
    assert parse_accept_language("*") == "en"
    assert parse_accept_language("ko;q=abc, ja") == "ja"


async def test_a_plugged_in_analyzer_keeps_the_fetch_guards() -> None:
    """A subclass of the reference analyzer (a plugged-in model) downloads through the same
    guarded fetcher: a loopback image host is refused, not fetched."""
    import pytest

    from fashiontag_pipeline.service import ImageRejected

    class MyModel(ReferenceAnalyzer):
        pass

    model = MyModel()
    try:
        with pytest.raises(ImageRejected) as err:
            await model.from_url("http://127.0.0.1:9/product.png")
        assert "not a public address" in str(err.value)
    finally:
        await model.aclose()
