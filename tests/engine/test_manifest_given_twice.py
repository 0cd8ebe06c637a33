"""One manifest given twice (``fashiontag run *.csv catalogue.csv``, a hard link beside it):
found by a hunt; failed before its fix."""

from __future__ import annotations

import os
from pathlib import Path

from fashiontag_pipeline.engine.run_checks import same_file


def test_a_manifest_given_twice_is_named_with_both_paths(tmp_path: Path) -> None:
    """Refused as ``manifest and manifest are the same file (b.csv)``: which two? The refusal
    names the manifest given twice, or both names of one file."""
    a = tmp_path / "a.csv"
    a.write_text("id,url\n")
    b = tmp_path / "b.csv"
    os.link(a, b)
    twice = same_file([("manifest", a), ("manifest", tmp_path / "." / "a.csv")])
    assert twice is not None and twice.startswith(f"manifest {a} is given twice"), twice
    linked = same_file([("manifest", a), ("manifest", b)])
    assert linked is not None and f"manifests {a} and {b} are one file" in linked, linked
    other = same_file([("--out", a), ("manifest", b)])
    assert other == f"--out and manifest are the same file ({b}): give each its own path"
