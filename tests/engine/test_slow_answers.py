"""A service that answers, but slower than the client's request deadline: what the operator is
told. Each test runs the reference service behind the misbehaving proxy of :mod:`.proxy`, with
every request of some kinds held before it is forwarded (and answered, late)."""

from __future__ import annotations

from pathlib import Path

import anyio
import msgspec
import pytest
from aiohttp import web

from fashiontag_pipeline import RetryPolicy, Timeout
from fashiontag_pipeline.engine import EngineConfig, FatalRunError
from fashiontag_pipeline.service import ServiceConfig

from .helpers import TASKS_OF_1000, run_through
from .proxy import MisbehavingProxy, Misbehaviour, request_kind

#: Tasks of 1,000 rows, a give-up budget of 3 s.
FAST = msgspec.structs.replace(TASKS_OF_1000, give_up_after=3.0, list_lag=0.3)


class SlowAnswers(MisbehavingProxy):
    """The proxy with a service that takes ``delay`` seconds over every request of ``kinds``
    (``create``, ``list``, ``status``...: :func:`.proxy.request_kind`), then answers it."""

    def __init__(self, kinds: set[str], delay: float) -> None:
        super().__init__("", Misbehaviour())
        self.kinds, self.delay = kinds, delay
        self.held = 0

    async def handle(self, request: web.Request) -> web.StreamResponse:
        if request_kind(request.method, request.path) in self.kinds:
            self.held += 1
            await anyio.sleep(self.delay)
        return await super().handle(request)


@pytest.mark.parametrize("kinds", [{"create"}, {"list", "status"}], ids=["creates", "polls"])
async def test_a_service_slower_than_the_deadline_is_not_called_unreachable(
    tmp_path: Path, kinds: set[str]
) -> None:
    """A service that answers every create (or every poll) in 1.5 s, with a request deadline
    of 1 s ([client.timeout]): the run stopped after --give-up-after, exit 1, saying "create
    task: service unreachable for 3s: POST /tagger/v2.12/bulk timed out": the service was
    reached each time (it answered, only late), and nothing said which deadline ran out nor
    where it is set, so an operator looked for an outage rather than raise the timeout. The
    error says the service does not answer within the request deadline, and names it."""
    proxy = SlowAnswers(kinds, 1.5)
    engine: EngineConfig = FAST
    with pytest.raises(FatalRunError) as caught:
        await run_through(tmp_path, 2000, proxy, engine, timeout=Timeout(total=1.0))
    message = str(caught.value)
    assert proxy.held
    assert "unreachable" not in message, message
    assert "request deadline (1 s, [client.timeout])" in message, message
    assert "the same command resumes" in message, message


async def test_a_task_list_that_never_answers_is_not_waited_for_at_every_poll(
    tmp_path: Path,
) -> None:
    """A service whose task list hangs (a slow query over an account's week of tasks) while
    each task's status answers at once: every poll asked for the list first and waited out
    the request deadline (times the client's attempts: ~7 minutes a poll at the defaults)
    before it read the statuses, so every done task was noticed that much late. After a
    list not given, the statuses are read for ``LIST_RECHECK`` polls before the list is
    tried again."""
    proxy = SlowAnswers({"list"}, 3.0)
    engine = msgspec.structs.replace(FAST, give_up_after=60.0, poll_min=0.05, poll_max=0.2)
    once = RetryPolicy(max_attempts=1)  # (so that each list asked for is one request)
    summary, _ = await run_through(
        tmp_path,
        3000,
        proxy,
        engine,
        fail_after=60,
        service=ServiceConfig(rate=1000.0),  # (3 s of tagging: polls every 0.05-0.2 s)
        timeout=Timeout(total=0.5),
        retry=once,
    )
    assert summary.complete and summary.resent == 0
    # (before, a list a poll: one each 0.5 s deadline of the 3 s, then the statuses)
    assert 1 <= proxy.held <= 2, proxy.held
