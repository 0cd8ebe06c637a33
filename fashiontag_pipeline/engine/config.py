"""Engine configuration and the run summary.

:class:`EngineConfig` is the ``[engine]`` table of a TOML config file (see ``configs/``) and the
``engine=`` argument of :func:`~fashiontag_pipeline.engine.run_pipeline`; command-line flags
override it field by field.
"""

from __future__ import annotations

import math
import os
from typing import Literal

import msgspec

from .._fieldtypes import check_field_types
from .._images import DEFAULT_SINGLE_MAX_BYTES
from .._models import MAX_REQUESTS_PER_WRITE, Detection
from .._postgres import foreign_advice, foreign_url, is_postgres_url, redact_url
from .reuse.durations import parse_duration

__all__ = ["EngineConfig", "RunSummary", "SinkKind"]

SinkKind = Literal["jsonl", "sqlite"]

DEFAULT_ROTATE_IMAGES = 50_000
DEFAULT_ROTATE_MIN_IMAGES = 1_000
DEFAULT_ROTATE_FRACTION = 0.02
DEFAULT_ROTATE_SECONDS = 30.0
DEFAULT_EXPIRY_MARGIN = 30.0
DEFAULT_LINGER_SECONDS = 2.0
DEFAULT_PROGRESS_SECONDS = 30.0
DEFAULT_REUSE_MAX_AGE = "30d"
DEFAULT_READ_AGAIN_WINDOW = 30.0
#: Page readers are started up front, one per slot of the page concurrency.
MAX_PAGE_CONCURRENCY = 1_000


class EngineConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Tuning of one run. Every field has a sensible default for the real service.

    * ``chunk_size``: requests per POST/PUT (the service takes at most 1,000).
    * Rotation: a task is sealed (no more writes) once it is full or ``rotate_seconds`` old,
      so that its results are read while later tasks are still being tagged (results are
      readable only when a whole task is done). A new task is full at
      ``rotate_fraction`` x the images already sent to earlier tasks of the run, at least
      ``rotate_min_images`` and at most ``rotate_images``; the task open when the input ends
      is sealed at once.

      Why these defaults. Against a service tagging R images/s in acceptance order, the run
      ends when the last task is done plus the time to read its results; every other task's
      results are read while later ones are tagged. So the last task's size is the cost of
      rotation, and the number of tasks its overhead (one create each, one entry each in
      the list the tracker reads).

      - ``rotate_min_images`` = 1,000 (one write): the first task is done ~1,000/R after
        the run starts, which bounds the time to first result (0.5 s of tagging at
        R = 2,000/s; ~10 s at 100 images/s), and a small run's last task costs ~0.1 s of
        page reads. Measured (CLI, N = 20,000, R = 2,000/s, N/R = 10 s): makespan 10.45-10.50 s
        with 1,000, 10.54-10.58 s with 2,000, ~0.2 s more with 5,000; engine CPU at rate 0
        (N = 100,000) is the same with 1,000 or 2,000 (+~2 us/image against 2 big tasks:
        a few commits per task).
      - ``rotate_fraction`` = 0.02: a task holds at most 2% of what was sent before it, so
        the last one takes at most ~2% of the run to read (if pages are read at least as
        fast as images are tagged) whatever N is, while past the first 100,000 images a run
        needs only O(log N) more tasks (~230 tasks for 1M images, not 1,000).
      - ``rotate_images`` = 50,000 caps a task; at the real service's pace this is still
        minutes of tagging, far inside its 10-minute result TTL (counted from done), and
        writing a task takes well under a second, far inside its 10-minute write TTL.
      - ``rotate_seconds`` = 30: with a slow (trickling) manifest, results still start after
        ~30 s plus tagging, and no task stays open for long; far below the write TTL
        (600 s) minus ``expiry_margin``.
    * ``expiry_margin``: no write is started later than ``taskExpiredAt - expiry_margin``.
    * ``linger_seconds``: a partial chunk waits at most this long for more rows; a daemon
      about to read the next manifest of a burst holds its open task for its rows until
      this long after the last rows came, while files are only settling at most 3 times
      this long after its first rows or its create's answer (a trickle does not hold its
      first results), so that the burst's small manifests share tasks (a service caps the
      live tasks of a key).
    * ``max_write_concurrency`` / ``max_page_concurrency``: caps of the adaptive (AIMD)
      concurrency of writes and result pages.
    * ``poll_min`` / ``poll_max``: bounds of the tracker's poll interval: the next poll is
      aimed at the predicted completion of the earliest task (from the progress counts), so
      a done task is noticed within ~``poll_min``; the interval backs off towards
      ``poll_max`` only while no task progresses.
    * ``give_up_after``: seconds of continuous transport failure after which the run stops
      (state saved) as "service unreachable".
    * ``stall_timeout``: seconds during which none of the tasks the run waits for progresses
      (processed counts still, none done) after which the run stops with its state saved (a
      service that holds a task in TASK_PROCESSING for ever would otherwise keep a nightly
      job running until someone kills it); the same command resumes. Two hours by default:
      a task queued behind a large backlog shows no progress for a while, and a false stop
      costs a resume, not a row. The daemon waits for ever.
    * ``fsync_seconds``: sinks and state are fsync-ed at most this often (0 = every commit).
    * ``single_concurrency``: rows that cannot go through bulk (local files, ``data:`` URIs)
      are tagged one by one on the single endpoint, at most this many at a time.
    * ``single_max_bytes``: a local image file larger than this is rejected without a request
      (the service refuses images over 20 MiB).
    * ``progress_seconds``: when stderr is not a terminal (cron, a log file), the CLI prints
      a progress line this often.
    * ``reuse``: path of the result store (``--reuse``): a row whose request (URL, detection
      after defaults, language, context fields other than ``id``) has a stored successful
      result younger than ``reuse_max_age`` is written from the store, ``"reused": true``,
      without a request; every successful result is stored. None: no store.
    * ``reuse_max_age``: how old a stored result may be to stand in (``30d``, ``12h``, or
      seconds).
    * ``list_lag``: after a create whose answer was lost, seconds the task list is given to
      show the task before the chunk is created again: a service's list may lag its writes
      (an index updated a moment later), and a second create would leave a second live task,
      its rows billed twice. Looked at again at growing intervals within that time, and for
      as long again as the create went unanswered (it timed out, a gateway answered 502/504
      or dropped it: a service that slow may still apply it); at a resume, for a create that
      was on its way when the run died, until the client's request deadline has gone by since
      it was sent (the state records when), 30 s at most in a daemon. Also how long after
      its sealing a task the run created may be unknown to the service (404) before it is
      taken for forgotten (a store that lags its writes as its list does).
    * ``read_again_window``: seconds after a task was seen done during which its pages that
      came short of rows are read again (at growing intervals, 0.25 s doubled) before the
      rows still missing are sent again: a results store that lags the status (short pages
      for a while after "done"). 30 s by default, as a resend bills each row again (and goes
      to a new task whose pages lag as well: 4 s of lag against the 3 s this was fixed at
      before had 1,876 of 2,000 rows billed again and 64 ended ``unreturned``), while the
      wait costs only time, only to a task with rows missing, and holds no page slot (the
      other tasks' pages are read meanwhile). A row a service truly never returns is sent
      again that much later (up to ``max_sends`` times); 0: sent again at once.
    * ``max_sends``: how many times a row is sent to the service in all (its first write and
      the re-sends after a task that did not return it or was forgotten) before it is written
      as a reject of stage ``unreturned`` instead of being sent forever.
    """

    chunk_size: int = MAX_REQUESTS_PER_WRITE
    rotate_images: int = DEFAULT_ROTATE_IMAGES
    rotate_min_images: int = DEFAULT_ROTATE_MIN_IMAGES
    rotate_fraction: float = DEFAULT_ROTATE_FRACTION
    rotate_seconds: float = DEFAULT_ROTATE_SECONDS
    expiry_margin: float = DEFAULT_EXPIRY_MARGIN
    linger_seconds: float = DEFAULT_LINGER_SECONDS
    max_write_concurrency: int = 8
    max_page_concurrency: int = 16
    poll_min: float = 0.05
    poll_max: float = 5.0
    give_up_after: float = 120.0
    stall_timeout: float = 7200.0
    fsync_seconds: float = 1.0
    read_batch_rows: int = 2000
    queue_batches: int = 8
    default_detection: list[Detection] | None = None
    sink: SinkKind = "jsonl"
    single_concurrency: int = 8
    single_max_bytes: int = DEFAULT_SINGLE_MAX_BYTES
    progress_seconds: float = DEFAULT_PROGRESS_SECONDS
    reuse: str | None = None
    reuse_max_age: str | float = DEFAULT_REUSE_MAX_AGE
    max_sends: int = 5
    list_lag: float = 5.0
    read_again_window: float = DEFAULT_READ_AGAIN_WINDOW

    @property
    def reuse_max_age_seconds(self) -> float:
        """``reuse_max_age`` in seconds."""
        return parse_duration(self.reuse_max_age)

    def __repr__(self) -> str:
        # A PostgreSQL URL's password never reaches a repr (``_postgres.redact_url``).
        def shown(name: str) -> object:
            value = getattr(self, name)
            if name == "reuse" and isinstance(value, str) and is_postgres_url(value):
                return redact_url(value)
            return value

        fields = ", ".join(f"{name}={shown(name)!r}" for name in self.__struct_fields__)
        return f"EngineConfig({fields})"

    def __post_init__(self) -> None:
        check_field_types(self, "engine.")
        if not 1 <= self.chunk_size <= MAX_REQUESTS_PER_WRITE:
            raise ValueError(f"engine.chunk_size must be between 1 and {MAX_REQUESTS_PER_WRITE}")
        # (``not x > 0``, not ``x <= 0``: a nan passes every comparison's negation, and was
        # taken: a partial chunk that waited for ever, a task never sealed by age, one task
        # per chunk, outputs never fsync-ed, a progress line that ended the run on a traceback.)
        if self.rotate_images < 1 or not self.rotate_seconds > 0:
            raise ValueError("engine.rotate_images and engine.rotate_seconds must be positive")
        if self.rotate_min_images < 1 or not 0 <= self.rotate_fraction <= 1:
            raise ValueError(
                "engine.rotate_min_images must be positive and rotate_fraction in [0, 1]"
            )
        if not 0 <= self.expiry_margin < math.inf or not self.linger_seconds > 0:
            raise ValueError(
                "engine.expiry_margin must be finite seconds >= 0 and linger_seconds > 0"
            )
        if not self.fsync_seconds >= 0:
            raise ValueError("engine.fsync_seconds must be >= 0 (0: every commit)")
        if self.read_batch_rows < 1 or self.queue_batches < 0:
            raise ValueError("engine.read_batch_rows must be at least 1, queue_batches >= 0")
        if self.max_write_concurrency < 1 or self.max_page_concurrency < 1:
            raise ValueError("engine concurrency caps must be at least 1")
        if self.max_page_concurrency > MAX_PAGE_CONCURRENCY:  # a reader task per slot
            raise ValueError(
                f"engine.max_page_concurrency must be at most {MAX_PAGE_CONCURRENCY:,}"
                " (a page reader is started for each; the pool has max_connections)"
            )
        if self.single_concurrency < 1 or self.single_max_bytes < 1:
            raise ValueError("engine.single_concurrency and single_max_bytes must be positive")
        if self.max_sends < 1:
            raise ValueError("engine.max_sends must be at least 1")
        if not 0 <= self.list_lag < math.inf:
            raise ValueError("engine.list_lag must be a number of seconds >= 0")
        if not 0 <= self.read_again_window < math.inf:
            raise ValueError("engine.read_again_window must be a finite number of seconds >= 0")
        if not self.give_up_after >= 0:
            raise ValueError(
                "engine.give_up_after must be a number of seconds >= 0 (inf: never give up)"
            )
        if not self.stall_timeout > 0:
            raise ValueError("engine.stall_timeout must be positive (inf: wait for ever)")
        if not self.progress_seconds > 0:
            raise ValueError("engine.progress_seconds must be positive")
        if not 0 < self.poll_min <= self.poll_max < math.inf:  # (inf: never polled again)
            raise ValueError("engine.poll_min must be > 0 and <= poll_max, poll_max finite")
        if self.reuse is not None and not self.reuse.strip():  # (--reuse "" is refused too)
            raise ValueError("engine.reuse must not be empty: omit it for no result store")
        if self.reuse is not None and self.reuse.startswith("~"):
            # (TOML expands nothing: ``~/reuse.sqlite`` made a folder ``~`` in the directory
            # the run began in, a new empty store from each directory, every row billed again.)
            msgspec.structs.force_setattr(self, "reuse", os.path.expanduser(self.reuse))
        try:
            parse_duration(self.reuse_max_age)
        except ValueError as err:
            raise ValueError(f"engine.reuse_max_age: {err}") from None
        if self.reuse is not None and foreign_url(self.reuse):
            raise ValueError(
                f"--reuse {redact_url(self.reuse)}: not a result store this fashiontag can use: "
                + foreign_advice(self.reuse)
            )


class RunSummary(msgspec.Struct, kw_only=True):
    """What a run did. Counts are cumulative over every attempt of a resumed run, except
    ``rows_read``, ``retries``, ``rate_limited``, ``ambiguous_writes``, ``expired_writes``,
    ``elapsed_s`` and ``rows_per_s`` which describe this attempt (docs/engine.md's table)."""

    rows_read: int = 0
    submitted: int = 0
    tagged: int = 0
    failed: int = 0
    rejected: int = 0
    #: Rows answered from the result store (``--reuse``): written without a request.
    reused: int = 0
    tasks: int = 0
    pages: int = 0
    retries: int = 0
    rate_limited: int = 0
    ambiguous_writes: int = 0
    expired_writes: int = 0
    #: Rows routed to the single endpoint (local files, data: URIs) that have an outcome.
    single: int = 0
    #: Rows taken into the run that have no outcome yet (0 when complete), and what is still
    #: in flight (the end-of-run reconciliation of the state store).
    unsettled: int = 0
    in_flight: list[str] = msgspec.field(default_factory=list)
    #: Tasks the service forgot (404), and rows sent again (theirs, and rows a finished task
    #: did not return).
    lost_tasks: int = 0
    resent: int = 0
    #: The service's clock minus ours, in seconds, as write deadlines used it (0.0 when the
    #: service's Date headers agree with our clock; None when none was seen).
    server_clock_offset_s: float | None = None
    #: How the state file was opened: new, resumed, replaced (a completed run of other
    #: manifests, or --restart) or complete (nothing to do); ``note`` says why.
    opened: str = "new"
    note: str = ""
    elapsed_s: float = 0.0
    rows_per_s: float = 0.0
    resumed: bool = False
    complete: bool = False
    interrupted: bool = False
    error: str | None = None
    out: str = ""
    rejects: str = ""
    state: str = ""
