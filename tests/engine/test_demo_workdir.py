"""``fashiontag demo --workdir DIR`` given a folder of the user's own (found by a hunt; each
test failed before its fix): the demo writes ``catalogue.csv``, ``results.jsonl``,
``rejects.jsonl``, ``results.jsonl.state`` and ``images/`` there, the very names of the files a
first ``fashiontag run catalogue.csv`` makes in its working folder (``--out`` defaults to
``results.jsonl``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ENV = {k: v for k, v in os.environ.items() if not k.startswith("FASHIONTAG_")}


def demo(workdir: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "fashiontag_pipeline",
            "demo",
            "--images",
            "3",
            "--workdir",
            workdir,
        ],
        cwd=cwd,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_the_demo_never_overwrites_a_users_files(tmp_path: Path) -> None:
    """``demo --workdir .`` in the folder of a real run replaced the user's catalogue.csv with
    its own, deleted their results.jsonl, rejects.jsonl and the state (a billed run's outcomes
    gone, the next run tagging every row again) and exited 0. It refuses now (exit 2, one line
    naming the files), touching nothing; a folder the demo made itself is reused."""
    mine = {
        "catalogue.csv": "id,url\nsku-1,https://shop.example/1.jpg\n",
        "results.jsonl": '{"id":"sku-1","taskId":"t1","taggingResult":{"status":"success"}}\n',
        "results.jsonl.state": "not really a state",
    }
    for name, text in mine.items():
        (tmp_path / name).write_text(text)
    result = demo(".", tmp_path)
    assert result.returncode == 2, result.stderr[-1500:]
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "catalogue.csv" in lines[0], result.stderr[-1500:]
    for name, text in mine.items():
        assert (tmp_path / name).read_text() == text, name
    assert not (tmp_path / "images").exists()

    fresh = tmp_path / "demo-files"
    assert demo(str(fresh), tmp_path).returncode == 0
    again = demo(str(fresh), tmp_path)  # (its own files: made again)
    assert again.returncode == 0, again.stderr[-1500:]


def test_a_workdir_that_is_a_file_is_one_line(tmp_path: Path) -> None:
    """``--workdir notes.txt`` (a file) was a traceback (NotADirectoryError), exit 1."""
    (tmp_path / "notes.txt").write_text("mine\n")
    result = demo("notes.txt", tmp_path)
    assert result.returncode == 2, result.stderr[-1500:]
    assert "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert "notes.txt" in result.stderr and "folder" in result.stderr
    assert (tmp_path / "notes.txt").read_text() == "mine\n"
