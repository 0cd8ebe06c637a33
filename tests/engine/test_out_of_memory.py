"""``fashiontag run`` out of memory mid-run: a ``ulimit -v`` (RLIMIT_AS) in a cron line or a
job runner, met as a ``MemoryError`` while a results page is written.

Found by a hunt: the run stopped with a 60-line traceback (exit 1), not the one line its
``--help`` promises, and ``--summary`` kept saying the run was under way ("if no fashiontag is
at work on it, it was killed"), as after a SIGKILL. A real ``ulimit -v`` makes the error come
at a different place in each run: the test raises it, once, where a real one came (the
results page's bytes), in the real process, through a small bootstrap.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import anyio

from fashiontag_pipeline.service import ServiceConfig, running_service

from .helpers import ENV, assert_exactly_once, run_args, write_csv

_BOOT = r"""
import os, sys
from pathlib import Path

sys.path.insert(0, os.getcwd())  # (as ``-m`` would: the package of the checkout under test)
FLAG = Path(os.environ["FT_FLAG"])

from fashiontag_pipeline.engine import sinks

real_page_lines = sinks.page_lines
pages = [0]


def page_lines(task_id, rows):
    pages[0] += 1
    if pages[0] == 3 and FLAG.exists():
        FLAG.unlink()
        raise MemoryError
    return real_page_lines(task_id, rows)


sinks.page_lines = page_lines

from fashiontag_pipeline.cli import main

raise SystemExit(main(sys.argv[1:]))
"""


async def test_a_run_out_of_memory_says_so_in_one_line_then_resumes_exactly_once(
    tmp_path: Path,
) -> None:
    n = 3000
    manifest = write_csv(tmp_path / "m.csv", n)
    out = tmp_path / "out.jsonl"
    summary = tmp_path / "summary.json"
    boot = tmp_path / "boot.py"
    boot.write_text(_BOOT)
    flag = tmp_path / "oom.flag"
    flag.touch()
    async with running_service(ServiceConfig()) as svc:
        args = run_args(svc.url, out, str(manifest), "--summary", str(summary))
        at = args.index("-m")
        booted = [*args[:at], str(boot), *args[at + 2 :]]
        first = await anyio.run_process(booted, check=False, env={**ENV, "FT_FLAG": str(flag)})
        err = first.stderr.decode()
        assert not flag.exists(), "the fault did not fire"
        assert first.returncode == 1, err[-800:]
        assert "Traceback" not in err, err[-800:]
        lines = err.strip().splitlines()
        assert len(lines) == 1 and "memory" in lines[0], err[-800:]
        data = json.loads(summary.read_text())
        assert data["complete"] is False
        assert "memory" in data["error"] and "under way" not in data["error"], data["error"]
        again = await anyio.run_process(args, check=False, env=ENV, stderr=subprocess.PIPE)
        assert again.returncode == 0, again.stderr.decode()[-800:]
        assert json.loads(summary.read_text())["complete"] is True
        assert svc.store.image_count == n, "rows billed twice"
    assert_exactly_once(out, out.with_suffix(".rej"), {f"p{i}" for i in range(n)})
