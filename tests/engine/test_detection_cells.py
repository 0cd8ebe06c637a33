"""A manifest's ``detection`` cell written with commas, the way ``--detection TOP,SHOES`` takes
them (the README shows both): found by a hunt; failed before its fix."""

from __future__ import annotations

from pathlib import Path

from fashiontag_pipeline.engine.source import open_manifest
from fashiontag_pipeline.engine.validate import Validator


def test_detection_values_separated_by_commas_are_a_reject_naming_the_separator(
    tmp_path: Path,
) -> None:
    """``"TOP,SHOES"`` was rejected as ``invalid detection value 'TOP,SHOES' (allowed: TOP,
    ..., SHOES, ...)``: both values plainly allowed, nothing saying that a manifest separates
    them with ``|``. The reason says so now; an unknown value keeps its reason."""
    p = tmp_path / "m.csv"
    p.write_text(
        "id,url,detection\n"
        'a,https://x/a.jpg,"TOP,SHOES"\n'
        "b,https://x/b.jpg,TOP; bag\n"
        'c,https://x/c.jpg,"TOP,DRESS"\n'
        "d,https://x/d.jpg,TOP|SHOES\n"
    )
    reader = open_manifest(str(p), 0)
    batch = reader.read_batch()
    reader.close()
    assert batch is not None
    items, rejects = Validator().validate(batch)
    assert [i[0] for i in items] == ["d"]
    reasons = [r.reason for _, r in rejects]
    for reason, value in zip(reasons[:2], ("TOP,SHOES", "TOP; bag"), strict=True):
        assert value in reason and "separated by |" in reason, reason
        assert "write TOP|" in reason, reason
    assert reasons[2].startswith("invalid detection value 'DRESS'"), reasons[2]
