"""The results lines built around a page's ids (:func:`~.result_lines.page_lines`' fast
path) are the bytes msgspec gives for their structs, whatever the ids and results hold."""

from __future__ import annotations

import msgspec
import pytest

from fashiontag_pipeline.engine import result_lines
from fashiontag_pipeline.engine.pages import PageRow, decode_page
from fashiontag_pipeline.engine.result_lines import OutLine, page_lines

_encoder = msgspec.json.Encoder()

IDS = [
    "sku-1",
    "SKU 2",
    "ünï-çødé-👗",
    'a","b',
    'quote"inside',
    "back\\slash",
    "tab\tand\nline",
    "nul\x00",
    "del\x7f",
    "\u2028sep\u2029",
    "",
    '","',
]
RESULTS = [
    b'{"status":"success","tags":["a","b"]}',
    b'{"status":"failure","error":"x\\"y","id":"","taskId":"t"}',
    b'{"tags":{"k":"}\\n{\\"id\\":\\""},"status":"success"}',
    b"",
]


def structs(task_id: str | None, rows: list[PageRow]) -> bytes:
    return _encoder.encode_lines([OutLine(r.id, task_id, r.tagging_result) for r in rows])


@pytest.mark.parametrize("task_id", ["task-1", None, 'odd"task\\id', "t\u00e9"])
@pytest.mark.parametrize("ident", IDS)
def test_each_id_gives_the_structs_bytes(task_id: str | None, ident: str) -> None:
    rows = [
        PageRow(i, msgspec.Raw(raw))
        for i, raw in zip(["x1", ident, "x3", ident + "z"], RESULTS, strict=True)
    ]
    assert page_lines(task_id, rows) == structs(task_id, rows)
    assert page_lines(task_id, rows[1:2]) == structs(task_id, rows[1:2])


def test_fast_path_is_taken_for_plain_ids(monkeypatch: pytest.MonkeyPatch) -> None:
    rows = [PageRow(f"id-{i}", msgspec.Raw(b'{"status":"success"}')) for i in range(100)]
    expected = structs("t", rows)
    made: list[object] = []

    class Counted(OutLine):
        def __post_init__(self) -> None:
            made.append(self)

    monkeypatch.setattr(result_lines, "OutLine", Counted)
    assert page_lines("t", rows) == expected
    assert made == []  # no struct: the lines were built around the ids
    assert (
        page_lines("t", [PageRow('a"b', msgspec.Raw(b"{}"))])
        == b'{"id":"a\\"b","taskId":"t","taggingResult":{}}\n'
    )
    assert len(made) == 1  # an id msgspec escapes: the structs


def test_no_rows_and_a_decoded_page() -> None:
    assert page_lines("t", []) == b""
    body = (
        b'{"status":"success","data":{"results":[{"id":"a\\u0000","taggingResult":{"status":'
        b'"success"}},{"id":"b\\ud83d","taggingResult":{"status":\r\n"failure"}}]}}'
    )
    rows = decode_page(body)
    assert page_lines("t", rows) == structs("t", rows)


def test_a_lone_surrogate_raises_as_the_structs_do() -> None:
    rows = [PageRow("a\ud800", msgspec.Raw(b"{}"))]
    with pytest.raises(Exception) as fast:
        page_lines("t", rows)
    with pytest.raises(Exception) as slow:
        structs("t", rows)
    assert type(fast.value) is type(slow.value)
