"""systemd's notify protocol, without the systemd library.

With ``NOTIFY_SOCKET`` set (a path, or ``@name`` for an abstract socket), the daemon sends
``READY=1`` once its endpoints listen, ``WATCHDOG=1`` every half ``WATCHDOG_USEC``, and
``STOPPING=1`` when it drains. Every send is one datagram on a non-blocking socket: when the
receiver's queue is full (systemd busy or stopped), the datagram is dropped and the daemon goes
on. A watchdog ping that is lost is retried at the next interval, which is half the timeout.

Without ``NOTIFY_SOCKET`` every method does nothing, so the daemon calls them unconditionally.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Mapping
from types import TracebackType

import anyio

__all__ = ["SystemdNotifier"]

logger = logging.getLogger("fashiontag_pipeline.daemon")


class SystemdNotifier:
    """Sends notify messages to the socket named by ``environ`` (default ``os.environ``)."""

    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        env = os.environ if environ is None else environ
        raw = env.get("NOTIFY_SOCKET", "")
        self._address: str | bytes | None = None
        if raw.startswith("@"):
            self._address = b"\0" + raw[1:].encode()  # Linux abstract namespace
        elif raw.startswith("/"):
            self._address = raw
        self.watchdog_interval = self._watchdog_interval(env)
        self._socket: socket.socket | None = None
        self.dropped = 0

    @staticmethod
    def _watchdog_interval(env: Mapping[str, str]) -> float | None:
        """Half of ``WATCHDOG_USEC``, when it is meant for this process (``WATCHDOG_PID``
        unset or ours)."""
        try:
            usec = int(env.get("WATCHDOG_USEC", ""))
        except ValueError:
            return None
        pid = env.get("WATCHDOG_PID")
        if usec <= 0 or (pid and pid != str(os.getpid())):
            return None
        return usec / 2_000_000

    @property
    def enabled(self) -> bool:
        """Whether a notify socket is configured."""
        return self._address is not None

    def notify(self, message: str) -> bool:
        """Send one message (``KEY=VALUE`` lines); True when the datagram left. Never blocks
        and never raises: a full or absent socket drops the message."""
        if self._address is None:
            return False
        try:
            if self._socket is None:
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
                sock.setblocking(False)
                self._socket = sock
            self._socket.sendto(message.encode(), self._address)
        except OSError as exc:  # BlockingIOError (full), ENOENT/ECONNREFUSED (nobody there)
            self.dropped += 1
            logger.debug("systemd notify dropped: %s", exc.strerror or exc)
            return False
        return True

    def ready(self, status: str = "") -> bool:
        """``READY=1`` (the daemon listens; it scans once resumed), with an optional status line."""
        return self.notify("READY=1" + (f"\nSTATUS={status}" if status else ""))

    def stopping(self) -> bool:
        """``STOPPING=1`` (the daemon drains)."""
        return self.notify("STOPPING=1")

    def watchdog(self) -> bool:
        """``WATCHDOG=1`` (the event loop is alive)."""
        return self.notify("WATCHDOG=1")

    def status(self, text: str) -> bool:
        """``STATUS=...`` shown by ``systemctl status``."""
        return self.notify(f"STATUS={text}")

    async def run_watchdog(self) -> None:
        """Ping every ``watchdog_interval`` seconds, forever (run it in the daemon's task
        group; returns at once when no watchdog is configured). Pinging from the event loop
        proves the loop turns: a blocked loop misses pings and systemd restarts the daemon."""
        interval = self.watchdog_interval
        if interval is None or not self.enabled:
            return
        while True:
            self.watchdog()
            await anyio.sleep(interval)

    def close(self) -> None:
        """Close the socket (idempotent)."""
        sock, self._socket = self._socket, None
        if sock is not None:
            sock.close()

    def __enter__(self) -> SystemdNotifier:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
