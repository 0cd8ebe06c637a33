"""Counting outcomes must not depend on how a server formats its JSON."""

from __future__ import annotations

import msgspec
import pytest

from fashiontag_pipeline.engine.sinks import PageRow, count_outcomes


def _row(raw: bytes) -> PageRow:
    return PageRow("x", msgspec.Raw(raw))


@pytest.mark.parametrize(
    ("raw", "ok"),
    [
        (b'{"status":"success","data":{}}', 1),
        (b'{ "status" : "success" , "data" : {} }', 1),
        (b'{\n  "status": "success",\n  "data": {}\n}', 1),
        (b'{"status":"failure","error":{"code":803,"message":"x"}}', 0),
        (b'{"status": "fail", "error": {"code": 803}}', 0),
        (b'{"data":{},"status":"success"}', 1),  # status last
        (b'{"data": {}, "status" : "failure" }\n', 0),
        (b'{"data":{},"status":"success","x":1}', 1),  # status between keys: decoded
        (b'{"status":"failure","data":{"k":{"status":"success"}}}', 0),
        (b'{"data":{"status":"failure"},"status":"success"}', 1),  # a nested status is not it
        (b'{"error":{"code":803},"data":{"status":"success"},"status":"failure"}', 0),
    ],
)
def test_count_outcomes_reads_the_top_level_status_whatever_the_spacing(
    raw: bytes, ok: int
) -> None:
    assert count_outcomes([_row(raw)]) == (ok, 1 - ok)
