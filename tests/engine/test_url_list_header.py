"""A list of image URLs exported with a header line (``SELECT image_url FROM products`` saved
as CSV: one column, named): found by a hunt; failed before its fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from fashiontag_pipeline import ManifestError
from fashiontag_pipeline.engine.source import open_manifest


@pytest.mark.parametrize("header", ["url", "image_url", '"Image URL"'])
def test_a_url_list_under_a_header_line_says_how_to_read_it(tmp_path: Path, header: str) -> None:
    """Refused as ``is neither JSONL nor a CSV with a header naming id and url (missing column:
    id)``, nothing saying that the same file without its header line is a URL list the engine
    reads (each URL its own id). The refusal says both ways to go on now."""
    p = tmp_path / "m.csv"
    p.write_text(f"{header}\nhttps://img.example/1.jpg\nhttps://img.example/2.jpg\n")
    with pytest.raises(ManifestError) as refused:
        open_manifest(str(p), 0)
    message = str(refused.value)
    assert "URL list" in message and "header line" in message, message
    assert "id column" in message, message
