"""The metrics op of each request the client sends (names of DESIGN's metrics contract)."""

from __future__ import annotations

import pytest

from fashiontag_pipeline._http import BULK_PATH, SINGLE_PATH
from fashiontag_pipeline.daemon.runner import op_of


@pytest.mark.parametrize(
    ("method", "path", "op"),
    [
        ("POST", BULK_PATH, "create"),
        ("PUT", f"{BULK_PATH}/t-1", "append"),
        ("GET", BULK_PATH, "list"),
        ("GET", f"{BULK_PATH}/t-1/status", "status"),
        ("GET", f"{BULK_PATH}/t-1", "results"),
        ("POST", SINGLE_PATH, "single"),
    ],
)
def test_every_request_has_its_op(method: str, path: str, op: str) -> None:
    assert op_of(method, path) == op
