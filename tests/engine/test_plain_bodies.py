"""A chunk of plain rows (id and URL alone, each request kept as its URL) is encoded as the
very bytes its structs give: :mod:`fashiontag_pipeline.engine.plainbody`.

The fast path (the JSON built around the ids and URLs) and its fallback (the structs, for a
chunk with a quote in an id or URL, or with rows of other shapes) are both compared with
msgspec's encoding of the structs, on every kind of character JSON escapes or passes as is.
"""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fashiontag_pipeline._models import (
    BulkContext,
    Detection,
    Image,
    ImageType,
    TaggingRequest,
)
from fashiontag_pipeline.engine import plainbody
from fashiontag_pipeline.engine.intake import _namespaced
from fashiontag_pipeline.engine.policy import (
    ChunkCutter,
    batch_size,
    chunk_cut,
    decode_body,
    encode_body,
    item_size,
    text_size,
)
from fashiontag_pipeline.engine.reuse.fingerprint import Fingerprinter

ODD = [
    "plain",
    'a"quote',
    '",',
    '","',
    "back\\slash",
    "\\",
    'ends with \\"',
    "tab\there",
    "nl\nand\rcr",
    "nul\x00",
    "\x01\x1f\x7f",
    "caf\u00e9",
    "\u65e5\u672c",
    "\U0001f600",
    "</script><script>alert(1)</script>",
    "\u2028\u2029",
    "<>&'",
    "",
]


def _structs(ids: list[str], urls: list[str]) -> list[TaggingRequest]:
    return [
        TaggingRequest(Image(ImageType.URL, url), BulkContext(ident))
        for ident, url in zip(ids, urls, strict=True)
    ]


def _same_bytes(ids: list[str], requests: list[TaggingRequest | str]) -> bytes:
    built = [plainbody.request_of(i, r) for i, r in zip(ids, requests, strict=True)]
    expected = msgspec.json.encode(built)
    got = plainbody.encode_requests(ids, requests)
    assert got == expected
    return got


@pytest.mark.parametrize("odd", ODD)
def test_plain_chunks_are_the_structs_bytes(odd: str) -> None:
    for ids, urls in (
        ([f"id-{odd}", "b"], ["https://h/a", "https://h/b"]),
        (["a", "b"], [f"https://h/{odd}", "https://h/b"]),
        ([odd], [odd]),
        ([odd, odd + "x", "c"], [f"https://h/{odd}?q={odd}", odd, "https://h/c"]),
    ):
        body = _same_bytes(ids, list(urls))
        assert msgspec.json.decode(body, type=list[TaggingRequest]) == _structs(ids, urls)


def test_the_fast_path_is_taken_only_without_quotes(monkeypatch: pytest.MonkeyPatch) -> None:
    built: list[str] = []
    real = plainbody.request_of

    def counted(ident: str, request: TaggingRequest | str) -> TaggingRequest:
        built.append(ident)
        return real(ident, request)

    monkeypatch.setattr(plainbody, "request_of", counted)
    ids = ["a\\", "b\n", "</script>", "\u00e9\U0001f600"]
    urls = ["https://h/\\", "https://h/\x00", "https://h/</script>", "https://h/\u2028"]
    _same_bytes(ids, list(urls))
    assert built == ids  # (the test's own expectation only: the fast path built none)
    built.clear()
    quoted = ['a"', *ids[1:]]
    _same_bytes(quoted, list(urls))
    assert built == quoted * 2  # (and the fallback's structs)


@pytest.mark.parametrize("odd", ODD)
def test_unescaped_chunks_are_built_as_text(odd: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A chunk whose ids and URLs msgspec writes unescaped is built as text (the JSON around
    them, encoded once); one with a character msgspec escapes (a quote, a backslash, a
    control character) from each string's encoding, or from the structs: the same bytes."""
    taken: list[int] = []
    real = plainbody._unescaped

    def spied(ids: list[str], urls: list[str]) -> bytes:
        taken.append(len(ids))
        return real(ids, urls)

    monkeypatch.setattr(plainbody, "_unescaped", spied)
    for ids, urls in (
        ([f"id-{odd}", "b"], ["https://h/a", "https://h/b"]),
        (["a", "b"], [f"https://h/{odd}", "https://h/b"]),
    ):
        taken.clear()
        _same_bytes(ids, list(urls))
        escaped = b"\\" in msgspec.json.encode(odd)
        assert taken == ([] if escaped else [2]), odd


def test_mixed_chunks_take_the_structs() -> None:
    """Rows of other shapes (every context field kind) beside plain rows: the structs."""
    context = BulkContext(
        'ctx\u00e9"1',
        detection=[Detection.TOP, Detection.BAG],
        gender="female",
        brand='Br"and\\',
        currency="KRW",
        price="12,000",
        age=["20s", "30\u00e9"],
        keywords="</script>",
        product_content_name="n\x00ame",
        season="SS\n24",
    )
    full = TaggingRequest(Image(ImageType.URL, "https://h/full"), context)
    ids = ["p1", context.id, "p2"]
    requests: list[TaggingRequest | str] = ["https://h/1", full, "https://h/2"]
    _same_bytes(ids, requests)
    _same_bytes([context.id], [full])
    assert plainbody.encode_requests([], []) == b"[]"


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(st.text(st.characters(exclude_categories=["Cs"])), st.text()),
        min_size=1,
        max_size=8,
    )
)
def test_random_plain_chunks_are_the_structs_bytes(rows: list[tuple[str, str]]) -> None:
    ids = [ident for ident, _ in rows]
    urls = [url for _, url in rows]
    try:
        expected = msgspec.json.encode(_structs(ids, urls))
    except UnicodeEncodeError:  # a lone surrogate: neither path encodes it
        with pytest.raises(UnicodeEncodeError):
            plainbody.encode_requests(ids, list(urls))
        return
    assert plainbody.encode_requests(ids, list(urls)) == expected


def test_chunk_bodies_and_sizes_of_plain_rows() -> None:
    ids = ["a", 'q"', "\u00e9"]
    urls = ["https://h/1", "https://h/2", "https://h/\u2028"]
    structs = _structs(ids, urls)
    for sends in (0, 3):
        plain = encode_body([1, 2, 3], list(urls), sends, ids)
        assert plain == encode_body([1, 2, 3], structs, sends)
        assert decode_body(plain[0]) == list(zip([1, 2, 3], structs, strict=True))
    items = list(zip(ids, [1, 2, 3], urls, strict=True))
    struct_items = list(zip(ids, [1, 2, 3], structs, strict=True))
    assert [item_size(i) for i in items] == [text_size(r) for r in structs]
    assert batch_size(items) >= sum(map(text_size, structs))
    assert chunk_cut(items, 3, 25) == chunk_cut(struct_items, 3, 25)
    cutter = ChunkCutter(3, 25)
    cutter.added(items)
    assert cutter.cut(list(items)) == chunk_cut(struct_items, 3, 25)


class _Ids:
    def sent(self, job: int, ident: str) -> str:
        return f"{job}/{ident}"


class _Jobs:
    ids = _Ids()


def test_plain_rows_are_namespaced_and_fingerprinted_as_their_structs() -> None:
    items = [("a", 1, "https://h/1"), ("b", 2, _structs(["b"], ["https://h/2"])[0])]
    out = _namespaced(items, 7, _Jobs())  # type: ignore[arg-type]
    assert [i for i, _, _ in out] == ["7/a", "7/b"]
    ids = [i for i, _, _ in out]
    assert plainbody.encode_requests(ids, [r for _, _, r in out]) == msgspec.json.encode(
        _structs(ids, ["https://h/1", "https://h/2"])
    )
    prints = Fingerprinter(language="ko")
    assert prints.of("https://h/1") == prints.of(_structs(["x"], ["https://h/1"])[0])
