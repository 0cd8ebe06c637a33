"""The README and docs/ as a new user meets them: every link of both stays inside the
repository, and every code block of the README runs as written (the `python` ones as code; the
`sh` ones unless marked with `<!-- not run by tests: REASON -->`, i.e. where they need a service
of your own or minutes)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
BLOCK = re.compile(
    r"(?:^<!-- (?P<mark>[^\n]*?) -->\n)?^```(?P<lang>\w*)\n(?P<code>.*?)^```$", re.M | re.S
)
ENV = {k: v for k, v in os.environ.items() if not k.startswith("FASHIONTAG_")}


def _blocks(lang: str) -> list[tuple[str, str | None]]:
    text = (ROOT / "README.md").read_text()
    return [(m["code"], m["mark"]) for m in BLOCK.finditer(text) if m["lang"] == lang]


def _anchors(path: Path) -> set[str]:
    """GitHub-style anchors of a markdown file's headings."""
    anchors = set()
    for heading in re.findall(r"^#+ (.+)$", path.read_text(), re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        anchors.add(slug)
    return anchors


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_links_stay_inside_the_repository(doc: Path) -> None:
    text = doc.read_text()
    assert "../shared" not in text
    for target in LINK.findall(text):
        assert not re.match(r"^[a-z]+:", target, re.I), f"{doc.name}: {target} leaves the repo"
        path_part, _, anchor = target.partition("#")
        resolved = (doc.parent / path_part).resolve() if path_part else doc
        assert resolved.is_relative_to(ROOT), f"{doc.name}: {target} leaves the repo"
        assert resolved.exists(), f"{doc.name}: {target} does not exist"
        if anchor and resolved.suffix == ".md":
            assert anchor in _anchors(resolved), f"{doc.name}: no heading for #{anchor}"


def test_there_are_docs_for_the_service_the_engine_and_configuration() -> None:
    names = {p.name for p in DOCS}
    assert {"service.md", "engine.md", "configuration.md"} <= names


@pytest.mark.parametrize("index", range(len(_blocks("python"))))
def test_readme_python_blocks_run_as_written(index: int, tmp_path: Path) -> None:
    code, mark = _blocks("python")[index]
    assert mark is None, "every python block of the README must run"
    result = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )
    assert result.returncode == 0, result.stderr


def test_every_sh_block_runs_or_says_why_not() -> None:
    marks = [mark for _, mark in _blocks("sh") if mark is not None]
    assert all(re.fullmatch(r"not run by tests: \w.*", mark) for mark in marks), marks


@pytest.mark.parametrize("index", [i for i, (_, mark) in enumerate(_blocks("sh")) if mark is None])
def test_readme_self_contained_sh_blocks_run(index: int, tmp_path: Path) -> None:
    code, _ = _blocks("sh")[index]
    # The commands name `.venv/bin/...` from the repository root: give the temp dir the
    # environment this test runs in, so nothing is written inside the repository.
    (tmp_path / ".venv").symlink_to(Path(sys.prefix))
    result = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", code],
        cwd=tmp_path,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_field_of_the_run_summary_is_told_and_whether_it_covers_every_attempt() -> None:
    """``--summary FILE`` is read by loaders and billing checks, yet its fields were named
    nowhere but in passing, and nothing said which of them describe the whole run and which
    only the last attempt of a run stopped and resumed: ``ambiguous_writes`` and
    ``rate_limited`` of a resumed run counted only its last attempt (the ``RunSummary``
    docstring said they covered every one), while ``submitted`` and ``tagged`` count every
    attempt. docs/engine.md holds a table with a row per field; those counted for the last
    attempt only say ``this attempt``."""
    from fashiontag_pipeline.engine.config import RunSummary

    text = (ROOT / "docs" / "engine.md").read_text()
    rows = dict(re.findall(r"^\| `(\w+)` \| (.+) \|$", text, re.M))
    fields = set(RunSummary.__struct_fields__)
    assert fields <= set(rows), f"summary fields not in docs/engine.md: {fields - set(rows)}"
    per_attempt = {f for f in fields if "this attempt" in rows[f]}
    assert per_attempt == {
        "rows_read",
        "retries",
        "rate_limited",
        "ambiguous_writes",
        "expired_writes",
        "elapsed_s",
        "rows_per_s",
    }
