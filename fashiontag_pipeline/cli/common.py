"""What every subcommand shares: exit codes, help texts, the client flags and their config.

The CLI is the top layer (see the import-linter contracts in ``pyproject.toml``): the engine and
the service know nothing of it.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

import anyio

from .._config import (
    DEFAULT_BASE_URL,
    ENV_API_KEY,
    ENV_BULK_API_KEY,
    ClientConfig,
    load_client_config,
    shown_url,
    with_default_keys,
)
from .._models import LANGUAGES, Detection
from .._proxies import proxy_for

__all__ = [
    "ABORT_GRACE",
    "DAEMON_EXIT_CODES",
    "DEMO_EXIT_CODES",
    "EXIT_CODES",
    "EXIT_ERROR",
    "EXIT_INCOMPLETE",
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "EXIT_USAGE",
    "KEYS_HELP",
    "SERVE_EXIT_CODES",
    "add_client_arguments",
    "client_config_from_args",
    "leave_if_hung",
    "nonempty",
    "not_utf8",
    "one_line",
    "parse_detection",
    "path_arg",
    "run_async",
    "visible_passwords",
    "working_folder_gone",
]

T = TypeVar("T")

#: Seconds ``run`` or the daemon may take to end once told to stop at once (a second signal; a
#: drain past its timeout): the state call in progress is waited for (it commits or not as a
#: whole), and a state store that does not answer (a paused database server, a partition,
#: where no reset comes) held the process for as long as that lasted.
ABORT_GRACE = 5.0


async def leave_if_hung(aborting: anyio.Event, on_hung: Callable[[], int]) -> None:
    """Once ``aborting`` is set, and the process still runs :data:`ABORT_GRACE` seconds later
    (the caller cancels this task when it ends), report (``on_hung``, which returns the exit
    code) and leave at once, as a kill -9 would: the state is consistent at its last commit,
    and a resume cuts the outputs back to it."""
    await aborting.wait()
    await anyio.sleep(ABORT_GRACE)
    code = on_hung()
    for handler in logging.getLogger().handlers:
        handler.flush()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def nonempty(text: str) -> str:
    """A path or URL flag's value, refused when empty: ``--state "$STATE"`` in a cron line with
    the variable unset is a mistake to name, not the current folder (nor, for ``--reuse``,
    no result store at all: every row billed again)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("is empty (an unset variable in the command line?)")
    return text


def path_arg(text: str) -> Path:
    """A file or folder flag (:func:`nonempty`, as a path)."""
    return Path(nonempty(text))


def file_arg(text: str) -> Path:
    """A flag naming a file the run writes (:func:`path_arg`), refused when it ends in ``/``:
    ``--out exports/`` means a folder, and the path's parsing drops the slash (the results
    went to a file named ``exports``). (A folder that exists, ``/`` or ``exports/``, is
    refused by the run's own check, which says what it is.)"""
    if (scheme := re.match(r"([A-Za-z][A-Za-z0-9+.-]*)://", text)) is not None:
        # (``--out s3://bucket/r.jsonl``: a local folder ``s3:`` was written, exit 0)
        raise argparse.ArgumentTypeError(
            f"is a URL ({scheme[1]}://...): outputs are local files; give a path, and copy the"
            " file where it goes once the run is complete (aws s3 cp, gsutil cp, ...)"
        )
    if text.endswith(("/", os.sep)) and not os.path.isdir(text):
        raise argparse.ArgumentTypeError(
            f"{text} ends in / (a folder): give the path of a file (in it, if you like)"
        )
    return path_arg(text)


EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2
#: The run ended, but the state store shows rows without an outcome: run it again.
EXIT_INCOMPLETE = 3
EXIT_INTERRUPTED = 130

EXIT_CODES = """exit codes:
  0    success (run: every row has an outcome, in the results file or in rejects)
  1    a run or request that ended with an error (refused key, a TLS certificate not
       trusted, service unreachable past --give-up-after, unreadable manifest, HTTP error);
       one line on stderr, state saved
  2    bad usage or configuration (unknown flag, bad flag or config value), or a state
       file that holds an unfinished run of other manifests (nothing touched: finish it, or
       --restart)
  3    run: the run ended but the state shows rows without an outcome; run it again
  130  interrupted (Ctrl-C, SIGTERM); run again with the same --state to resume (one
       that comes while the command starts: nothing read or sent)
"""

SERVE_EXIT_CODES = """exit codes:
  0    stopped by SIGTERM or SIGINT (while it starts too)
  2    bad usage or configuration (unknown flag, bad flag or config value), or the address
       cannot be listened on
"""

DAEMON_EXIT_CODES = """exit codes:
  0    drained after SIGTERM or SIGINT (manifests in flight resume at the next start)
  1    stopped on an error (the state store unwritable, a refused key, a TLS certificate
       not trusted, the --listen address taken); one JSON log line says why: a supervisor
       restarts it
  2    bad usage or configuration (unknown flag, bad flag or config value), or another daemon
       holds the inbox's state
"""

DEMO_EXIT_CODES = """exit codes:
  0    the demo ran end to end and every row has an outcome
  1    it did not (one line on stderr)
  2    bad usage (unknown flag, bad flag value)
  130  interrupted (Ctrl-C, SIGTERM)
"""

KEYS_HELP = """keys and URL: flags, then FASHIONTAG_BASE_URL / FASHIONTAG_API_KEY /
FASHIONTAG_BULK_API_KEY, then the [client] table of --config. With no key anywhere, the
public development keys of `fashiontag serve` are sent."""

_FLAG_WARNING = (
    "fashiontag: warning: {flag} is visible to other users of this machine (ps, /proc); "
    "prefer {var} or a --config file only you can read"
)

_PG_INSTEAD = (
    "give the password in PGPASSWORD or a ~/.pgpass file only you can read (libpq reads them)"
)
#: Flags (args attribute, as shown) whose URL may hold a password, and where to give it instead.
_URL_FLAGS = (
    (
        "base_url",
        "--base-url",
        "give the URL in FASHIONTAG_BASE_URL or a --config file only you can read",
    ),
    ("state", "--state", _PG_INSTEAD),
    ("reuse", "--reuse", _PG_INSTEAD),
    ("store", "STORE", _PG_INSTEAD),  # (``reuse stats|prune``)
)


def visible_passwords(args: argparse.Namespace) -> list[str]:
    """The warnings for a password in a URL given on the command line (``--base-url
    https://u:PW@gw``, ``--state postgresql://u:PW@db/...``), as for a key given as a flag:
    every user of the machine reads it in ``ps``. The password is never shown."""
    from .._postgres import holds_password, is_postgres_url

    found = []
    for attr, flag, instead in _URL_FLAGS:
        value = getattr(args, attr, None)
        if not isinstance(value, str) or "://" not in value:
            continue
        if attr == "base_url":
            holds = shown_url(value.strip()) != value.strip()
        else:
            holds = is_postgres_url(value) and holds_password(value)
        if holds:
            found.append(
                f"{flag} is visible to other users of this machine (ps, /proc), the password"
                f" in its URL with it; {instead}"
            )
    return found


#: A control character left once white space is joined (ESC of a terminal sequence, BEL, DEL,
#: the C1 controls).
_CONTROLS = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def one_line(text: str) -> str:
    """``text`` for a person's terminal, on one line: its runs of white space (line breaks,
    tabs) as one space, any other control character shown escaped (``\\x1b``): a service's
    message (a stack trace, a sequence that clears the screen) never reaches it as sent."""
    return _CONTROLS.sub(lambda m: f"\\x{ord(m.group()):02x}", " ".join(text.split()))


def working_folder_gone() -> str | None:
    """Why the current directory cannot be used (None when it can): removed since the shell
    or job entered it (a release folder a deploy pruned, a scratch folder cleaned), every
    relative path (a manifest, an output, an image path in a manifest) names nothing, and
    each path made absolute raised FileNotFoundError (a traceback, or a bare "No such file
    or directory" once the state was made)."""
    try:
        os.getcwd()
    except OSError as err:
        why = "was removed" if isinstance(err, FileNotFoundError) else f"fails: {err.strerror}"
        return (
            f"the current directory {why}: relative paths (manifests, outputs, image paths in"
            " a manifest) name nothing there; cd to a folder that exists and run it again"
        )
    return None


#: The lone surrogates Python holds an argument's bytes that are not UTF-8 as (PEP 383).
_ESCAPED_BYTE = re.compile("[\udc80-\udcff]")


def not_utf8(text: str) -> str | None:
    """Why an argument ``text`` is no UTF-8 text (the first byte that is not), or None."""
    found = _ESCAPED_BYTE.search(text)
    if found is None:
        return None
    return f"byte 0x{ord(found.group()) - 0xDC00:02X} is not UTF-8 (typed in another encoding?)"


def parse_detection(value: str) -> list[Detection]:
    """``TOP,SHOES`` -> [Detection.TOP, Detection.SHOES]; a clear error names a bad value."""
    out: list[Detection] = []
    for part in value.replace("|", ",").split(","):
        name = part.strip().upper()
        if not name:
            continue
        try:
            out.append(Detection(name))
        except ValueError:
            allowed = ", ".join(d.value for d in Detection)
            raise argparse.ArgumentTypeError(
                f"unknown detection value {part.strip()!r} (allowed: {allowed})"
            ) from None
    if not out:
        raise argparse.ArgumentTypeError("detection needs at least one value")
    return out


def add_client_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags shared by every command that talks to the service."""
    parser.add_argument(
        "--base-url", help=f"service URL (env FASHIONTAG_BASE_URL; default {DEFAULT_BASE_URL})"
    )
    parser.add_argument("--config", type=path_arg, help="TOML config file (see configs/)")
    parser.add_argument("--language", choices=LANGUAGES, help="language of tag names (default en)")
    parser.add_argument(
        "--api-key",
        metavar="KEY",
        help=f"single-mode key (env {ENV_API_KEY}); visible to other users in ps: prefer the "
        "variable",
    )
    parser.add_argument(
        "--bulk-api-key",
        metavar="KEY",
        help=f"bulk key (env {ENV_BULK_API_KEY}); visible to other users in ps: prefer the "
        "variable",
    )


def client_config_from_args(
    args: argparse.Namespace, *, warn: Callable[[str], None] | None = None
) -> ClientConfig:
    """The client config from --config, the environment, then flags.

    With no key configured anywhere, the public development keys are sent, so every command
    works against the embedded reference service with no setup (a real service answers 401).
    ``warn`` takes the warning about a key given as a flag (default: a line on stderr; the
    daemon logs it, so that its stderr stays one JSON object per line).
    """
    api_key = getattr(args, "api_key", None)
    bulk_api_key = getattr(args, "bulk_api_key", None)
    for flag, var, value in (
        ("--api-key", ENV_API_KEY, api_key),
        ("--bulk-api-key", ENV_BULK_API_KEY, bulk_api_key),
    ):
        if value is not None:
            message = _FLAG_WARNING.format(flag=flag, var=var)
            if warn is None:
                print(message, file=sys.stderr)
            else:
                warn(message.removeprefix("fashiontag: warning: "))
    config = load_client_config(
        getattr(args, "config", None),
        overrides={
            "base_url": args.base_url,
            "language": args.language,
            "api_key": api_key,
            "bulk_api_key": bulk_api_key,
        },
    )
    # A proxy variable the client cannot use (HTTPS_PROXY=socks5://...) is said now, exit 2.
    service = urlsplit(config.base_url)
    proxy_for(service.scheme, service.hostname or "", service.port)
    return with_default_keys(config)


def run_async(fn: Callable[[], Awaitable[T]]) -> T:
    """Run ``fn`` on a fresh event loop (uvloop when importable)."""

    async def quiet() -> T:
        _drop_lost_handshake_errors()
        return await fn()

    try:
        import uvloop  # noqa: F401
    except ImportError:
        return anyio.run(quiet)
    return anyio.run(quiet, backend_options={"use_uvloop": True})


def _drop_lost_handshake_errors() -> None:
    """A TLS handshake cut short by the run's end (a refused certificate stops the run while
    another request's handshake is under way) fails after nobody waits for it: the loop would
    print "Future exception was never retrieved" and a traceback on stderr, after the run's
    one-line reason. Those, and only those, are dropped."""
    import asyncio
    import ssl

    loop = asyncio.get_running_loop()
    previous = loop.get_exception_handler()

    def handler(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        error = context.get("exception")
        message = str(context.get("message", ""))
        if isinstance(error, ssl.SSLError | ssl.CertificateError) and message.startswith(
            "Future exception was never retrieved"
        ):
            return
        if previous is not None:
            previous(loop, context)
        else:
            loop.default_exception_handler(context)

    loop.set_exception_handler(handler)
