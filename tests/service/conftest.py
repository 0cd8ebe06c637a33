"""Fixtures of the service tests: real services on 127.0.0.1:0, a settable clock, clients."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

from fashiontag_pipeline import RetryPolicy, TaggerClient
from fashiontag_pipeline._models import BulkContext, Detection, Image, ImageType, TaggingRequest
from fashiontag_pipeline.service import RunningService, ServiceConfig, running_service

KEY = "single-SECRET-key-0001"
BULK_KEY = "bulk-SECRET-key-0002"
OTHER_BULK_KEY = "bulk-SECRET-key-0003"
START = 1_900_000_000.0


class FakeClock:
    """Epoch seconds that move only when a test says so."""

    def __init__(self, now: float = START) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def requests(
    n: int, *, prefix: str = "sku", start: int = 0, detection: list[Detection] | None = None
) -> list[TaggingRequest]:
    return [
        TaggingRequest(
            image=Image(type=ImageType.URL, content=f"https://cdn.test/{prefix}/{i}.jpg"),
            context=BulkContext(id=f"{prefix}-{i}", detection=detection),
        )
        for i in range(start, start + n)
    ]


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


StartService = Callable[..., Awaitable[RunningService]]


@pytest.fixture
async def start_service() -> AsyncIterator[StartService]:
    """Factory: ``svc = await start_service(rate=..., ...)``; every service is stopped after."""
    async with contextlib.AsyncExitStack() as stack:

        async def start(**overrides: Any) -> RunningService:
            options: dict[str, Any] = {
                "fetch_allow_private": True,  # the tests' image servers are on loopback
                "api_keys": (KEY,),
                "bulk_api_keys": (BULK_KEY, OTHER_BULK_KEY),
            }
            options.update(overrides)
            return await stack.enter_async_context(running_service(ServiceConfig(**options)))

        yield start


@pytest.fixture
async def service(start_service: StartService) -> RunningService:
    return await start_service()


@pytest.fixture
async def client_for() -> AsyncIterator[Callable[..., TaggerClient]]:
    """Factory of TaggerClients (closed after the test); no retries unless asked."""
    async with contextlib.AsyncExitStack() as stack:

        def make(url: str, **kwargs: Any) -> TaggerClient:
            kwargs.setdefault("api_key", KEY)
            kwargs.setdefault("bulk_api_key", BULK_KEY)
            kwargs.setdefault("retry", RetryPolicy(max_attempts=1))
            client = TaggerClient(url, **kwargs)
            stack.push_async_callback(client.aclose)
            return client

        yield make


@pytest.fixture
def client(service: RunningService, client_for: Callable[..., TaggerClient]) -> TaggerClient:
    return client_for(service.url)
