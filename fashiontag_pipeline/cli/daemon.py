"""``fashiontag daemon``: the ingestion daemon (flags, config, signals, logging).

The daemon's parts live in :mod:`fashiontag_pipeline.daemon`; this module turns the command
line and the ``[daemon]`` / ``[client]`` / ``[engine]`` tables of ``--config`` into a
:class:`~fashiontag_pipeline.daemon.runner.Daemon` and runs it until SIGTERM or SIGINT (the
first drains and exits 0; a second stops at once, state consistent).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import errno
import logging
import os
import signal
import sqlite3
import sys
from pathlib import Path
from typing import Any

import anyio
import msgspec

from .._exceptions import ConfigError, FashiontagError, StateConflictError
from .._postgres import foreign_advice, foreign_url, is_postgres_url, redact_url
from ..daemon.config import DaemonConfig, load_daemon_config
from ..daemon.logs import configure_logging
from ..daemon.logwriter import queue_lines
from ..daemon.names import WORK_DIR
from ..daemon.runner import DEFAULT_MAX_PENDING_ROWS, Daemon
from ..engine.engine import RunControl
from ..engine.run_checks import a_folder, not_a_folder, same_file
from .common import (
    ABORT_GRACE,
    EXIT_ERROR,
    EXIT_OK,
    EXIT_USAGE,
    add_client_arguments,
    client_config_from_args,
    leave_if_hung,
    run_async,
    visible_passwords,
)
from .engine_flags import add_engine_arguments, engine_config_from_args
from .startup import take

__all__ = ["add_daemon_arguments", "daemon_command"]

#: Drain (SIGINT, SIGTERM; a second one stops at once) or log and ignore (SIGHUP).
_WATCHED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def add_daemon_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of ``fashiontag daemon`` (each overrides its ``[daemon]`` field)."""
    parser.add_argument("--inbox", metavar="DIR", help="folder manifests are dropped into")
    parser.add_argument("--outbox", metavar="DIR", help="folder outputs are written to")
    parser.add_argument(
        "--state",
        metavar="FILE|URL",
        help="state store: a file (default INBOX/.fashiontag-daemon.sqlite), or a PostgreSQL URL "
        "shared by several daemons on one inbox and outbox",
    )
    parser.add_argument(
        "--lease",
        type=float,
        metavar="S",
        help="with a PostgreSQL state: seconds a manifest's lease lasts unless renewed; a dead "
        "daemon's manifests are taken over after it (default 30)",
    )
    parser.add_argument(
        "--listen",
        metavar="HOST:PORT",
        help="/metrics /livez /readyz /status (default 127.0.0.1:9464; empty: off)",
    )
    parser.add_argument(
        "--settle",
        type=float,
        metavar="S",
        help="a file without NAME.ready is ready once unchanged for S seconds (default 10)",
    )
    parser.add_argument(
        "--scan-interval", type=float, metavar="S", help="seconds between scans (default 2)"
    )
    parser.add_argument(
        "--max-active", type=int, metavar="N", help="manifests tagged at once (default 8)"
    )
    parser.add_argument(
        "--max-pending-rows",
        type=int,
        metavar="N",
        help="rows in flight before reading waits: a manifest dropped behind a big one reaches "
        f"the service within seconds (default {DEFAULT_MAX_PENDING_ROWS:,})",
    )
    parser.add_argument(
        "--drain-timeout",
        type=float,
        metavar="S",
        help="on SIGTERM, seconds to finish writes in flight (default 30)",
    )
    parser.add_argument(
        "--log-format", choices=("json", "text", "auto"), help="log lines (default auto)"
    )
    add_client_arguments(parser)
    add_engine_arguments(parser, give_up=False, jsonl_only=True)


def daemon_config_from_args(args: argparse.Namespace) -> DaemonConfig:
    base = load_daemon_config(getattr(args, "config", None))
    overrides: dict[str, Any] = {
        "inbox": args.inbox,
        "outbox": args.outbox,
        "state": args.state,
        "listen": args.listen,
        "settle": args.settle,
        "scan_interval": args.scan_interval,
        "max_active": args.max_active,
        "drain_timeout": args.drain_timeout,
        "log_format": args.log_format,
        "lease": args.lease,
    }
    changes = {k: v for k, v in overrides.items() if v is not None}
    try:
        config = msgspec.structs.replace(base, **changes) if changes else base
        config.require_folders()
    except (ValueError, TypeError) as err:
        raise ConfigError(f"invalid daemon option: {err}") from None
    return config


def daemon_command(args: argparse.Namespace) -> int:
    """``fashiontag daemon``: returns the exit code (0 after a drain)."""
    warnings: list[str] = []  # logged once the logs are set up (JSON lines on stderr)
    try:
        config = daemon_config_from_args(args)
        client = client_config_from_args(args, warn=warnings.append)
        warnings += visible_passwords(args)
        engine = engine_config_from_args(args)
        log_queue = queue_lines()
    except (ConfigError, ValueError) as err:
        print(f"fashiontag: {err}", file=sys.stderr)
        return EXIT_USAGE
    if args.max_pending_rows is not None and args.max_pending_rows < 1:
        print("fashiontag: --max-pending-rows must be at least 1", file=sys.stderr)
        return EXIT_USAGE
    location = config.state_location()
    if ("://" in location or foreign_url(location)) and not is_postgres_url(location):
        print(
            f"fashiontag: --state {redact_url(location)}: not a state this fashiontag can use: "
            + foreign_advice(location),
            file=sys.stderr,
        )
        return EXIT_USAGE
    if engine.sink != "jsonl":
        print(
            "fashiontag: the daemon writes each manifest's results as OUTBOX/STEM/results.jsonl"
            " (and several daemons hand a manifest over by its JSONL files): --sink sqlite is"
            " for fashiontag run; leave --sink (engine.sink in a config file) at jsonl",
            file=sys.stderr,
        )
        return EXIT_USAGE
    inbox, outbox = config.require_folders()
    if not inbox.is_dir():
        print(f"fashiontag: inbox {inbox} is not a folder", file=sys.stderr)
        return EXIT_USAGE
    blocker = not_a_folder(outbox)
    if blocker is not None:
        # The daemon creates the outbox: a file there (or on its path), or a symlink to
        # nothing (a file system not mounted), made its mkdir fail with FileExistsError or
        # NotADirectoryError as the only explanation (exit 1, at every restart).
        where = "" if blocker == outbox else f" ({blocker} is a file)"
        if blocker.is_symlink():
            where = (
                f" ({blocker} is a symlink to {os.readlink(blocker)}, which does not exist:"
                " a file system not mounted?)"
            )
        print(f"fashiontag: outbox {outbox} is not a folder{where}", file=sys.stderr)
        return EXIT_USAGE
    overlap = _overlap(inbox, outbox) or _work_elsewhere(inbox)
    if overlap is not None:
        print(f"fashiontag: {overlap}", file=sys.stderr)
        return EXIT_USAGE
    # A folder, a device or a pipe, or a path under a symlink to nothing: else exit 1 on
    # SQLite's "unable to open database file", "disk I/O error" or "File exists" (the store's
    # advice then: move it away, every row tagged again), at every restart.
    files = (("--state", location), ("--reuse", engine.reuse))
    problem = a_folder([(w, Path(p)) for w, p in files if p is not None and "://" not in p])
    if problem is not None:
        print(f"fashiontag: {problem}", file=sys.stderr)
        return EXIT_USAGE
    if engine.reuse is not None and "://" not in location and "://" not in engine.reuse:
        # (As run refuses it: else the state went into the result store, or, for a new file,
        # exit 1 at every restart since the state made it first.)
        clash = same_file([("--state", location), ("--reuse", engine.reuse)])
        if clash is not None:
            print(f"fashiontag: {clash}", file=sys.stderr)
            return EXIT_USAGE
    level = logging.INFO if args.verbose < 2 else logging.DEBUG
    configure_logging(
        log_format=config.log_format,
        level=level,
        secrets=[client.api_key, client.bulk_api_key],
        limit_retry_lines=args.verbose < 1,
        background=True,
        queue_lines=log_queue,
    )
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    control = RunControl()
    daemon = Daemon(
        config,
        client=client,
        engine=engine,
        control=control,
        max_pending_rows=args.max_pending_rows or DEFAULT_MAX_PENDING_ROWS,
    )
    log = logging.getLogger("fashiontag_pipeline.daemon")
    for warning in warnings:
        log.warning(warning)

    def hung() -> int:
        log.error(
            "the state store does not answer: stopping without it",
            extra={"waited_s": ABORT_GRACE, "note": "what it committed is kept; a restart resumes"},
        )
        return EXIT_ERROR

    async def main() -> None:
        # The handlers are Python ones, installed here and never taken back: anyio's signal
        # receiver gave the default handlers back when it closed, while the event loop was
        # still winding down, and a second SIGTERM there (within ~0.1 s of "daemon stopped")
        # killed the drained daemon (exit -15). Once the daemon has stopped, the signals are
        # ignored (SIG_IGN, kept through the interpreter's exit) until the process is gone.
        loop = asyncio.get_running_loop()
        stopped = False

        def received(signum: int) -> None:  # on the event loop
            if stopped:
                return
            if signum == signal.SIGHUP:
                # SIGHUP (a closed terminal, a log rotation's kill -HUP) would kill the daemon
                # silently, and systemd's Restart=on-failure takes that for a clean stop: it
                # is logged and ignored (the logs go to stderr; there is nothing to reopen).
                log.info("signal SIGHUP: ignored (SIGTERM drains and stops)")
            elif control.stopping.is_set():
                log.warning("second signal: stopping now")
                daemon.abort()
            else:
                log.info("signal %s: draining", signal.Signals(signum).name)
                daemon.stop()

        def handler(signum: int, frame: object) -> None:  # between two bytecodes
            # A closed loop (RuntimeError): the daemon is on its way out.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(received, signum)

        for signum in _WATCHED:
            signal.signal(signum, handler)
        # One held while the command started (its imports, its checks): a SIGHUP is logged and
        # ignored as ever; a stop ends the daemon here, before it claims or sends anything.
        early = take(*_WATCHED)
        if signal.SIGHUP in early:
            early.remove(signal.SIGHUP)
            log.info("signal SIGHUP while starting: ignored (SIGTERM drains and stops)")
        try:
            if early:
                name = signal.Signals(early[0]).name
                log.info("signal %s while starting: stopped, nothing claimed", name)
                return
            async with anyio.create_task_group() as tg:
                tg.start_soon(leave_if_hung, control.aborting, hung)
                await daemon.run()
                tg.cancel_scope.cancel()
        finally:
            stopped = True
            for signum in _WATCHED:
                signal.signal(signum, signal.SIG_IGN)

    try:
        run_async(main)
    except BaseExceptionGroup as group:
        return _report(_first(group), log)
    except (FashiontagError, OSError, sqlite3.Error) as err:
        return _report(err, log)
    return EXIT_OK


def _overlap(inbox: Path, outbox: Path) -> str | None:
    """Why ``inbox`` and ``outbox`` cannot be used together (one folder, or one inside the
    other, symlinks resolved), else None: a manifest ``done.csv`` wrote into the inbox's
    ``done/``, an inbox inside the outbox took a manifest's ``results.jsonl`` for a manifest."""
    real_in, real_out = inbox.resolve(), outbox.resolve()
    if real_in == real_out:
        how = f"and --outbox {outbox} are one folder ({real_in})"
    elif real_in in real_out.parents:
        how = f"holds --outbox {outbox}"
    elif real_out in real_in.parents:
        how = f"is inside --outbox {outbox}"
    else:
        return None
    return (
        f"--inbox {inbox} {how}: inbox and outbox must be separate folders, neither inside"
        " the other"
    )


def _work_elsewhere(inbox: Path) -> str | None:
    """Why ``INBOX/.work`` cannot be used (None when it can, or is not made yet): on another
    file system than the inbox (a mount there, a symlink to another disk), every claim's
    rename into it gives EXDEV, and the daemon, ready, tagged nothing."""
    work = inbox / WORK_DIR
    try:
        if os.stat(work).st_dev == os.stat(inbox).st_dev and not _crosses_mounts(inbox, work):
            return None
    except OSError:
        return None  # not there yet (made at start), or said by the start's mkdir
    return (
        f"{work} is on another file system than the inbox {inbox} (a mount, or a symlink to"
        f" another disk): a claim is a rename into it; make {WORK_DIR} a plain folder of the"
        " inbox (done/ and failed/ may be elsewhere)"
    )


def _crosses_mounts(inbox: Path, work: Path) -> bool:
    """Whether a rename from ``inbox`` into ``work`` (one file system: the same st_dev) gives
    EXDEV all the same: ``work`` a bind mount (a container's second volume of the same disk,
    a Kubernetes volume mounted again by subPath), which no rename crosses. Tried with a
    hidden file of the inbox's own (a scan takes no hidden name), removed at once; an inbox
    that cannot be written is left to the start to say."""
    probe = inbox / f".fashiontag-probe-{os.getpid()}.tmp"
    try:
        probe.touch(exist_ok=False)
    except OSError:
        return False
    try:
        os.rename(probe, work / probe.name)
    except OSError as err:
        probe.unlink(missing_ok=True)
        return err.errno == errno.EXDEV
    (work / probe.name).unlink(missing_ok=True)
    return False


def _first(group: BaseExceptionGroup[Any]) -> BaseException:
    first: BaseException = group.exceptions[0]
    if isinstance(first, BaseExceptionGroup):
        return _first(first)
    return first


def _report(err: BaseException, log: logging.Logger) -> int:
    if isinstance(err, KeyboardInterrupt):
        return EXIT_OK
    message = " ".join(str(err).split())
    said = (FashiontagError, OSError, sqlite3.Error)
    # An error with no words of its own (a bug; MemoryError under a ulimit -v): its traceback
    # goes in the line's ``exc`` field (redacted), not on stderr after it, where a log shipper
    # reading one JSON object a line met ~170 lines of text.
    exc_info = None if isinstance(err, said) else err
    log.error(
        "daemon stopped on an error",
        exc_info=exc_info,
        extra={"error": f"{type(err).__name__}: {message}"},
    )
    if isinstance(err, StateConflictError):
        return EXIT_USAGE
    if isinstance(err, Exception):
        return EXIT_ERROR
    for handler in logging.getLogger().handlers:
        handler.flush()  # (the queued lines before it)
    raise err
