"""The engine does not depend on how the reference service formats its JSON.

A real service may put spaces after colons and commas, order keys differently and add fields
(DESIGN section 3). The reference service is driven through :mod:`benchmarks.foreign`, a proxy
that re-encodes every JSON body that way; outcomes and their counts must be what they are
without it.
"""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks.foreign import EXTRA_FIELD, foreign_proxy, reformat
from fashiontag_pipeline.engine import EngineConfig, run_pipeline
from fashiontag_pipeline.service import ServiceConfig, running_service
from fashiontag_pipeline.service.analyzer import Analysis, ImageRejected, ReferenceAnalyzer

from .helpers import assert_exactly_once, client_config

FAST = EngineConfig(rotate_images=400, poll_min=0.02, poll_max=0.2, linger_seconds=0.2)


class _FailsBadUrls(ReferenceAnalyzer):
    """Tags from the URL text without downloading; ``/bad/`` URLs fail as undownloadable."""

    async def from_url(self, url: str) -> Analysis:
        if "/bad/" in url:
            raise ImageRejected(803, "image URL could not be fetched")
        return self.from_text(url)


def _manifest(path: Path, n: int) -> tuple[Path, set[str]]:
    lines = ["id,url"]
    bad: set[str] = set()
    for i in range(n):
        if i % 7 == 3:
            bad.add(f"p{i}")
            lines.append(f"p{i},https://img.example/bad/{i}.jpg")
        else:
            lines.append(f"p{i},https://img.example/{i}.jpg")
    path.write_text("\n".join(lines) + "\n")
    return path, bad


def test_reformat_spacing_order_and_extra_field() -> None:
    body = b'{"status":"success","data":{"results":[{"id":"a","taggingResult":{"status":"x"}}]}}'
    text = reformat(body).decode()
    assert '"status": "success"' in text and '{"status":' not in text
    again = json.loads(text)
    assert list(again)[-1] == "status" and EXTRA_FIELD in again
    result = again["data"]["results"][0]
    assert EXTRA_FIELD in result and EXTRA_FIELD in result["taggingResult"]
    assert reformat(b"not json") == b"not json"


async def test_outcomes_counted_right_through_foreign_formatting(tmp_path: Path) -> None:
    n = 1200
    manifest, bad = _manifest(tmp_path / "m.csv", n)
    out, rej = tmp_path / "out.jsonl", tmp_path / "rej.jsonl"
    config = ServiceConfig(fetch=True, analyzer=_FailsBadUrls())
    async with running_service(config) as svc, foreign_proxy(svc.url) as url:
        summary = await run_pipeline(
            [manifest], client=client_config(url), out=out, rejects=rej, engine=FAST
        )
    assert summary.complete
    outcomes = assert_exactly_once(out, rej, {f"p{i}" for i in range(n)})
    failed = {r["id"] for r in outcomes.results if r["taggingResult"]["status"] == "failure"}
    assert failed == bad
    # The run's counts agree with the lines it wrote, whatever the server's formatting.
    assert summary.failed == len(bad)
    assert summary.tagged == n - len(bad)
    # Results went through as the server sent them (its unknown field included).
    assert all(EXTRA_FIELD in r["taggingResult"] for r in outcomes.results)


async def test_a_pretty_printing_server_still_gives_one_line_per_result(tmp_path: Path) -> None:
    """A server that answers JSON over several lines (CRLF, indented): every result is one
    results line (a CR or LF in a result is whitespace, written as a space), counted right."""
    n = 300
    manifest, bad = _manifest(tmp_path / "m.csv", n)
    out, rej = tmp_path / "out.jsonl", tmp_path / "rej.jsonl"
    config = ServiceConfig(fetch=True, analyzer=_FailsBadUrls())
    async with running_service(config) as svc, foreign_proxy(svc.url, indent=2) as url:
        summary = await run_pipeline(
            [manifest], client=client_config(url), out=out, rejects=rej, engine=FAST
        )
    assert summary.complete
    raw = out.read_bytes()
    assert b"\r" not in raw and raw.count(b"\n") == n  # a failed tagging is a results line too
    outcomes = assert_exactly_once(out, rej, {f"p{i}" for i in range(n)})
    assert {r["id"] for r in outcomes.results if r["taggingResult"]["status"] == "failure"} == bad
    assert summary.failed == len(bad) and summary.tagged == n - len(bad)
