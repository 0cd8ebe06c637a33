"""Representative cases of a kill -9 fuzz over the engine's fault paths together: a manifest
(CSV or JSONL) with case-variant ids and bad rows, a service that misbehaves in one or two
ways (a task unknown for a moment after its create, writes moved to another task, elements of
a page that are no result, a write applied twice, ids echoed upper-cased, a gateway's 404s)
plus 5xx, drops, lost answers, clock skew and forgotten tasks, ``fashiontag run`` killed
(SIGKILL) at 0-3 points chosen by what the run has done, then resumed until exit 0. Every row
must end exactly once, each result equal to a plain run's for its id (the reference service's
result depends on the image URL alone), and the service's bill must be the rows plus the
re-sends the summary reports."""

from __future__ import annotations

import collections
import json
import signal
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import pytest
from aiohttp import web

from fashiontag_pipeline.service import ServiceConfig, running_service
from fashiontag_pipeline.service.faults import FaultSpec

from .helpers import ENV, job_marks, run_args, taken_in
from .proxy import BULK, MisbehavingProxy, Misbehaviour
from .test_id_key_tasks import _echo
from .test_transport_faults import GATEWAY_404

KONG_404 = b'{"message":"no Route matched with those values"}'


class FaultPaths(MisbehavingProxy):
    """The misbehaving proxy with this session's rewrites on top: a gateway's 404s (``kind``,
    times, body), writes moved to a task the service made (``moved``: the second PUT, or that
    and every later PUT to task 1), task 1's first page with ``hole`` in place of its last
    result, and task 1 holding ``twice`` = (at, block) of its rows twice."""

    def __init__(self, rules: Misbehaviour, **b: Any) -> None:
        super().__init__("", rules)
        self.gateway: tuple[str, int, bytes] | None = b.get("gateway")
        self.moved: str | None = b.get("moved")
        self.hole: list[Any] | None = b.get("hole")
        self.twice: tuple[int, int] | None = b.get("twice")
        self.blipped = self.put_count = 0
        self.made: list[str] = []

    async def _forward(self, method: str, url: str, request: web.Request) -> web.Response:
        assert self._session is not None
        headers = {"x-api-key": request.headers.get("x-api-key", "")}
        body = await request.read()
        async with self._session.request(method, url, data=body, headers=headers) as up:
            status, payload = up.status, await up.read()
        if method == "POST" and status < 300:
            self.made.append(json.loads(payload)["taskId"])
        return web.Response(status=status, body=payload, content_type="application/json")

    async def _doubled_page(self, request: web.Request, task_id: str) -> web.Response:
        assert self.twice is not None
        rows = await self.upstream_rows(task_id, request.headers.get("x-api-key", ""))
        at, block = self.twice
        if len(rows) >= at:
            rows = rows[:at] + rows[at - block : at] + rows[at:]
        offset, size = int(request.query["offset"]), int(request.query["size"])
        info = {"totalCount": len(rows), "offset": offset, "size": size}
        data = {"taskInfo": info, "results": rows[offset : offset + size]}
        return web.json_response({"status": "success", "data": data})

    async def handle(self, request: web.Request) -> web.StreamResponse:
        path, method = request.path, request.method
        kind = (
            "list"
            if path == BULK and method == "GET"
            else "status"
            if path.endswith("/status")
            else "page"
            if method == "GET" and path.startswith(BULK + "/")
            else method
        )
        if self.gateway and kind == self.gateway[0] and self.blipped < self.gateway[1]:
            self.blipped += 1
            return web.Response(status=404, body=self.gateway[2])
        task_id = path[len(BULK) + 1 :]
        if self.moved and kind == "PUT":
            self.put_count += 1
            if self.put_count == 2:
                return await self._forward("POST", f"{self.upstream}{BULK}", request)
            if self.moved == "goes_on" and self.made and task_id == self.created[0]:
                return await self._forward("PUT", f"{self.upstream}{BULK}/{self.made[0]}", request)
        if self.twice and kind == "page" and self.ordinal(task_id) == 1:
            return await self._doubled_page(request, task_id)
        return await super().handle(request)

    def _rewrite(
        self, method: str, path: str, task_id: str | None, status: int, payload: bytes
    ) -> bytes:
        out = super()._rewrite(method, path, task_id, status, payload)
        first_page = method == "GET" and status == 200 and not path.endswith("/status")
        if self.hole is None or not first_page or self.ordinal(task_id or "") != 1:
            return out
        page = json.loads(out)
        if page["data"]["taskInfo"]["offset"] == 0 and page["data"]["results"]:
            page["data"]["results"][-1] = self.hole[0]
        return json.dumps(page).encode()


@dataclass
class Case:
    rows: int
    fmt: str
    rules: dict[str, Any] = field(default_factory=dict)
    proxy: dict[str, Any] = field(default_factory=dict)
    faults: dict[str, Any] = field(default_factory=dict)
    #: Kill points, each "accepted" (a share of the rows taken in), "results" (lines
    #: committed), "unknown" (a create of unknown fate) or "event" (the proxy misbehaved).
    kills: tuple[tuple[str, float], ...] = ()
    rotate: int = 1000
    list_lag: float = 0.5


CASES = {
    "lag+echo, killed with a create of unknown fate": Case(
        1500, "jsonl", {"list_lag": 1.0, "status_lag": 1.0, "echo_id": _echo},
        kills=(("unknown", 0), ("accepted", 0.8)), list_lag=1.5,
    ),
    "writes going on in a made task, killed at the move": Case(
        2400, "csv", proxy={"moved": "goes_on"}, kills=(("event", 0),), rotate=3000
    ),
    "a null in a page + a gateway's empty 404 on pages + 5xx": Case(
        1200, "csv", proxy={"hole": [None], "gateway": ("page", 3, b"")},
        faults={"server_errors": ((503, 0.05),)}, kills=(("accepted", 0.5),),
    ),
    "a write applied twice past a page, killed with lines committed": Case(
        2000, "jsonl", {"inflate_total": {1: 300}}, proxy={"twice": (900, 300)},
        kills=(("results", 0.2),),
    ),
    "Kong's 404 on status + a task forgotten once done": Case(
        1500, "csv", {"forget_when_done": {1}}, proxy={"gateway": ("status", 3, KONG_404)},
        kills=(("accepted", 0.3), ("results", 0.5)),
    ),
    "echo + a lost create answer + drops": Case(
        1800, "jsonl", {"echo_id": _echo, "lose_first_create_answer": True},
        faults={"drop": 0.02}, kills=(("unknown", 0), ("results", 0.3)),
    ),
    "a write moved + the list's 404 + clock ahead": Case(
        2500, "csv", {"clock_ahead": 3600.0},
        proxy={"moved": "one", "gateway": ("list", 2, GATEWAY_404)},
        kills=(("event", 0), ("accepted", 0.9)), rotate=3000,
    ),
}  # fmt: skip


def _manifest(case: Case, folder: Path) -> Path:
    """``case.rows`` rows: ``p<i>`` mostly, some case variants of earlier ids (``P7``), a few
    exact duplicates, ids a service makes one (``007``, ``7``, `` q9``) and ``ftp://`` URLs."""
    rows: list[tuple[str, str]] = []
    for i in range(case.rows):
        ident, url = f"p{i}", f"https://img.example/{i}.jpg"
        if i % 37 == 5:
            ident = f"P{i // 2}"
        elif i % 211 == 7:
            ident = f"p{i // 3}"
        elif i % 101 == 3:
            url = "ftp://nope/x.jpg"
        elif i % 97 == 11:
            ident = (f"00{i}", f"{i}", f" q{i}", f"Q{i}")[i % 4]
        rows.append((ident, url))
    if case.fmt == "jsonl":
        path = folder / "m.jsonl"
        path.write_text("".join(json.dumps({"id": i, "url": u}) + "\n" for i, u in rows))
    else:
        path = folder / "m.csv"
        lines = [f'"{i}",{u},acme,TOP' if i != i.strip() else f"{i},{u},acme,TOP" for i, u in rows]
        path.write_text("id,url,brand,detection\n" + "\n".join(lines) + "\n")
    return path


def _config(case: Case, folder: Path) -> Path:
    path = folder / "c.toml"
    path.write_text(
        "[client.timeout]\ntotal = 5.0\n\n[engine]\npoll_min = 0.02\npoll_max = 0.2\n"
        f"linger_seconds = 0.2\nrotate_images = {case.rotate}\n"
        f"rotate_min_images = {case.rotate}\nlist_lag = {case.list_lag}\ngive_up_after = 10.0\n"
        # (rows never returned, a null in a page, are sent again 3 s after their task is
        # done, not 30: a results store that lags the status is no case here)
        "read_again_window = 3.0\n"
    )
    return path


def _outcomes(out: Path) -> tuple[dict[str, Any], collections.Counter[str]]:
    """Each result's tagging result by id (an id twice fails), and the rejects' ids."""
    results: dict[str, Any] = {}
    for line in out.read_text().splitlines() if out.exists() else ():
        row = json.loads(line)
        assert row["id"] not in results, f"{row['id']!r} written twice"
        results[row["id"]] = row["taggingResult"]
    rej = out.with_suffix(".rej")
    lines = rej.read_text().splitlines() if rej.exists() else []
    return results, collections.Counter(json.loads(line)["id"] for line in lines)


def _kill_point(
    kind: str, share: float, case: Case, state: Path, proxy: FaultPaths
) -> Callable[[], bool]:
    before = (len(proxy.made), proxy.blipped, proxy.status_lagged, len(proxy.lost_answers))
    if kind == "unknown":
        return lambda: taken_in(state)[2] >= 1
    if kind == "event":
        return lambda: (
            (len(proxy.made), proxy.blipped, proxy.status_lagged, len(proxy.lost_answers)) != before
        )
    if kind == "accepted":
        return lambda: taken_in(state)[0] >= share * case.rows
    return lambda: job_marks(state)[1] >= share * case.rows * 100  # bytes of lines, roughly


@pytest.mark.parametrize("case", CASES.values(), ids=list(CASES))
async def test_killed_and_resumed_on_a_service_that_misbehaves(tmp_path: Path, case: Case) -> None:
    manifest = _manifest(case, tmp_path)
    config = _config(case, tmp_path)
    async with running_service(ServiceConfig()) as svc:
        out = tmp_path / "plain" / "out.jsonl"
        out.parent.mkdir()
        with anyio.fail_after(60):
            plain = await anyio.run_process(
                run_args(svc.url, out, str(manifest), "--config", str(config)), check=False, env=ENV
            )
        assert plain.returncode == 0, plain.stderr.decode()[-1000:]
    expected, expected_rejects = _outcomes(out)
    faults = FaultSpec(**case.faults, seed=7) if case.faults else None
    out = tmp_path / "fuzz" / "out.jsonl"
    out.parent.mkdir()
    state, summary = Path(f"{out}.state"), tmp_path / "summary.json"
    proxy = FaultPaths(Misbehaviour(**case.rules), **case.proxy)
    codes: list[int] = []
    async with running_service(ServiceConfig(rate=2000.0, faults=faults)) as svc:
        proxy.upstream = svc.url
        async with proxy.running():
            args = run_args(proxy.url, out, str(manifest), "--config", str(config))
            args += ["--summary", str(summary)]
            for kind, share in case.kills:
                ready = _kill_point(kind, share, case, state, proxy)
                async with await anyio.open_process(args, env=ENV) as proc:
                    with anyio.fail_after(60):
                        while not ready() and proc.returncode is None:
                            await anyio.sleep(0.005)
                    if proc.returncode is None:
                        proc.send_signal(signal.SIGKILL)
                    codes.append(await proc.wait())
                if codes[-1] == 0:  # the run ended before its kill point: it is complete
                    results, rejects = _outcomes(out)
                    assert set(results) | set(rejects) == set(expected) | set(expected_rejects)
            for _ in range(4):
                with anyio.fail_after(60):
                    done = await anyio.run_process(args, check=False, env=ENV)
                codes.append(done.returncode)
                if done.returncode == 0:
                    break
                assert done.returncode in (1, 3), done.stderr.decode()[-1000:]
        billed = svc.store.image_count
    assert codes[-1] == 0, codes
    results, rejects = _outcomes(out)
    assert rejects == expected_rejects
    assert set(results) == set(expected)
    wrong = sorted(i for i in results if results[i] != expected[i])
    assert not wrong, f"{len(wrong)} rows written with another row's result: {wrong[:5]}"
    resent = json.loads(summary.read_text())["resent"]
    assert billed == len(expected) + resent, f"{billed - len(expected) - resent} unexplained bills"
