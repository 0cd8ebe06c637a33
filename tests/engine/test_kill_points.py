"""kill -9 at exact points of a run (hooks make the engine kill itself there), then the same
command once the service restarted: forgetting every task, or from its own state file.

* before its first create is sent (V committed, the chunk written ahead);
* after a create (or a PUT) was applied, before its answer was recorded;
* after its first task was done, before a page of it was written;
* with three result pages of a task written and committed, the rest not.

Every row once in the outputs, exit 0, and no row in two tasks of the service the run ends on.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import anyio
import pytest

from fashiontag_pipeline.service import ServiceConfig, running_service

from .helpers import ENV, assert_exactly_once, free_port, ids_of, run_args, write_csv

#: ``HOOK_KILL_AT`` names the point where the engine SIGKILLs itself: ``before-create`` (a
#: create about to be sent), ``after-create`` / ``after-put`` (its answer back, not recorded),
#: ``page-N`` (about to commit its (N+1)th result page; 0: none of a done task written).
KILL_HOOK = """
import os, signal
_at = os.environ.get("HOOK_KILL_AT")
if _at:
    from fashiontag_pipeline import _client
    from fashiontag_pipeline.engine import pagers
    def _die():
        os.kill(os.getpid(), signal.SIGKILL)
    _create = _client.TaggerClient.create_task
    _append = _client.TaggerClient.append_to_task
    _commit = pagers.ResultPagers._commit_ready
    _pages = [0]
    async def create_task(self, *args, **kwargs):
        if _at == "before-create":
            _die()
        answer = await _create(self, *args, **kwargs)
        if _at == "after-create":
            _die()
        return answer
    async def append_to_task(self, *args, **kwargs):
        answer = await _append(self, *args, **kwargs)
        if _at == "after-put":
            _die()
        return answer
    async def commit_ready(self, entry, ready):
        if _at.startswith("page-") and _pages[0] >= int(_at[5:]):
            _die()
        _pages[0] += 1
        await _commit(self, entry, ready)
    _client.TaggerClient.create_task = create_task
    _client.TaggerClient.append_to_task = append_to_task
    pagers.ResultPagers._commit_ready = commit_ready
"""


@pytest.mark.parametrize(
    ("point", "service"),
    [
        ("before-create", "forgot"),
        ("after-create", "forgot"),
        ("after-create", "kept"),
        ("after-put", "forgot"),
        ("after-put", "kept"),
        ("page-0", "forgot"),
        ("page-3", "forgot"),
        ("page-3", "kept"),
    ],
)
async def test_kill_9_at_a_point_then_the_service_restarts(
    tmp_path: Path, point: str, service: str
) -> None:
    n = 2500
    manifest = write_csv(tmp_path / "m.csv", n)
    out = tmp_path / "out.jsonl"
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(KILL_HOOK)
    killing = {
        **ENV,
        "PYTHONPATH": os.pathsep.join([str(hook), ENV.get("PYTHONPATH", "")]),
        "HOOK_KILL_AT": point,
    }
    config = tmp_path / "c.toml"  # (a resume looks for a create of unknown fate for 3 s)
    config.write_text(
        "[client.timeout]\ntotal = 3.0\n\n"
        "[engine]\nlist_lag = 0.5\nchunk_size = 500\nmax_page_concurrency = 1\n"
    )
    port = free_port()
    args = run_args(f"http://127.0.0.1:{port}", out, str(manifest), "--config", str(config))
    args += ["--state", str(tmp_path / "s.state"), "--linger", "0.2"]
    args += ["--rotate-images", "1500", "--rotate-min-images", "1500"]
    kept = tmp_path / "service.db" if service == "kept" else None
    async with running_service(ServiceConfig(rate=5000.0, state_path=kept), port=port):
        with anyio.fail_after(60):
            killed = await anyio.run_process(args, check=False, env=killing)
    assert killed.returncode == -signal.SIGKILL, killed.stderr.decode()[-800:]
    async with running_service(ServiceConfig(rate=5000.0, state_path=kept), port=port) as svc:
        with anyio.fail_after(60):
            resumed = await anyio.run_process(args, check=False, env=ENV)
        tasks = [list(t.ids) for t in svc.store.tasks.values()]
    assert resumed.returncode == 0, resumed.stderr.decode()[-800:]
    assert_exactly_once(out, out.with_suffix(".rej"), ids_of(n))
    held = [i for ids in tasks for i in ids]
    assert len(held) == len(set(held)), f"{len(tasks)} tasks hold {len(held)} rows"
