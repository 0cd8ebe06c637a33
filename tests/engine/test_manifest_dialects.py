"""Catalogue manifests as e-commerce teams export them, fed to ``fashiontag run`` (each test
failed before its fix): every row has one outcome, or the manifest is refused saying what to
fix; never rows lost, ids changed or a file read as something else."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from fashiontag_pipeline.service import ServiceConfig, running_service

from .helpers import ENV, read_outcomes, run_args, run_piped

#: A brand opened with a quote that no quote closes (an exporter that does not escape them),
#: a few rows before the end of a small manifest: the csv module read every row after it into
#: that field, row 2 tagged with them as its brand and rows 3 to 5 neither tagged nor rejected.
UNCLOSED = (
    "id,url,brand\n"
    "1,https://x/1.jpg,acme\n"
    "2,https://x/2.jpg,\"Levi's\n"
    "3,https://x/3.jpg,acme\n"
    "4,https://x/4.jpg,acme\n"
    "5,https://x/5.jpg,acme"
)


@pytest.mark.parametrize("how", ["file", "stdin"])
async def test_a_quote_never_closed_costs_its_row_not_the_rows_after_it(
    tmp_path: Path, how: str
) -> None:
    manifest = tmp_path / "m.csv"
    manifest.write_text(UNCLOSED)
    out = tmp_path / "out.jsonl"
    async with running_service(ServiceConfig()) as svc:
        if how == "file":
            args = run_args(svc.url, out, str(manifest))
            result = await anyio.run_process(args, check=False, env=ENV)
        else:
            result = await run_piped(run_args(svc.url, out, "-"), manifest)
    assert result.returncode == 0, result.stderr.decode()[-400:]
    o = read_outcomes(out, out.with_suffix(".rej"))
    assert sorted(o.ids) == ["1", "3", "4", "5"]
    assert [(r["id"], r["line"]) for r in o.rejects] == [(None, 3)]  # its id is unreadable
    assert "not closed" in o.rejects[0]["reason"]
