"""The reference service's configuration: one frozen value object and its defaults."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from .analyzer import Analyzer
from .faults import FaultSpec
from .fetching import DEFAULT_FETCH_PER_HOST

__all__ = [
    "DEFAULT_BODY_TIMEOUT",
    "DEFAULT_DECODE_WORKERS",
    "DEFAULT_FETCH_PER_HOST",
    "DEFAULT_HEADER_TIMEOUT",
    "DEFAULT_KEEPALIVE_TIMEOUT",
    "DEFAULT_LIST_SIZE",
    "DEFAULT_MAX_BODY_BYTES",
    "DEFAULT_MAX_CONNECTIONS",
    "DEFAULT_MAX_LIVE_TASKS",
    "DEFAULT_RESULT_TTL",
    "DEFAULT_TASK_TTL",
    "MAX_LIST_SIZE",
    "ServiceConfig",
]

DEFAULT_TASK_TTL = 600.0
DEFAULT_RESULT_TTL = 7 * 86400.0
MAX_TTL = 100 * 365 * 86400.0
#: 1,000 requests with 8 KB URLs and full contexts fit with room to spare; so does a 10 MB
#: base64 single-mode image.
DEFAULT_MAX_BODY_BYTES = 16 * 1024 * 1024
#: Open connections at once; past it the oldest idle one is closed (or, with none idle, the new
#: one). Each costs ~100 KB of buffers, so 1,000 bound them to ~100 MB.
DEFAULT_MAX_CONNECTIONS = 1000
#: An idle keep-alive connection is closed after this (aiohttp's default is 3,630 s).
DEFAULT_KEEPALIVE_TIMEOUT = 15.0
#: From a request's first byte to its last header line; a connection that drips headers is closed.
DEFAULT_HEADER_TIMEOUT = 10.0
#: To read a whole request body (16 MiB at ~300 KB/s); slower bodies get 408.
DEFAULT_BODY_TIMEOUT = 60.0
#: Tasks of one key that are still processing or open for appends; the next create gets 429.
DEFAULT_MAX_LIVE_TASKS = 1000
#: Tasks per list answer (newest first) when the request has no ``size`` (~30 KB of JSON).
DEFAULT_LIST_SIZE = 100
#: The most tasks one list answer may hold (``size`` is 1 to this).
MAX_LIST_SIZE = 1000
#: Threads decoding images (base64 and fetched) at once; decoding never runs on the event loop.
DEFAULT_DECODE_WORKERS = 2
#: Connections to one image host at once (fetch mode); the service-wide cap is fetch_concurrency.


@dataclass(frozen=True, kw_only=True)
class ServiceConfig:
    """Everything the reference service needs. Keys never show in the repr.

    When both key tuples are empty, the development keys of :mod:`.._config` are accepted.
    """

    api_keys: tuple[str, ...] = field(default=(), repr=False)
    bulk_api_keys: tuple[str, ...] = field(default=(), repr=False)
    task_ttl: float = DEFAULT_TASK_TTL
    result_ttl: float = DEFAULT_RESULT_TTL
    rate: float = 0.0
    fetch: bool = False
    faults: FaultSpec | None = None
    state_path: Path | None = None
    clock: Callable[[], float] | None = None
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    #: Request body bytes being read at once, over every request (None: 8 bodies of
    #: ``max_body_bytes``). A request whose body would pass it gets 503 (Retry-After): without
    #: it each of ``max_connections`` connections could hold ``max_body_bytes`` for
    #: ``body_timeout`` (16 GiB with the defaults).
    max_bodies_bytes: int | None = None
    fetch_concurrency: int = 32
    fetch_per_host: int = DEFAULT_FETCH_PER_HOST
    #: Non-public image hosts (loopback, private, link-local, ...) are refused unless this is
    #: set (``serve --fetch-allow-private``; ``fashiontag demo`` and the tests set it, their
    #: images are served on 127.0.0.1).
    fetch_allow_private: bool = False
    analyzer: Analyzer | None = None
    max_connections: int = DEFAULT_MAX_CONNECTIONS
    keepalive_timeout: float = DEFAULT_KEEPALIVE_TIMEOUT
    header_timeout: float = DEFAULT_HEADER_TIMEOUT
    body_timeout: float = DEFAULT_BODY_TIMEOUT
    max_live_tasks: int = DEFAULT_MAX_LIVE_TASKS
    decode_workers: int = DEFAULT_DECODE_WORKERS

    def __post_init__(self) -> None:
        # (nan passes ``x <= 0``; an expiry past year 9999 cannot be written: every list and
        # status answered 500, and a rate of inf stopped the tagging worker.)
        for name in ("task_ttl", "result_ttl"):
            if not 0 < getattr(self, name) <= MAX_TTL:
                raise ValueError(f"{name} must be seconds > 0 and <= {MAX_TTL:.0f} (100 years)")
        if not 0 <= self.rate < math.inf:
            raise ValueError("rate must be a finite number >= 0 (0: no delay)")
        if self.max_body_bytes < 1024:
            raise ValueError("max_body_bytes must be at least 1024")
        if self.max_bodies_bytes is not None and self.max_bodies_bytes < self.max_body_bytes:
            raise ValueError("max_bodies_bytes must be at least max_body_bytes")
        for name in ("max_connections", "max_live_tasks", "decode_workers", "fetch_per_host"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1")
        for name in ("keepalive_timeout", "header_timeout", "body_timeout"):
            if not getattr(self, name) > 0:  # (nan: every request's connection dropped)
                raise ValueError(f"{name} must be positive")

    @property
    def bodies_budget(self) -> int:
        """Request body bytes read at once, over every request (see ``max_bodies_bytes``)."""
        if self.max_bodies_bytes is not None:
            return self.max_bodies_bytes
        return 8 * self.max_body_bytes

    @property
    def uses_dev_keys(self) -> bool:
        return not self.api_keys and not self.bulk_api_keys
