"""The ``[daemon]`` table of a config file: where the daemon reads, writes and listens.

::

    [daemon]
    inbox = "/srv/fashiontag/inbox"
    outbox = "/srv/fashiontag/outbox"
    listen = "127.0.0.1:9464"   # "" disables the HTTP endpoints
    settle = 10.0
    max_active = 8

Command-line flags (``--inbox``, ``--settle``...) override the file field by field, the same way
``run``'s flags override ``[engine]``. Errors name the field (``daemon.settle``).
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Literal

import msgspec

from .._config import load_section
from .._postgres import is_postgres_url, redact_url

__all__ = [
    "DEFAULT_DRAIN_TIMEOUT",
    "DEFAULT_LISTEN",
    "DEFAULT_MAX_ACTIVE",
    "DEFAULT_SCAN_INTERVAL",
    "DEFAULT_SETTLE",
    "DEFAULT_STATE_NAME",
    "DaemonConfig",
    "LogFormat",
    "load_daemon_config",
    "parse_listen",
]

DEFAULT_LISTEN = "127.0.0.1:9464"
DEFAULT_SETTLE = 10.0
DEFAULT_SCAN_INTERVAL = 2.0
DEFAULT_MAX_ACTIVE = 8
DEFAULT_DRAIN_TIMEOUT = 30.0
#: The state store's file when none is configured: inside the inbox, under a name the scanner
#: ignores (it starts with a dot), so that one folder holds a whole deployment's state.
DEFAULT_STATE_NAME = ".fashiontag-daemon.sqlite"

#: ``auto``: JSON lines, or text when stderr is a terminal.
LogFormat = Literal["auto", "json", "text"]


def parse_listen(listen: str) -> tuple[str, int] | None:
    """``HOST:PORT`` (``[::1]:9464`` for IPv6) as ``(host, port)``; ``""`` (disabled) as None.

    Port 0 asks the system for a free port (tests). Raises ValueError naming what is wrong.
    """
    text = listen.strip()
    if not text:
        return None
    host, sep, port_text = text.rpartition(":")
    if not sep or not host:
        raise ValueError(f"listen must be HOST:PORT or empty, got {listen!r}")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif ":" in host:
        raise ValueError(f"listen: write an IPv6 address in brackets ([::1]:9464), got {listen!r}")
    try:
        port = int(port_text)
    except ValueError:
        raise ValueError(f"listen port must be a number, got {listen!r}") from None
    if not 0 <= port <= 65535:
        raise ValueError(f"listen port must be between 0 and 65535, got {listen!r}")
    return host, port


class DaemonConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Everything the daemon needs besides the client and engine sections.

    * ``inbox`` / ``outbox``: folders (required, from the file or ``--inbox`` / ``--outbox``).
    * ``state``: the state store, a file path (default ``INBOX/.fashiontag-daemon.sqlite``),
      or a ``postgresql://`` URL that several daemons on one inbox and outbox share.
    * ``lease``: with a PostgreSQL state, seconds a manifest's lease lasts unless renewed (a
      third of it between renewals); a dead daemon's manifests are taken over after it.
    * ``listen``: ``HOST:PORT`` of ``/metrics``, ``/livez``, ``/readyz``, ``/status``; empty
      disables them.
    * ``settle``: a manifest without a ``NAME.ready`` marker is ready once its size and mtime
      have not changed for this many seconds.
    * ``scan_interval``: seconds between two scans of the inbox.
    * ``max_active``: manifests read at the same time (the rest wait, in arrival order).
    * ``drain_timeout``: on SIGTERM, seconds to finish writes in flight before exiting.
    * ``log_format``: ``json`` lines, ``text``, or ``auto`` (text on a terminal).
    * ``unreachable_after``: ``/readyz`` says 503 once the service has not answered, or has
      answered only 429 or 5xx, for this many seconds (default 30).
    """

    inbox: str | None = None
    outbox: str | None = None
    state: str | None = None
    listen: str = DEFAULT_LISTEN
    settle: float = DEFAULT_SETTLE
    scan_interval: float = DEFAULT_SCAN_INTERVAL
    max_active: int = DEFAULT_MAX_ACTIVE
    drain_timeout: float = DEFAULT_DRAIN_TIMEOUT
    log_format: LogFormat = "auto"
    unreachable_after: float = 30.0
    lease: float = 30.0

    def __repr__(self) -> str:
        # A PostgreSQL URL's password never reaches a repr (``_postgres.redact_url``).
        def shown(name: str) -> object:
            value = getattr(self, name)
            if name == "state" and isinstance(value, str) and is_postgres_url(value):
                return redact_url(value)
            return value

        fields = ", ".join(f"{name}={shown(name)!r}" for name in self.__struct_fields__)
        return f"DaemonConfig({fields})"

    def __post_init__(self) -> None:
        for name in ("inbox", "outbox", "state"):
            value = getattr(self, name)
            if value is not None and not value.strip():
                raise ValueError(f"daemon.{name} must not be empty")
            if value is not None and value.startswith("~"):  # (TOML expands nothing: a
                # folder ``~`` was made in the daemon's working directory, `/` under systemd)
                msgspec.structs.force_setattr(self, name, os.path.expanduser(value))
        # (``not x >= 0``, not ``x < 0``: nan passes every comparison's negation.)
        if not self.settle >= 0:
            raise ValueError(f"daemon.settle must be >= 0 seconds, got {self.settle}")
        if not 0 < self.scan_interval < math.inf:
            raise ValueError(
                f"daemon.scan_interval must be finite seconds > 0, got {self.scan_interval}"
            )
        if self.max_active < 1:
            raise ValueError(f"daemon.max_active must be at least 1, got {self.max_active}")
        if not self.unreachable_after > 0:
            raise ValueError(
                f"daemon.unreachable_after must be > 0 seconds, got {self.unreachable_after}"
            )
        if not 0 < self.lease <= 86_400:
            raise ValueError(f"daemon.lease must be > 0 and <= 86400 seconds, got {self.lease}")
        if not self.drain_timeout >= 0:
            raise ValueError(f"daemon.drain_timeout must be >= 0 seconds, got {self.drain_timeout}")
        try:
            parse_listen(self.listen)
        except ValueError as exc:
            raise ValueError(f"daemon.{exc}") from None

    @property
    def listen_address(self) -> tuple[str, int] | None:
        """``(host, port)`` to listen on, or None when the endpoints are disabled."""
        return parse_listen(self.listen)

    def state_location(self) -> str:
        """The configured state store, or the default file inside the inbox."""
        if self.state is not None:
            return self.state
        if self.inbox is None:
            raise ValueError("daemon.inbox is required (in [daemon] or --inbox)")
        return str(Path(self.inbox) / DEFAULT_STATE_NAME)

    def require_folders(self) -> tuple[Path, Path]:
        """``(inbox, outbox)``; raises ValueError naming the one that is missing."""
        if self.inbox is None:
            raise ValueError("daemon.inbox is required (in [daemon] or --inbox)")
        if self.outbox is None:
            raise ValueError("daemon.outbox is required (in [daemon] or --outbox)")
        return Path(self.inbox), Path(self.outbox)


def load_daemon_config(path: str | Path | None) -> DaemonConfig:
    """``[daemon]`` of a TOML file (defaults without a file); a bad value raises
    :class:`~fashiontag_pipeline.ConfigError` naming the field."""
    return load_section(path, "daemon", DaemonConfig)
