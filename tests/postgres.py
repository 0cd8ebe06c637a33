"""A real PostgreSQL for the tests, started by the tests themselves (never a mock).

The server binaries come from the ``pgserver`` wheel (PostgreSQL 16 built for manylinux and
macOS, a dev dependency), or from ``FASHIONTAG_TEST_PG_BIN`` (a folder holding ``initdb``,
``pg_ctl`` and ``postgres``: the distribution's PostgreSQL, say). Only the binaries are used:
pgserver's own server manager is not (it changes the permissions of every parent folder,
registers atexit hooks and keeps a lock file under the user's runtime folder), so this module
runs ``initdb`` and ``pg_ctl`` itself.

The server listens on a Unix socket in a private temporary folder and on no TCP port at all, so
nothing leaves the machine and suites running side by side never collide on a port. PostgreSQL
refuses to run as root: as root, the cluster belongs to ``nobody`` and its commands run as that
user. Durability is traded for speed (``fsync=off``): a test server need not survive a power cut,
and an immediate stop still exercises crash recovery (the OS keeps what was written; commits
still write their WAL before they return, so a crash loses no committed transaction).
"""

from __future__ import annotations

import contextlib
import importlib.util
import itertools
import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Literal
from urllib.parse import quote

import psycopg

__all__ = ["PostgresCluster", "find_bin_dir"]

#: How long pg_ctl may take to start or stop the server before the test fails.
PG_CTL_TIMEOUT = 60

#: Settings of a test server: no TCP, fast and small.
SETTINGS = {
    "listen_addresses": "''",
    "fsync": "off",
    "full_page_writes": "off",
    "max_connections": "200",
    "shared_buffers": "32MB",
    "log_min_messages": "warning",
}

StopMode = Literal["smart", "fast", "immediate"]

#: The watchdog of a cluster: when the test process is gone (killed, even with SIGKILL, so that
#: no finalizer ran), it stops the server and deletes its folder. Arguments: the test process's
#: pid, the folder, the uid and gid to run pg_ctl as (-1: our own), the pg_ctl command line.
WATCHDOG = """
import os, shutil, subprocess, sys, time
pid, root, stop = int(sys.argv[1]), sys.argv[2], sys.argv[5:]
uid, gid = int(sys.argv[3]), int(sys.argv[4])
while True:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        break
    time.sleep(1)
as_user = dict(user=uid, group=gid, extra_groups=[]) if uid >= 0 else {}
subprocess.run(stop, capture_output=True, timeout=60, **as_user)
shutil.rmtree(root, ignore_errors=True)
"""


def find_bin_dir() -> Path:
    """The folder of the PostgreSQL server binaries the tests run."""
    configured = os.environ.get("FASHIONTAG_TEST_PG_BIN")
    if configured:
        return Path(configured)
    # find_spec does not import pgserver: importing it has side effects (a warning when
    # XDG_RUNTIME_DIR is unset, a lock file) the tests do not want.
    spec = importlib.util.find_spec("pgserver")
    if spec is None or spec.origin is None:
        raise RuntimeError(
            "no PostgreSQL for the tests: install the dev extra (pip install -e '.[dev]', which "
            "brings the pgserver wheel) or set FASHIONTAG_TEST_PG_BIN to a folder with initdb, "
            "pg_ctl and postgres"
        )
    return Path(spec.origin).parent / "pginstall" / "bin"


class PostgresCluster:
    """One PostgreSQL server in a temporary folder: start, stop, restart, fresh databases.

    Each :meth:`create_schema` (or :meth:`create_database`) gives a new empty namespace and its
    URL, so tests never see each other's rows while sharing one server (starting a server costs
    about a second).
    """

    def __init__(self, bin_dir: Path | None = None) -> None:
        self.bin_dir = bin_dir or find_bin_dir()
        # /tmp when root (the server's user must be able to reach the folder, and TMPDIR may
        # be private) or when TMPDIR is long: a Unix socket's path must fit in about 100 bytes.
        parent = None if os.geteuid() != 0 and len(tempfile.gettempdir()) < 60 else "/tmp"
        self.root = Path(tempfile.mkdtemp(prefix="ftpg-", dir=parent))
        self.data = self.root / "data"
        self.log = self.root / "server.log"
        self._as_user: pwd.struct_passwd | None = None
        if os.geteuid() == 0:
            self._as_user = pwd.getpwnam("nobody")
            os.chown(self.root, self._as_user.pw_uid, self._as_user.pw_gid)
        self._names = itertools.count(1)
        self.running = False
        self._shared: str | None = None
        self._initdb()
        self._watchdog = self._start_watchdog()

    # -- the server's life ------------------------------------------------------------------

    def _command(self, name: str, *args: str) -> subprocess.CompletedProcess[str]:
        user = self._as_user
        return subprocess.run(
            [str(self.bin_dir / name), *args],
            check=True,
            capture_output=True,
            text=True,
            timeout=PG_CTL_TIMEOUT,
            cwd=self.root,
            user=user.pw_uid if user else None,
            group=user.pw_gid if user else None,
            extra_groups=[] if user else None,
            env={**os.environ, "LC_ALL": "C", "LANG": "C"},
        )

    def _start_watchdog(self) -> subprocess.Popen[bytes]:
        stop = [str(self.bin_dir / "pg_ctl"), "stop", "-w", "-m", "immediate", "-D", str(self.data)]
        user = self._as_user  # pg_ctl refuses root: the watchdog runs it as the server's user
        ids = [str(user.pw_uid), str(user.pw_gid)] if user else ["-1", "-1"]
        return subprocess.Popen(
            [sys.executable, "-c", WATCHDOG, str(os.getpid()), str(self.root), *ids, *stop],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,  # a signal to the test's process group does not reach it
        )

    def _initdb(self) -> None:
        self._command(
            "initdb",
            "-D",
            str(self.data),
            "-U",
            "postgres",
            "--auth=trust",
            "--encoding=UTF8",
            "--no-locale",
            "--no-sync",
        )

    def start(self) -> None:
        """Start the server and wait until it accepts connections."""
        options = " ".join(f"-c {k}={v}" for k, v in SETTINGS.items())
        self._command(
            "pg_ctl",
            "start",
            "-w",
            "-D",
            str(self.data),
            "-l",
            str(self.log),
            "-o",
            f"-k {self.root} {options}",
        )
        self.running = True

    def stop(self, mode: StopMode = "fast") -> None:
        """Stop the server: ``fast`` disconnects every client and shuts down cleanly;
        ``immediate`` is a crash (no shutdown checkpoint: the next start recovers from WAL)."""
        self._command("pg_ctl", "stop", "-w", "-m", mode, "-D", str(self.data))
        self.running = False

    def restart(self, mode: StopMode = "fast") -> None:
        """Stop then start the server: every open connection breaks, the data stays."""
        self.stop(mode)
        self.start()

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """The server paused for the ``with`` body (SIGSTOP of the postmaster and its
        backends, SIGCONT after): a server that stops answering without closing a connection,
        as a stalled machine or a network partition does."""
        postmaster = int((self.data / "postmaster.pid").read_text().split()[0])
        children = subprocess.run(
            ["pgrep", "-P", str(postmaster)], capture_output=True, text=True, check=False
        ).stdout.split()
        pids = [postmaster, *map(int, children)]
        try:
            for pid in pids:
                os.kill(pid, signal.SIGSTOP)
            yield
        finally:
            for pid in pids:
                os.kill(pid, signal.SIGCONT)

    def destroy(self) -> None:
        """Stop the server (as a crash: nothing to keep) and delete its folder. Idempotent."""
        if self.running:
            self.stop("immediate")
        shutil.rmtree(self.root, ignore_errors=True)
        if self._watchdog.poll() is None:
            self._watchdog.kill()
            self._watchdog.wait()

    # -- databases --------------------------------------------------------------------------

    def url(self, database: str = "postgres") -> str:
        """A ``postgresql://`` URL of a database on this server (over its Unix socket)."""
        return f"postgresql://postgres@/{database}?host={quote(str(self.root), safe='/')}"

    def create_schema(self, prefix: str = "test") -> str:
        """A new empty schema in the session's shared database; returns a URL whose connections
        see only it (``search_path``). Much cheaper than a database (milliseconds, against a
        few hundred under load), and as good for code that names its tables unqualified."""
        if self._shared is None:
            self._shared = self.create_database("shared")
        name = f"{prefix}_{os.getpid()}_{next(self._names)}"
        with psycopg.connect(self._shared, autocommit=True) as conn:
            conn.execute(f'CREATE SCHEMA "{name}"')
        return f"{self._shared}&options=-csearch_path%3D{name}"

    def create_database(self, prefix: str = "test") -> str:
        """A new empty database; returns its URL."""
        name = f"{prefix}_{os.getpid()}_{next(self._names)}"
        with psycopg.connect(self.url(), autocommit=True) as conn:
            # FILE_COPY (PostgreSQL 15+): copying the small template's files beats logging
            # them (the default) by a few times on a server without fsync.
            conn.execute(f'CREATE DATABASE "{name}" STRATEGY FILE_COPY')
        return self.url(name)
