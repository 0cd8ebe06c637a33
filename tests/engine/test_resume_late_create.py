"""A run killed while a create was on its way to a service slow to apply it, then resumed: the
resume looks for the create's task long enough to see it applied late, and does not create its
rows again (two tasks of the same rows, each row billed twice)."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import time
from pathlib import Path

import anyio
from aiohttp import web

from fashiontag_pipeline.service import ServiceConfig, running_service

from .helpers import ENV, assert_exactly_once, run_args, write_csv
from .proxy import BULK, MisbehavingProxy, Misbehaviour


class SlowCreate(MisbehavingProxy):
    """The proxy in front of a service slow to take writes: the first create is held (no
    answer), and applied by the service ``delay`` seconds after it came."""

    def __init__(self, upstream: str, delay: float) -> None:
        super().__init__(upstream, Misbehaviour())
        self.delay = delay
        self.received = anyio.Event()
        self.applied = anyio.Event()
        self.late: asyncio.Task[None] | None = None

    async def handle(self, request: web.Request) -> web.StreamResponse:
        if request.method == "POST" and request.path == BULK and not self.received.is_set():
            body = await request.read()
            headers = {
                "x-api-key": request.headers["x-api-key"],
                "Content-Type": "application/json",
            }
            self.late = asyncio.get_running_loop().create_task(self._late(body, headers))
            self.received.set()
            await self.applied.wait()  # (no answer: the client is killed meanwhile)
            return web.Response(status=504)
        return await super().handle(request)

    async def _late(self, body: bytes, headers: dict[str, str]) -> None:
        await anyio.sleep(self.delay)
        assert self._session is not None
        async with self._session.post(self.upstream + BULK, data=body, headers=headers) as up:
            await up.read()
        self.applied.set()


async def killed_after_a_create(tmp_path: Path, proxy: SlowCreate, timeout: float) -> list[str]:
    """A run of 50 rows through ``proxy`` killed (SIGKILL) once its create came: the args of
    the same command (a client deadline of ``timeout`` s, ``list_lag`` 0.5 s)."""
    manifest = write_csv(tmp_path / "m.csv", 50)
    out, state = tmp_path / "out.jsonl", tmp_path / "s.state"
    config = tmp_path / "c.toml"
    config.write_text(f"[client.timeout]\ntotal = {timeout}\n\n[engine]\nlist_lag = 0.5\n")
    args = run_args(proxy.url, out, str(manifest), "--state", str(state))
    args += ["--config", str(config), "--linger", "0.1"]
    proc = await anyio.open_process(args, stderr=subprocess.PIPE, env=ENV)
    with anyio.fail_after(30):
        await proxy.received.wait()
    proc.send_signal(signal.SIGKILL)
    await proc.wait()
    await proc.aclose()
    return args


async def test_a_create_on_its_way_at_a_kill_and_applied_late_is_not_created_again(
    tmp_path: Path,
) -> None:
    """A run killed (SIGKILL) right after it sent a create, which the service applied 3 s
    later. The resume looked for the create's task (its token in the state, no task id) for
    ``list_lag`` (0.5 s) only, not found it, and created the rows again: two tasks of the same
    rows, each billed twice, one never read. A create still on its way when the run died is
    looked for as long as a request may go unanswered (the client's deadline, 4 s) besides."""
    proxy = SlowCreate("", 3.0)
    out = tmp_path / "out.jsonl"
    async with running_service(ServiceConfig()) as svc:
        proxy.upstream = svc.url
        async with proxy.running():
            args = await killed_after_a_create(tmp_path, proxy, 4.0)
            started = time.monotonic()
            with anyio.fail_after(30):
                resumed = await anyio.run_process(args, check=False, env=ENV)
                await proxy.applied.wait()
            took = time.monotonic() - started
        tasks = [list(t.ids) for t in svc.store.tasks.values()]
    assert resumed.returncode == 0, resumed.stderr.decode()[-800:]
    assert_exactly_once(out, out.with_suffix(".rej"), {f"p{i}" for i in range(50)})
    held = [i for ids in tasks for i in ids]
    assert len(held) == len(set(held)) == 50, f"{len(tasks)} tasks hold {len(held)} rows"
    assert took < 15


async def test_sigterm_while_a_resume_looks_for_a_create_stops_it(tmp_path: Path) -> None:
    """The look of a resume for a create of unknown fate (here up to a minute: a client
    deadline of 60 s, the create never applied) ends at SIGTERM, as any wait of a resume."""
    proxy = SlowCreate("", 3600.0)
    async with running_service(ServiceConfig()) as svc:
        proxy.upstream = svc.url
        async with proxy.running():
            args = await killed_after_a_create(tmp_path, proxy, 60.0)
            proc = await anyio.open_process(args, stderr=subprocess.PIPE, env=ENV)
            try:
                await anyio.sleep(2.0)
                assert proc.returncode is None
                proc.send_signal(signal.SIGTERM)
                with anyio.fail_after(10):
                    await proc.wait()
            finally:
                if proc.returncode is None:
                    proc.kill()
                await proc.aclose()
                assert proxy.late is not None
                proxy.late.cancel()
                proxy.applied.set()
        assert len(svc.store.tasks) == 0  # (not created again)
    assert proc.returncode == 130
