"""A PostgreSQL URL with its scheme in capitals (``PostgreSQL://``, as the product is spelt),
given to ``--state``, ``--reuse``, ``reuse stats`` or the daemon's ``--state``: libpq reads only
``postgresql://`` and ``postgres://``, so it is refused, exit 2. Found by a hunt: the refusal
showed the URL with its scheme lower-cased and asked for "a postgresql:// URL", i.e. for the
very text it showed; it shows the URL as given and says the scheme is read in lower case."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

URL = "PostgreSQL://tagger@127.0.0.1:1/fashiontag"


@pytest.mark.parametrize("where", ["run --state", "run --reuse", "reuse stats", "daemon"])
def test_a_postgres_url_in_capitals_is_refused_saying_what_to_write(
    tmp_path: Path, where: str
) -> None:
    manifest = tmp_path / "m.csv"
    manifest.write_text("id,url\na,https://img.example/a.jpg\n")
    inbox = tmp_path / "in"
    inbox.mkdir()
    args = {
        "run --state": ["run", str(manifest), "--state", URL],
        "run --reuse": ["run", str(manifest), "--reuse", URL],
        "reuse stats": ["reuse", "stats", URL],
        "daemon": [
            "daemon",
            "--inbox",
            str(inbox),
            "--outbox",
            str(tmp_path / "o"),
            "--state",
            URL,
        ],
    }[where]
    env = {k: v for k, v in os.environ.items() if not k.startswith("FASHIONTAG_")}
    result = subprocess.run(
        [sys.executable, "-m", "fashiontag_pipeline", *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    assert URL in lines[0] and "lower case" in lines[0], lines[0]
