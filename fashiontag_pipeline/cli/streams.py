"""The process's standard streams as a job runner may leave them: closed, or read by nobody.

* A descriptor 0, 1 or 2 closed at start (``<&- >&- 2>&-``) is opened on ``/dev/null``: else the
  next file opened takes its number, and the event loop (uvloop) aborts on an epoll descriptor
  numbered 0-2, or a sink would write results onto "stderr".
* Stderr read by nobody any more (``2>&1 | head -1``, a log collector that died) makes every
  progress line and log record a broken pipe, and a log file on a full disk (``2>>
  /var/log/...``) or one that fails makes them ENOSPC or EIO: stderr is for people, so once a
  write to it fails its writes are dropped and the run goes on, its exit code and
  ``--summary`` its own. A write that would block (a non-blocking stderr its reader is slow
  to drain: EAGAIN) drops that line only. Stdout, which may carry data, keeps the usual rule:
  :func:`write_stdout` writes a command's answer and flushes it, and a stdout that cannot take
  it (``> page.json`` on a full disk) is a one-line error, exit 1, not a traceback (nor the
  interpreter's exit 120 when its own flush at exit fails).
"""

from __future__ import annotations

import contextlib
import os
import sys
from typing import Any, TextIO

from .._exceptions import FashiontagError

__all__ = ["guard_standard_streams", "write_stdout"]


def write_stdout(data: bytes | str) -> None:
    """``data`` written to stdout and flushed; :class:`FashiontagError` saying so when it
    cannot be (a full disk, a file size limit, an I/O error)."""
    try:
        if isinstance(data, str):
            sys.stdout.write(data)
        else:
            sys.stdout.flush()
            sys.stdout.buffer.write(data)
        sys.stdout.flush()
    except OSError as err:
        with contextlib.suppress(OSError, ValueError):  # (what is left unwritten is dropped)
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, sys.stdout.fileno())
            os.close(null)
        if not isinstance(err, BrokenPipeError):  # (``| head``: its reader had enough)
            raise FashiontagError(f"cannot write to stdout: {err.strerror or err}") from None


class _ForgivingStream:
    """A text stream whose writes stop, silently, once its reader has gone or a write fails
    (one that would block is dropped alone)."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self._broken = False

    def write(self, text: str) -> int:
        if self._broken:
            return len(text)
        try:
            return self._stream.write(text)
        except BlockingIOError:  # (a non-blocking stderr read slowly: this line only)
            return len(text)
        except (OSError, ValueError):  # (a broken pipe, ENOSPC, EIO; closed)
            self._broken = True
            return len(text)

    def flush(self) -> None:
        if self._broken:
            return
        try:
            self._stream.flush()
        except BlockingIOError:
            pass
        except (OSError, ValueError):  # (a broken pipe, ENOSPC, EIO; closed)
            self._broken = True

    def isatty(self) -> bool:
        return not self._broken and self._stream.isatty()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def guard_standard_streams() -> None:
    """See the module docstring. Call first thing, before any file or event loop is opened."""
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            # The lowest free number is taken: fd itself, as the lower ones are open.
            opened = os.open(os.devnull, os.O_RDWR)
            if opened != fd:  # pragma: no cover - a lower one was closed meanwhile
                os.dup2(opened, fd)
                os.close(opened)
    if sys.stdin is None:
        sys.stdin = open(0, closefd=False)  # noqa: SIM115
    if sys.stdout is None:
        sys.stdout = open(1, "w", closefd=False)  # noqa: SIM115
    if sys.stderr is None:
        sys.stderr = open(2, "w", closefd=False)  # noqa: SIM115
    if not isinstance(sys.stderr, _ForgivingStream):
        sys.stderr = _ForgivingStream(sys.stderr)
