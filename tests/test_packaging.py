"""The package declares what it uses and uses what it declares."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: Distribution name -> import name, where they differ.
IMPORT_NAMES = {"pillow": "PIL"}


def test_every_runtime_dependency_is_imported_by_the_package() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    source = "\n".join(p.read_text() for p in (ROOT / "fashiontag_pipeline").rglob("*.py"))
    for requirement in project["dependencies"]:
        name = re.split(r"[<>=!~;\[ ]", requirement, maxsplit=1)[0].lower()
        module = IMPORT_NAMES.get(name, name.replace("-", "_"))
        imported = re.search(rf"^\s*(from|import) {re.escape(module)}\b", source, re.M)
        assert imported, f"{name} is declared in pyproject.toml but never imported"
