"""A service that rate limits (429) or sheds load (503) with Retry-After: the run stops on a
signal, gives up on time, and waits as long as it is asked to (through
:attr:`~.proxy.Misbehaviour.storm`)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import anyio
from aiohttp import web

from fashiontag_pipeline.service import ServiceConfig, running_service

from .helpers import ENV, assert_exactly_once, run_args, write_csv
from .proxy import MisbehavingProxy, Misbehaviour, misbehaving, request_kind
from .test_single_mode import red_picture, write_csv_rows


async def _interrupted(
    args: list[str], proxy: MisbehavingProxy, *, refused: int, settle: float, wait: float
) -> tuple[float, int | None, int, int]:
    """Start ``args``; once the proxy has refused ``refused`` requests and ``settle`` seconds
    more have passed, send SIGINT. (Seconds until it exited, its exit code or None when it
    was still running ``wait`` seconds after the signal, and the proxy's writes and refused
    requests at the signal.)"""
    proc = await anyio.open_process(args, stderr=subprocess.PIPE, env=ENV)
    try:
        with anyio.fail_after(20):
            while proxy.storm_answers < refused:
                await anyio.sleep(0.05)
        await anyio.sleep(settle)
        proc.send_signal(signal.SIGINT)
        at_signal = proxy.writes, proxy.storm_answers
        t0 = time.monotonic()
        with anyio.move_on_after(wait):
            await proc.wait()
        return (time.monotonic() - t0, proc.returncode, *at_signal)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        await proc.aclose()


async def test_sigint_while_writes_are_rate_limited_sends_none_and_exits_130(
    tmp_path: Path,
) -> None:
    """Every create answered 429 with Retry-After: 5. Ctrl-C: a create refused was not
    applied, so it is no write in flight: none is sent after the signal, the run exits 130
    within a few seconds (it sent creates until --give-up-after, then exited 1), and the
    same command sends its rows once the limit is lifted."""
    manifest = write_csv(tmp_path / "m.csv", 3000)
    out = tmp_path / "out.jsonl"
    rules = Misbehaviour(storm=429, storm_ops={"create", "append"}, storm_retry_after="5")
    async with running_service(ServiceConfig()) as svc, misbehaving(svc.url, rules) as proxy:
        args = run_args(proxy.url, out, str(manifest), "--rotate-images", "1000")
        stopped_after, code, writes, _ = await _interrupted(
            args, proxy, refused=1, settle=1.0, wait=20
        )
        sent_after = proxy.writes - writes
        assert stopped_after < 5, f"still running {stopped_after:.0f} s after SIGINT"
        assert code == 130
        assert sent_after == 0, f"{sent_after} writes sent after SIGINT"
        rules.storm = None
        again = await anyio.run_process(args, check=False, env=ENV)
    assert again.returncode == 0, again.stderr.decode()[-400:]
    assert_exactly_once(out, out.with_suffix(".rej"), {f"p{i}" for i in range(3000)})


async def test_sigint_while_single_mode_is_rate_limited_sends_none_and_exits_130(
    tmp_path: Path,
) -> None:
    """The same in single mode (local pictures): every request answered 429 with
    Retry-After: 5. Ctrl-C: no request after the signal, exit 130 within seconds."""
    picture = red_picture(tmp_path / "red.png")
    csv = write_csv_rows(tmp_path / "m.csv", [(f"s{i}", str(picture)) for i in range(200)])
    out = tmp_path / "out.jsonl"
    rules = Misbehaviour(storm=429, storm_retry_after="5")
    async with running_service(ServiceConfig()) as svc, misbehaving(svc.url, rules) as proxy:
        args = run_args(proxy.url, out, str(csv))
        stopped_after, code, _, refused = await _interrupted(
            args, proxy, refused=1, settle=1.0, wait=20
        )
    assert stopped_after < 7, f"still running {stopped_after:.0f} s after SIGINT"
    assert code == 130
    assert proxy.storm_answers == refused, f"{proxy.storm_answers - refused} requests after SIGINT"


async def test_a_retry_after_past_the_give_up_point_stops_the_run_there(tmp_path: Path) -> None:
    """Every request answered 429 with Retry-After: 86400 (a daily quota spent), and
    --give-up-after 3: the run waited max_retry_after (120 s) and its warning said both
    "retry 1 of 5 in 120.0 s" and "keeps trying for 3 s". It now stops (exit 1) at the give-up
    point, sends nothing more meanwhile, and says the service asked to wait 86400 s."""
    manifest = write_csv(tmp_path / "m.csv", 500)
    out = tmp_path / "out.jsonl"
    rules = Misbehaviour(storm=429, storm_retry_after="86400")
    async with running_service(ServiceConfig()) as svc, misbehaving(svc.url, rules) as proxy:
        args = run_args(proxy.url, out, str(manifest), "--give-up-after", "3")
        started = time.monotonic()
        with anyio.move_on_after(20):
            done = await anyio.run_process(args, check=False, env=ENV)
        took = time.monotonic() - started
    assert took < 10, f"still running {took:.0f} s after start with --give-up-after 3"
    err = done.stderr.decode()
    assert done.returncode == 1, err[-600:]
    assert proxy.storm_answers == 1, f"{proxy.storm_answers} requests refused"
    assert "in 120.0 s" not in err, err
    last = err.strip().splitlines()[-1]
    assert "asks to wait 86400 s" in last and "24 h" in last, err


async def test_a_503_with_retry_after_is_waited_like_a_429(tmp_path: Path) -> None:
    """Every request answered 503 with Retry-After: 5 for the proxy's first 5 s (a service
    shedding load). A 429 so answered costs a request or two; the 503s cost dozens: the
    client's reads retried after 0.2 s backoffs, and each create answered 503 (of unknown
    fate) looked up in the task list at once and sent again."""
    manifest = write_csv(tmp_path / "m.csv", 3000)
    out = tmp_path / "out.jsonl"
    rules = Misbehaviour(storm=503, storm_retry_after="5", storm_window=(0.0, 5.0))
    async with running_service(ServiceConfig()) as svc, misbehaving(svc.url, rules) as proxy:
        args = run_args(proxy.url, out, str(manifest))
        with anyio.fail_after(40):
            done = await anyio.run_process(args, check=False, env=ENV)
    assert done.returncode == 0, done.stderr.decode()[-600:]
    assert proxy.storm_answers <= 6, (
        f"{proxy.storm_answers} requests answered 503 in 5 s of Retry-After: 5"
    )
    assert_exactly_once(out, out.with_suffix(".rej"), {f"p{i}" for i in range(3000)})


async def test_tag_and_tasks_give_up_on_a_long_rate_limit_in_their_budget(tmp_path: Path) -> None:
    """Every request answered 429 with Retry-After: 600: ``fashiontag tag`` and ``fashiontag
    tasks list|status|results`` waited up to 5 x 120 s (10 minutes) with one warning. They
    now give up after --give-up-after (default 30 s), exit 1, and say the key is rate limited
    and how long the service asks to wait."""
    rules = Misbehaviour(storm=429, storm_retry_after="600")
    commands = [
        ["tag", "https://img.example/a.jpg"],
        ["tasks", "list"],
        ["tasks", "status", "t-1"],
        ["tasks", "results", "t-1"],
    ]
    async with running_service(ServiceConfig()) as svc, misbehaving(svc.url, rules) as proxy:
        for command in commands:
            args = [sys.executable, "-m", "fashiontag_pipeline", *command]
            args += ["--base-url", proxy.url, "--give-up-after", "1"]
            started = time.monotonic()
            with anyio.move_on_after(15):
                done = await anyio.run_process(args, check=False, env=ENV)
            took = time.monotonic() - started
            assert took < 8, f"{command}: still running {took:.0f} s after start"
            err = done.stderr.decode()
            assert done.returncode == 1, f"{command}: {err[-600:]}"
            last = err.strip().splitlines()[-1]
            assert "rate limit" in last and "asks to wait 600 s" in last, f"{command}: {err}"
    assert proxy.storm_answers == len(commands), f"{proxy.storm_answers} requests refused"


async def test_sigint_while_single_mode_waits_a_long_retry_after_exits_130_at_once(
    tmp_path: Path,
) -> None:
    """Single mode, every request answered 429 with Retry-After: 60 (under --give-up-after
    30): Ctrl-C ended the client's wait, then the run's own retry waited the Retry-After
    again (60 s, or to the give-up point and exit 1). It exits 130 within seconds."""
    picture = red_picture(tmp_path / "red.png")
    csv = write_csv_rows(tmp_path / "m.csv", [(f"s{i}", str(picture)) for i in range(20)])
    out = tmp_path / "out.jsonl"
    rules = Misbehaviour(storm=429, storm_retry_after="60")
    async with running_service(ServiceConfig()) as svc, misbehaving(svc.url, rules) as proxy:
        args = run_args(proxy.url, out, str(csv), "--give-up-after", "30")
        stopped_after, code, _, _ = await _interrupted(args, proxy, refused=1, settle=0.5, wait=8)
    assert stopped_after < 5, f"still running {stopped_after:.0f} s after SIGINT"
    assert code == 130


async def test_sigint_while_a_503_storm_holds_a_create_look_up_exits_130_at_once(
    tmp_path: Path,
) -> None:
    """Every request answered 503 with Retry-After: 5 (load shed): a create so answered is of
    unknown fate and looked up in the task list, itself answered 503. Ctrl-C: the look-up
    went on waiting (and asking) until --give-up-after, then exit 1; no write is sent after
    the signal and the run exits 130 within seconds, its rows left to the resume."""
    manifest = write_csv(tmp_path / "m.csv", 1000)
    out = tmp_path / "out.jsonl"
    rules = Misbehaviour(storm=503, storm_retry_after="5")
    async with running_service(ServiceConfig()) as svc, misbehaving(svc.url, rules) as proxy:
        # (The create answered 503 is of unknown fate: the resume looks for it until a
        # request's deadline has gone by since it was sent, here 3 s.)
        config = tmp_path / "c.toml"
        config.write_text("[client.timeout]\ntotal = 3.0\n")
        args = run_args(
            proxy.url, out, str(manifest), "--give-up-after", "30", "--config", str(config)
        )
        # (Refused twice: the create, then its look-up.)
        stopped_after, code, writes, _ = await _interrupted(
            args, proxy, refused=2, settle=0.5, wait=8
        )
        assert stopped_after < 5, f"still running {stopped_after:.0f} s after SIGINT"
        assert code == 130
        assert proxy.writes == writes, f"{proxy.writes - writes} writes after SIGINT"
        rules.storm = None
        again = await anyio.run_process(args, check=False, env=ENV)
    assert again.returncode == 0, again.stderr.decode()[-400:]
    assert_exactly_once(out, out.with_suffix(".rej"), {f"p{i}" for i in range(1000)})


class PagesStormedFirst(MisbehavingProxy):
    """The misbehaving proxy whose storm window counts from the first results page asked
    for, not from the proxy's start: on a loaded machine the run's start took seconds, and
    its pages came after a window counted from the proxy's start (no 429 at all) or at its
    very end (a Retry-After that ran past the service's tagging, every request answered)."""

    async def _stormed(self, request: web.Request) -> web.Response | None:
        if self.paged is None and request_kind(request.method, request.path) == "results":
            self.paged = self._started = time.monotonic()
        return await super()._stormed(request)

    paged: float | None = None


async def test_a_retry_after_past_the_give_up_point_on_one_endpoint_is_waited_out(
    tmp_path: Path,
) -> None:
    """Results pages answered 429 with Retry-After: 4 for their first 2 s (a quota of reads),
    --give-up-after 2.5, while the service answers every other request (polls, creates):
    the page waited to the give-up point, then to it again in the run's budget, and the run
    stopped, exit 1, "rate limiting this key for 2s", though nothing had failed for 2.5 s
    on end. While the service answers other requests the give-up point moves on: the page
    waits and is read, the run completes."""
    manifest = write_csv(tmp_path / "m.csv", 4000)
    out = tmp_path / "out.jsonl"
    rules = Misbehaviour(
        storm=429, storm_ops={"results"}, storm_retry_after="4", storm_window=(0.0, 2.0)
    )
    # Polls at least every 0.5 s while the service tags (8 s for 4,000 rows at 500/s): the
    # requests answered meanwhile are the run's own, not a backed-off poll that, on a loaded
    # machine, came more than 2.5 s after the one before.
    config = tmp_path / "c.toml"
    config.write_text("[engine]\npoll_max = 0.5\n")
    async with running_service(ServiceConfig(rate=500)) as svc:
        proxy = PagesStormedFirst(svc.url, rules)
        async with proxy.running():
            args = run_args(
                proxy.url,
                out,
                str(manifest),
                "--give-up-after",
                "2.5",
                "--rotate-images",
                "1000",
                "--config",
                str(config),
            )
            with anyio.fail_after(60):
                done = await anyio.run_process(args, check=False, env=ENV)
    assert proxy.storm_answers >= 1
    assert done.returncode == 0, done.stderr.decode()[-600:]
    assert_exactly_once(out, out.with_suffix(".rej"), {f"p{i}" for i in range(4000)})
