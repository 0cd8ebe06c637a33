"""The reference service's configuration: one frozen value object and its defaults."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from .analyzer import Analyzer
from .faults import FaultSpec

__all__ = ["DEFAULT_MAX_BODY_BYTES", "DEFAULT_RESULT_TTL", "DEFAULT_TASK_TTL", "ServiceConfig"]

DEFAULT_TASK_TTL = 600.0
DEFAULT_RESULT_TTL = 7 * 86400.0
#: 1,000 requests with 8 KB URLs and full contexts fit with room to spare; so does a 10 MB
#: base64 single-mode image.
DEFAULT_MAX_BODY_BYTES = 16 * 1024 * 1024


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
    fetch_concurrency: int = 32
    analyzer: Analyzer | None = None

    def __post_init__(self) -> None:
        if self.task_ttl <= 0 or self.result_ttl <= 0:
            raise ValueError("task_ttl and result_ttl must be positive")
        if self.rate < 0:
            raise ValueError("rate must not be negative")
        if self.max_body_bytes < 1024:
            raise ValueError("max_body_bytes must be at least 1024")

    @property
    def uses_dev_keys(self) -> bool:
        return not self.api_keys and not self.bulk_api_keys
