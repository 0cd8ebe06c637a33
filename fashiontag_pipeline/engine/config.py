"""Engine configuration and the run summary.

:class:`EngineConfig` is the ``[engine]`` table of a TOML config file (see ``configs/``) and the
``engine=`` argument of :func:`~fashiontag_pipeline.engine.run_pipeline`; command-line flags
override it field by field.
"""

from __future__ import annotations

from typing import Literal

import msgspec

from .._models import MAX_REQUESTS_PER_WRITE, Detection

__all__ = ["EngineConfig", "RunSummary", "SinkKind"]

SinkKind = Literal["jsonl", "sqlite"]

DEFAULT_ROTATE_IMAGES = 50_000
DEFAULT_ROTATE_SECONDS = 120.0
DEFAULT_EXPIRY_MARGIN = 30.0
DEFAULT_LINGER_SECONDS = 2.0


class EngineConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Tuning of one run. Every field has a sensible default for the real service.

    * ``chunk_size``: requests per POST/PUT (the service takes at most 1,000).
    * ``rotate_images`` / ``rotate_seconds``: a task is sealed (no more writes) once it holds
      this many images or is this old, so that its results start flowing before the manifest
      ends (results are readable only when a whole task is done).
    * ``expiry_margin``: no write is started later than ``taskExpiredAt - expiry_margin``.
    * ``linger_seconds``: a partial chunk waits at most this long for more rows.
    * ``max_write_concurrency`` / ``max_page_concurrency``: caps of the adaptive (AIMD)
      concurrency of writes and result pages.
    * ``poll_min`` / ``poll_max``: bounds of the tracker's adaptive poll interval.
    * ``give_up_after``: seconds of continuous transport failure after which the run stops
      (state saved) as "service unreachable".
    * ``fsync_seconds``: sinks and state are fsync-ed at most this often (0 = every commit).
    """

    chunk_size: int = MAX_REQUESTS_PER_WRITE
    rotate_images: int = DEFAULT_ROTATE_IMAGES
    rotate_seconds: float = DEFAULT_ROTATE_SECONDS
    expiry_margin: float = DEFAULT_EXPIRY_MARGIN
    linger_seconds: float = DEFAULT_LINGER_SECONDS
    max_write_concurrency: int = 8
    max_page_concurrency: int = 16
    poll_min: float = 0.05
    poll_max: float = 5.0
    give_up_after: float = 120.0
    fsync_seconds: float = 1.0
    read_batch_rows: int = 2000
    queue_batches: int = 8
    default_detection: list[Detection] | None = None
    sink: SinkKind = "jsonl"

    def __post_init__(self) -> None:
        if not 1 <= self.chunk_size <= MAX_REQUESTS_PER_WRITE:
            raise ValueError(f"engine.chunk_size must be between 1 and {MAX_REQUESTS_PER_WRITE}")
        if self.rotate_images < 1 or self.rotate_seconds <= 0:
            raise ValueError("engine.rotate_images and engine.rotate_seconds must be positive")
        if self.expiry_margin < 0 or self.linger_seconds <= 0:
            raise ValueError("engine.expiry_margin must be >= 0 and linger_seconds > 0")
        if self.max_write_concurrency < 1 or self.max_page_concurrency < 1:
            raise ValueError("engine concurrency caps must be at least 1")
        if not 0 < self.poll_min <= self.poll_max:
            raise ValueError("engine.poll_min must be > 0 and <= poll_max")


class RunSummary(msgspec.Struct, kw_only=True):
    """What a run did. Counts are cumulative over every attempt of a resumed run, except
    ``rows_read``, ``retries``, ``elapsed_s`` and ``rows_per_s`` which describe this attempt."""

    rows_read: int = 0
    submitted: int = 0
    tagged: int = 0
    failed: int = 0
    rejected: int = 0
    tasks: int = 0
    pages: int = 0
    retries: int = 0
    rate_limited: int = 0
    ambiguous_writes: int = 0
    expired_writes: int = 0
    elapsed_s: float = 0.0
    rows_per_s: float = 0.0
    resumed: bool = False
    complete: bool = False
    interrupted: bool = False
    error: str | None = None
    out: str = ""
    rejects: str = ""
    state: str = ""
