"""The daemon's logs: one JSON object per line on stderr (text on a terminal), keys redacted.

Built on the standard library's logging, not structlog: the whole package already logs
through stdlib loggers (``fashiontag_pipeline.client``, ``.engine``...), and one formatter on
the root handler gives those records and the daemon's own the same shape with no second
logging system to bridge. Fields travel in ``extra``::

    logger.info("manifest claimed", extra={"manifest": "cat.csv", "rows": 1200})

comes out as::

    {"ts":"2026-11-23T02:00:00.123Z","level":"info","event":"manifest claimed",
     "logger":"fashiontag_pipeline.daemon","manifest":"cat.csv","rows":1200}

The client writes a line for each request it retries, and the engine one for each call it
tries again: at the daemon's INFO level a 429 storm made a line per refused request (111 in
20 s). :data:`RETRY_LINES` lets :data:`RETRY_BURST` of them through per minute and logger
and counts the rest, which the daemon's monitor reports once a minute (``-v`` logs each); the
line ending a streak ("answers again") passes after a shown line of the streak only.

Stdout stays empty (nothing here writes to it). Every configured API key is replaced by
``********`` wherever it appears (message, fields, traceback), before and after JSON encoding
(so an escaped form cannot slip through either).
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import IO, Any

import msgspec

from .._config import Secret
from .._models import format_time
from .config import LogFormat
from .logwriter import QUEUE_LINES, LineWriter

__all__ = [
    "RETRY_LINES",
    "JsonFormatter",
    "Redactor",
    "RetryLineLimiter",
    "TextFormatter",
    "configure_logging",
]

MASK = "********"
#: Attributes every LogRecord has: everything else on a record came from ``extra``.
_RECORD_ATTRS = frozenset(
    logging.LogRecord("", 0, "", 0, "", (), None).__dict__.keys()
    | {"message", "asctime", "taskName"}
)
_HANDLER_MARK = "_fashiontag_daemon_handler"


class Redactor:
    """Replaces every configured secret in a text by a mask (longest first, so a key that
    contains another is masked whole). Empty secrets are ignored."""

    def __init__(self, secrets: Iterable[str | Secret | None] = ()) -> None:
        values = {s.reveal() if isinstance(s, Secret) else s for s in secrets if s}
        self._secrets = sorted((v for v in values if v), key=len, reverse=True)
        # The JSON-escaped form too, for a key holding characters JSON escapes.
        escaped = {msgspec.json.encode(v).decode()[1:-1] for v in self._secrets}
        self._escaped = sorted(escaped - set(self._secrets), key=len, reverse=True)

    def __bool__(self) -> bool:
        return bool(self._secrets)

    def text(self, value: str) -> str:
        for secret in self._secrets:
            if secret in value:
                value = value.replace(secret, MASK)
        return value

    def encoded(self, value: str) -> str:
        """:meth:`text` plus the JSON-escaped forms of the secrets."""
        value = self.text(value)
        for secret in self._escaped:
            if secret in value:
                value = value.replace(secret, MASK)
        return value

    def value(self, value: Any) -> Any:
        """Strings redacted, containers walked, anything else made a (redacted) string unless
        it is a number, bool or None."""
        if isinstance(value, str):
            return self.text(value)
        if value is None or isinstance(value, bool | int | float):
            return value
        if isinstance(value, dict):
            return {self.text(str(k)): self.value(v) for k, v in value.items()}
        if isinstance(value, list | tuple | set | frozenset):
            return [self.value(v) for v in value]
        return self.text(str(value))  # Secret prints its mask; paths, enums their text


#: Loggers that write a line per request or call retried (below WARNING).
RETRY_LOGGERS = frozenset({"fashiontag_pipeline.client", "fashiontag_pipeline.engine.flow"})
#: Such lines let through per logger and :data:`RETRY_WINDOW` seconds.
RETRY_BURST = 2
RETRY_WINDOW = 60.0


class RetryLineLimiter(logging.Filter):
    """Lets :data:`RETRY_BURST` INFO lines per :data:`RETRY_WINDOW` s of each logger of
    :data:`RETRY_LOGGERS` through and counts the others (:meth:`take_left_out`). Warnings
    always pass; a line saying the service answers again passes when a failure line of its
    logger passed since its last one (a flaky service, each failure retried with success,
    would otherwise write a line per failure for the daemon's whole life, each saying the end
    of a streak the log never showed)."""

    def __init__(self, clock: Any = time.monotonic) -> None:
        super().__init__()
        self._clock = clock
        self._windows: dict[str, tuple[float, int]] = {}
        #: Loggers with a failure line shown since their last "answers again".
        self._shown: set[str] = set()
        self.left_out = 0

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name not in RETRY_LOGGERS:
            return True
        if "answers again" in str(record.msg):
            if record.name in self._shown:
                self._shown.discard(record.name)
                return True
            return False  # no request retried: not in left_out
        if record.levelno >= logging.WARNING:
            self._shown.add(record.name)
            return True
        now = self._clock()
        start, seen = self._windows.get(record.name, (-RETRY_WINDOW, 0))
        if now - start >= RETRY_WINDOW:
            start, seen = now, 0
        self._windows[record.name] = (start, seen + 1)
        if seen < RETRY_BURST:
            self._shown.add(record.name)
            return True
        self.left_out += 1
        return False

    def take_left_out(self) -> int:
        """Lines left out since the last call."""
        left_out, self.left_out = self.left_out, 0
        return left_out


#: The daemon's limiter (see :func:`configure_logging`).
RETRY_LINES = RetryLineLimiter()


def _ts(created: float) -> str:
    return format_time(datetime.fromtimestamp(created, UTC))


def _fields(record: logging.LogRecord) -> dict[str, Any]:
    return {
        k: v for k, v in record.__dict__.items() if k not in _RECORD_ATTRS and not k.startswith("_")
    }


class JsonFormatter(logging.Formatter):
    """One JSON object per record: ``ts`` (RFC 3339 UTC, ms), ``level``, ``event`` (the
    message), ``logger``, the ``extra`` fields, and ``exc`` with a traceback."""

    def __init__(self, redactor: Redactor | None = None) -> None:
        super().__init__()
        self.redactor = redactor or Redactor()
        self._encoder = msgspec.json.Encoder()

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "ts": _ts(record.created),
            "level": record.levelname.lower(),
            "event": record.getMessage(),
            "logger": record.name,
        }
        for key, value in _fields(record).items():
            if key not in doc:
                doc[key] = value
        if record.exc_info:
            doc["exc"] = self.formatException(record.exc_info)
        if record.stack_info:
            doc["stack"] = self.formatStack(record.stack_info)
        line = self._encoder.encode(self.redactor.value(doc)).decode()
        return self.redactor.encoded(line)


class TextFormatter(logging.Formatter):
    """``ts level event key=value ...`` for a person at a terminal."""

    def __init__(self, redactor: Redactor | None = None) -> None:
        super().__init__()
        self.redactor = redactor or Redactor()

    def format(self, record: logging.LogRecord) -> str:
        parts = [
            _ts(record.created),
            f"{record.levelname.lower():<7}",
            record.getMessage(),
        ]
        parts.extend(f"{k}={v}" for k, v in _fields(record).items())
        line = " ".join(parts)
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return self.redactor.text(line)


def configure_logging(
    *,
    log_format: LogFormat = "auto",
    level: int = logging.INFO,
    stream: IO[str] | None = None,
    secrets: Iterable[str | Secret | None] = (),
    limit_retry_lines: bool = False,
    background: bool = False,
    queue_lines: int = QUEUE_LINES,
) -> logging.Handler:
    """Route every log record of the process (the package's loggers, aiohttp's, warnings) to
    one handler on ``stream`` (default stderr) in ``log_format``, redacting ``secrets``.

    Replaces the root logger's handlers (the daemon owns its process: a handler left writing
    to stdout would break "stdout stays empty"). Calling it again replaces the handler.
    ``limit_retry_lines``: the lines of requests retried pass :data:`RETRY_LINES`.
    ``background``: the lines go through the bounded queue and writer thread of
    :class:`~.logwriter.LineWriter` (the daemon: a stalled reader never blocks its event loop),
    ``queue_lines`` of them queued at most.
    Returns the handler.
    """
    out = sys.stderr if stream is None else stream
    redactor = Redactor(secrets)
    if log_format == "auto":
        isatty = getattr(out, "isatty", None)
        log_format = "text" if isatty is not None and isatty() else "json"
    formatter: logging.Formatter = (
        TextFormatter(redactor) if log_format == "text" else JsonFormatter(redactor)
    )
    handler: logging.Handler = (
        LineWriter(out, capacity=queue_lines) if background else logging.StreamHandler(out)
    )
    handler.setFormatter(formatter)
    if limit_retry_lines:
        handler.addFilter(RETRY_LINES)
    setattr(handler, _HANDLER_MARK, True)
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
        if getattr(old, _HANDLER_MARK, False):
            old.close()
    root.addHandler(handler)
    root.setLevel(level)
    logging.captureWarnings(True)
    return handler
