"""RetryBudget.call: the one rule every read loop of the engine follows."""

from __future__ import annotations

import pytest

from fashiontag_pipeline import AuthenticationError, ServerError, TransportError
from fashiontag_pipeline.engine.flow import FatalRunError, RetryBudget


def failing(errors: list[Exception], result: str = "ok") -> tuple[list[int], object]:
    calls = [0]

    async def fn() -> str:
        calls[0] += 1
        if errors:
            raise errors.pop(0)
        return result

    return calls, fn


async def test_transient_failures_are_retried_until_success() -> None:
    budget = RetryBudget(60, base=0.001, cap=0.002)
    calls, fn = failing([TransportError("drop"), ServerError("boom", status=503)])
    assert await budget.call("list tasks", fn) == "ok"  # type: ignore[arg-type]
    assert calls == [3] and budget.retries == 2


async def test_a_refused_key_is_fatal_at_once() -> None:
    budget = RetryBudget(60, base=0.001, cap=0.002)
    calls, fn = failing([AuthenticationError("HTTP 401", status=401)])
    with pytest.raises(FatalRunError, match="refused the run: HTTP 401"):
        await budget.call("list tasks", fn)  # type: ignore[arg-type]
    assert calls == [1] and budget.retries == 0


async def test_a_spent_budget_is_fatal_and_names_the_operation() -> None:
    budget = RetryBudget(0.01, base=0.02, cap=0.02)
    _, fn = failing([TransportError("refused")] * 10)
    with pytest.raises(FatalRunError, match="status of task t1: service unreachable"):
        await budget.call("status of task t1", fn)  # type: ignore[arg-type]
