"""Answers too big for memory, or too deep to read: a service we did not write, or a gateway,
a captive portal, a CDN in front of it, answers with a body of hundreds of MiB (a result of
megabytes per image), a body that never ends, or a gzip "bomb" that a few hundred KiB on the
wire inflate to hundreds of MiB. The engine reads no answer past ``limits.max_answer_bytes``:
it refuses it (a read asked again, a write's fate resolved like a lost answer's) and its peak
memory stays within the budget (DESIGN 5: <= 200 MB) instead of growing until it is killed.
An answer nested deeper than the JSON reader's recursion limit is an unreadable answer, not
a crash.

Each run is the CLI in a child process (so its peak RSS is its own), behind the misbehaving
proxy of :mod:`.proxy`, with an address-space limit of a few GiB as a safety net: a run that
holds the answer dies of it (MemoryError) rather than taking the machine's memory.
"""

from __future__ import annotations

import sys
from pathlib import Path

import anyio
import pytest

from fashiontag_pipeline.service import ServiceConfig, running_service

from .helpers import ENV, assert_exactly_once, ids_of, run_args, write_csv
from .proxy import MisbehavingProxy, Misbehaviour
from .test_single_mode import red_picture

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="ru_maxrss in KiB, RLIMIT_AS")

ROWS = 300
#: Rows of a local picture (tagged one by one through the single endpoint).
SINGLES = 4
#: Peak RSS allowed to a run that met a huge answer (DESIGN 5: <= 200 MB).
PEAK_MIB = 190

CONFIG = """
[engine]
poll_min = 0.02
poll_max = 0.2
linger_seconds = 0.1
give_up_after = 20.0
"""

# Runs the CLI in a child under an address-space limit and prints its exit code and peak RSS
# (KiB): RUSAGE_CHILDREN of a fresh wrapper process only ever sees the one engine process.
WRAPPER = (
    "import resource, subprocess, sys\n"
    "resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))\n"
    "r = subprocess.run(sys.argv[1:], stderr=subprocess.PIPE)\n"
    "sys.stderr.buffer.write(r.stderr)\n"
    "print(r.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n"
)


async def _run(
    tmp_path: Path, rules: Misbehaviour, config_text: str = CONFIG
) -> tuple[int, int, str, MisbehavingProxy]:
    """The CLI run of ROWS rows behind a proxy with ``rules``: (exit code, peak RSS in MiB,
    stderr, the proxy)."""
    tmp_path.mkdir(exist_ok=True)
    picture = red_picture(tmp_path / "red.png")
    singles = [f"s{i},{picture},acme,TOP" for i in range(SINGLES)]
    manifest = write_csv(tmp_path / "m.csv", ROWS, extra=singles)
    config = tmp_path / "engine.toml"
    config.write_text(config_text)
    out = tmp_path / "out.jsonl"
    proxy = MisbehavingProxy("", rules)
    async with running_service(ServiceConfig()) as svc:
        proxy.upstream = svc.url
        async with proxy.running():
            argv = run_args(proxy.url, out, str(manifest), "--config", str(config))
            with anyio.fail_after(40):
                done = await anyio.run_process(
                    [sys.executable, "-c", WRAPPER, *argv], env=ENV, check=False
                )
    code, peak = done.stdout.decode().split()[-2:]
    return int(code), int(peak) // 1024, done.stderr.decode(errors="replace"), proxy


@pytest.mark.parametrize(
    "rules",
    [
        pytest.param(Misbehaviour(huge_ops={"results"}), id="page-256MiB"),
        pytest.param(Misbehaviour(huge_ops={"results"}, huge_bytes=None), id="page-endless"),
        pytest.param(Misbehaviour(huge_ops={"results"}, huge_gzip=True), id="page-gzip-bomb"),
        pytest.param(Misbehaviour(huge_ops={"list", "status"}), id="poll-256MiB"),
        pytest.param(Misbehaviour(huge_ops={"create"}, huge_gzip=True), id="create-gzip-bomb"),
        pytest.param(Misbehaviour(huge_ops={"single"}, huge_bytes=None), id="single-endless"),
    ],
)
async def test_a_huge_answer_is_refused_and_the_run_goes_on(
    tmp_path: Path, rules: Misbehaviour
) -> None:
    """One huge answer (a results page, a poll, a create's, a picture's): the run completes, every
    row once, its peak RSS within the budget, and the log names the limit."""
    code, peak, stderr, proxy = await _run(tmp_path, rules)
    assert proxy.huge_answers == 1
    assert code == 0, stderr[-3000:]
    assert peak < PEAK_MIB, f"peak RSS {peak} MiB after one huge answer"
    assert "max_answer_bytes" in stderr
    out = tmp_path / "out.jsonl"
    o = assert_exactly_once(out, out.with_suffix(".rej"), ids_of(ROWS) | ids_of(SINGLES, "s"))
    assert not o.rejects


async def test_every_answer_too_big_stops_the_run_naming_the_limit(tmp_path: Path) -> None:
    """Every results page 8 MiB long, with ``max_answer_bytes`` set to 4 MiB in the config:
    each is refused and asked again until --give-up-after, then the run stops (exit 1, state
    saved) saying the service answers more than that limit, not that it is unreachable."""
    config = CONFIG.replace("give_up_after = 20.0", "give_up_after = 1.0")
    config += "[client.limits]\nmax_answer_bytes = 4194304\n"
    rules = Misbehaviour(huge_ops={"results"}, huge_count=None, huge_bytes=8 << 20)
    code, peak, stderr, proxy = await _run(tmp_path, rules, config)
    assert code == 1, stderr[-3000:]
    assert proxy.huge_answers > 1
    assert peak < PEAK_MIB
    last = stderr.strip().splitlines()[-1]
    assert "service answering more than max_answer_bytes for 1s" in last, last
    assert "answered more than 4 MiB, the client's [client.limits] max_answer_bytes" in last
    assert "unreachable" not in stderr


async def test_results_rows_too_long_for_a_page_of_100_are_read_in_smaller_pages(
    tmp_path: Path,
) -> None:
    """A service that answers many tags an image (~12 KB a result: pages of 100 of ~1.2 MB)
    and ``max_answer_bytes`` of 256 KiB: every page was refused as too long, asked again until
    ``--give-up-after``, then the run stopped (exit 1) saying "the same command resumes once the
    service answers", and every later run again: such a catalogue never completed (a daemon
    asked the same pages for ever). The spec lets a page hold 1 to 100 results: pages are asked
    smaller until they fit, and the run completes, every row once, none sent twice."""
    config = CONFIG.replace("give_up_after = 20.0", "give_up_after = 3.0")
    config += "[client.limits]\nmax_answer_bytes = 262144\n"
    code, peak, stderr, _ = await _run(tmp_path, Misbehaviour(fat_results=10_000), config)
    assert code == 0, stderr[-3000:]
    assert peak < PEAK_MIB
    out = tmp_path / "out.jsonl"
    o = assert_exactly_once(out, out.with_suffix(".rej"), ids_of(ROWS) | ids_of(SINGLES, "s"))
    assert not o.rejects
    fat = [r for r in o.results if len(r["taggingResult"].get("pad", "")) == 10_000]
    assert len(fat) == ROWS
    assert "rows sent again" not in stderr, stderr[-2000:]


@pytest.mark.parametrize("kind", ["results", "list", "create", "single"])
async def test_an_answer_nested_too_deep_is_unreadable_not_a_crash(
    tmp_path: Path, kind: str
) -> None:
    """One answer (a results page, the task list, a create's, a picture's) carrying a field
    of arrays nested 100,000 deep: it is an unreadable answer (a read asked again, a write's
    of unknown fate), not a RecursionError that ends the run with a traceback at every
    resume."""
    code, _, stderr, proxy = await _run(tmp_path, Misbehaviour(deep_ops={kind}))
    assert proxy.deep_answers == 1
    assert code == 0, stderr[-3000:]
    assert "Traceback" not in stderr
    out = tmp_path / "out.jsonl"
    o = assert_exactly_once(out, out.with_suffix(".rej"), ids_of(ROWS) | ids_of(SINGLES, "s"))
    assert not o.rejects


async def test_a_long_header_is_taken_and_a_huge_one_refused_naming_it(tmp_path: Path) -> None:
    """A gateway that adds a 16 KiB header to every answer (a Content-Security-Policy: more
    than aiohttp's default 8,190 bytes): the run completes. Every answer with a 1 MiB header:
    each is refused, and the run stops after --give-up-after saying why, not with
    ``ClientResponseError``."""
    config = CONFIG.replace("give_up_after = 20.0", "give_up_after = 2.0")
    rules = Misbehaviour(header_bytes=16 << 10)
    code, _, stderr, proxy = await _run(tmp_path / "a", rules, config)
    assert code == 0, stderr[-3000:]
    assert proxy.long_headers > 5
    code, _, stderr, proxy = await _run(tmp_path / "b", Misbehaviour(header_bytes=1 << 20), config)
    assert code == 1, stderr[-3000:]  # every answer so: the run stops (give_up_after 2 s)
    last = stderr.strip().splitlines()[-1]
    assert "service answering HTTP heads it cannot read for 2s" in last, last
    assert "answered a header line longer than 64 KiB: refused" in last
    assert "ClientResponseError" not in stderr


async def test_pages_near_the_answer_limit_are_read_a_few_at_a_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every results page 2 MiB long (JSON and whitespace: each within max_answer_bytes) with
    a bytes budget of 4 MiB for pages in memory: page reads grew to the page concurrency as
    with small pages, each holding its body (and its copy while it is read) until its commit:
    pages of 15 MiB at the default concurrency of 16 took 245 MB (81 MB one at a time). The
    reads are cut to the pages the budget holds once a page that long is met (the first 4
    pages are read before any is)."""
    from fashiontag_pipeline import TaggerClient
    from fashiontag_pipeline.engine import EngineConfig, fetch

    from .helpers import run_misbehaving

    monkeypatch.setattr(fetch, "PAGE_BYTES", 4 << 20, raising=False)
    reading = [0, 0]  # (now, most at once after the first 4 pages)
    pages = [0]
    read = TaggerClient.task_results_raw

    async def counting(self: TaggerClient, *args: object, **kwargs: object) -> bytes:
        reading[0] += 1
        pages[0] += 1
        if pages[0] > 8:
            reading[1] = max(reading[1], reading[0])
        try:
            return await read(self, *args, **kwargs)  # type: ignore[arg-type]
        finally:
            reading[0] -= 1

    monkeypatch.setattr(TaggerClient, "task_results_raw", counting)
    rules = Misbehaviour(huge_ops={"results"}, huge_count=None, huge_bytes=2 << 20)
    engine = EngineConfig(
        poll_min=0.02, poll_max=0.2, linger_seconds=0.1, rotate_images=4000, rotate_min_images=4000
    )
    summary, proxy, _ = await run_misbehaving(tmp_path, 4000, rules, engine)
    assert summary.complete and proxy.huge_answers == 40
    assert reading[1] <= 2, reading
