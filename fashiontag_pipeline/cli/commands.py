"""The ``fashiontag`` command line: one parser, thin subcommands.

``serve`` lives in :mod:`fashiontag_pipeline.service.cli` (the service half's own command),
``run`` in :mod:`.run`, ``demo`` in :mod:`.demo`, ``tag`` and ``tasks`` in
:mod:`.client_commands`; each offers ``add_*_arguments(parser)`` and ``*_command(args) -> int``.
Each half's arguments (and imports) are registered only for its own subcommand.

Exit codes: 0 success, 1 a run that ended with an error, 2 bad usage or configuration (or a
state file of an unfinished run of other manifests), 3 a run that ended with rows still lacking
an outcome (or a manifest that grew after it was read), 130 interrupted.
"""

from __future__ import annotations

import argparse
import difflib
import logging
import re
import sys
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

import anyio

from .._exceptions import ConfigError, FashiontagError
from .._models import MAX_PAGE_SIZE
from .client_commands import add_give_up_argument, tag_command, tasks_command
from .common import (
    DAEMON_EXIT_CODES,
    DEMO_EXIT_CODES,
    EXIT_CODES,
    EXIT_ERROR,
    EXIT_INTERRUPTED,
    EXIT_USAGE,
    KEYS_HELP,
    SERVE_EXIT_CODES,
    add_client_arguments,
    not_utf8,
    one_line,
    parse_detection,
    visible_passwords,
    working_folder_gone,
)
from .startup import HELD, interrupt_on_term, release, resume_collections, take
from .streams import guard_standard_streams

__all__ = ["configure_logging", "main"]


def _command_of(argv: Sequence[str]) -> str | None:
    """The subcommand named on the command line (top-level options take no values)."""
    return next((arg for arg in argv if not arg.startswith("-")), None)


def _int_from(low: int, high: int | None = None) -> Callable[[str], int]:
    """An argparse type: an integer in ``[low, high]`` (a bad value is exit 2 with usage)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
        if value < low or (high is not None and value > high):
            bounds = f"between {low} and {high}" if high is not None else f"at least {low}"
            raise argparse.ArgumentTypeError(f"must be {bounds}, got {value}")
        return value

    return parse


def _task_id(text: str) -> str:
    if not text:
        raise argparse.ArgumentTypeError("a task id must not be empty")
    if (problem := not_utf8(text)) is not None:  # (no request can carry it: a traceback)
        raise argparse.ArgumentTypeError(f"a task id is UTF-8 text: {problem}")
    return text


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser that keeps the usage error it exits with (for ``run --summary``),
    the secrets of the command line out of it."""

    refusal: str | None = None
    #: The command line parsed (its secrets are masked in a usage error).
    arguments: Sequence[str] = ()

    def error(self, message: str) -> NoReturn:
        message = _without_secrets(message, _Parser.arguments)
        _Parser.refusal = f"{self.prog}: {message}"
        super().error(message)


#: A flag named like a secret (``--api_key``, a misspelt ``--bulk-apikey``, ``--password``),
#: or several (``--api-keys``).
_SECRET_FLAG = re.compile(r"--?[\w-]*(?:key|pass|password|passwd|secret|token)s?", re.IGNORECASE)
#: The key flags: an abbreviation of one (``--bulk=KEY``; ``--b=KEY``, ambiguous, is repeated
#: whole by argparse) holds a key too.
_KEY_FLAGS = ("--api-key", "--bulk-api-key")


def _secret_flag(flag: str) -> bool:
    return _SECRET_FLAG.fullmatch(flag) is not None or (
        len(flag) > 2 and flag.startswith("--") and any(k.startswith(flag) for k in _KEY_FLAGS)
    )


def _without_secrets(message: str, arguments: Sequence[str]) -> str:
    """``message`` with the value of each flag named like a secret, and a URL's password,
    masked: argparse repeats what it refuses (``unrecognized arguments: --api_key=KEY``, the
    config file's spelling as a flag), on stderr and in ``run``'s ``--summary``. Only on this
    unusual path."""
    from .._postgres import redact_url

    shown: dict[str, str] = {}
    secret_next = False
    for word in arguments:
        flag, eq, value = word.partition("=") if word.startswith("-") else ("", "", word)
        if secret_next and not word.startswith("--"):  # (a key may begin with '-')
            shown[word] = "***"
        elif eq and _secret_flag(flag):
            shown[value] = "***"
        elif "://" in value and ("***" in (masked := redact_url(value)) or "%2A%2A" in masked):
            shown[value] = masked
        secret_next = not eq and _secret_flag(word)
    for secret in sorted(shown, key=len, reverse=True):
        if secret:  # a whole word of the message (a short key never cuts another word)
            pattern = rf"(?<![^\s'\"=]){re.escape(secret)}(?![^\s'\"])"
            message = re.sub(pattern, shown[secret].replace("\\", "\\\\"), message)
    return message


class _CommandParser(_Parser):
    """A command's parser: ``-v`` is taken after the command too (``fashiontag run m.csv -v``,
    where a user types it); given there, its count is the one used."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.add_argument(
            "-v",
            "--verbose",
            action="count",
            default=argparse.SUPPRESS,
            help="more logging (-vv: debug)",
        )


def _add_tasks_actions(tasks: argparse.ArgumentParser) -> None:
    """``tasks``' actions (``list``, ``status``, ``results``) and their arguments."""
    tasks_sub = tasks.add_subparsers(dest="tasks_command", required=True, metavar="ACTION")
    t_list = tasks_sub.add_parser(
        "list", help="the bulk key's tasks, newest first (a table; --json for programs)"
    )
    t_list.add_argument("--json", action="store_true", help="JSON array of the tasks")
    t_list.add_argument(
        "--limit", type=_int_from(1), default=None, metavar="N", help="only the N newest tasks"
    )
    add_client_arguments(t_list)
    add_give_up_argument(t_list)
    t_status = tasks_sub.add_parser("status", help="one task's status")
    t_status.add_argument("task_id", type=_task_id)
    add_client_arguments(t_status)
    add_give_up_argument(t_status)
    t_results = tasks_sub.add_parser("results", help="one page of a done task's results")
    t_results.add_argument("task_id", type=_task_id)
    t_results.add_argument(
        "--offset", type=_int_from(0), default=0, help="first result (default 0)"
    )
    t_results.add_argument(
        "--size", type=_int_from(1, MAX_PAGE_SIZE), default=100, help="results, 1-100 (default 100)"
    )
    add_client_arguments(t_results)
    add_give_up_argument(t_results)
    tasks.set_defaults(handler=tasks_command, is_async=True)


def _build_parser(command: str | None) -> argparse.ArgumentParser:
    """The parser. Each half's arguments (and so its imports: the whole service package, the
    engine with SQLite) are registered only when its subcommand is the one invoked, which keeps
    every run's start-up to what it uses."""
    parser = _Parser(
        prog="fashiontag",
        description="Tag fashion catalogues through an image tagging service.",
        epilog=EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "-v", "--verbose", action="count", default=0, help="more logging (-vv: debug)"
    )
    sub = parser.add_subparsers(
        dest="command", required=True, metavar="COMMAND", parser_class=_CommandParser
    )

    serve = sub.add_parser(
        "serve",
        help="run the reference tagging service",
        epilog=SERVE_EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    if command == "serve":
        from ..service import cli as service_cli

        service_cli.add_serve_arguments(serve)
        serve.set_defaults(
            handler=service_cli.serve_command,
            is_async=False,
            takes_signals=True,
            take_signals=take,  # the service half knows nothing of the CLI: handed over
        )

    run = sub.add_parser(
        "run",
        help="tag every image of one or more manifests (bulk)",
        epilog=KEYS_HELP + "\n\n" + EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    if command == "run":
        from . import run as run_cli

        run_cli.add_run_arguments(run)
        run.set_defaults(handler=run_cli.run_command, is_async=False, takes_signals=True)

    tag = sub.add_parser(
        "tag",
        help="tag one image (single mode)",
        epilog=KEYS_HELP + "\n\n" + EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    if command == "tag":
        tag.add_argument("image", metavar="IMAGE_PATH_OR_URL")
        tag.add_argument("--detection", type=parse_detection, help="e.g. TOP,SHOES")
        add_client_arguments(tag)
        add_give_up_argument(tag)
        tag.set_defaults(handler=tag_command, is_async=True)

    tasks = sub.add_parser(
        "tasks",
        help="inspect bulk tasks",
        epilog=KEYS_HELP + "\n\n" + EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    if command == "tasks":
        _add_tasks_actions(tasks)

    reuse = sub.add_parser(
        "reuse",
        help="inspect or trim the result store of run --reuse",
        epilog=EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    if command == "reuse":
        from . import reuse as reuse_cli

        reuse_cli.add_reuse_arguments(reuse)
        reuse.set_defaults(handler=reuse_cli.reuse_command, is_async=False)

    daemon = sub.add_parser(
        "daemon",
        help="take every manifest dropped into a folder, for weeks (the ingestion daemon)",
        epilog=KEYS_HELP + "\n\n" + DAEMON_EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    if command == "daemon":
        from . import daemon as daemon_cli

        daemon_cli.add_daemon_arguments(daemon)
        daemon.set_defaults(handler=daemon_cli.daemon_command, is_async=False, takes_signals=True)

    demo = sub.add_parser(
        "demo",
        help="run the whole pipeline on a generated catalogue",
        epilog=DEMO_EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    if command == "demo":
        from . import demo as demo_cli

        demo_cli.add_demo_arguments(demo)
        demo.set_defaults(handler=demo_cli.demo_command, is_async=False)
    return parser


class _CurrentStderr(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes to whatever ``sys.stderr`` is at the time of each record (like logging's own
    last-resort handler), so that while the live progress line redirects stderr, a warning
    is printed above the line instead of through it."""

    @property
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, value: Any) -> None:
        pass


def configure_logging(verbosity: int) -> None:
    level = logging.WARNING if verbosity == 0 else logging.INFO if verbosity == 1 else logging.DEBUG
    logging.basicConfig(
        level=level,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        handlers=[_CurrentStderr()],
    )


def _nothing() -> None:
    pass


def _innermost(parser: argparse.ArgumentParser, args: argparse.Namespace) -> Any:
    """The parser of the command (and action: ``tasks list``) ``args`` were parsed for."""
    while subs := [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]:
        if (name := getattr(args, subs[0].dest, None)) not in subs[0].choices:
            break
        parser = subs[0].choices[name]
    return parser


def _unrecognized(parser: argparse.ArgumentParser, extras: Sequence[str]) -> str:
    """argparse's words for ``extras``, with the flag of ``parser`` a misspelt one meant."""
    message = f"unrecognized arguments: {' '.join(extras)}"
    flags = [f for f in parser._option_string_actions if f.startswith("--")]
    for word in extras:
        flag = word.partition("=")[0]
        if flag.startswith("--") and (close := difflib.get_close_matches(flag, flags, 1)):
            return f"{message} (did you mean {close[0]}? {parser.prog} --help lists them)"
    return message


def main(argv: Sequence[str] | None = None) -> int:
    """The ``fashiontag`` command line (:func:`fashiontag_pipeline.cli.main` is its entry point)."""
    guard_standard_streams()
    arguments = list(sys.argv[1:] if argv is None else argv)
    command = _command_of(arguments)
    parser = _build_parser(command)
    try:
        _Parser.arguments = arguments
        args, extras = parser.parse_known_args(arguments)
        if extras:  # (said by the command's own parser: its usage, the flag meant)
            _innermost(parser, args).error(_unrecognized(_innermost(parser, args), extras))
    except SystemExit as stop:
        if stop.code == EXIT_USAGE and command == "run" and _Parser.refusal is not None:
            # A crontab's typo: --summary still says the run failed, not last night's report.
            from .summary_file import summary_of_refused_flags

            summary_of_refused_flags(arguments, _Parser.refusal)
        raise
    configure_logging(args.verbose)
    if command in ("run", "daemon") and (gone := working_folder_gone()) is not None:
        print(f"fashiontag: {gone}", file=sys.stderr)  # (before a path is made absolute)
        if command == "run":
            from .summary_file import summary_of_refused_flags

            summary_of_refused_flags(arguments, gone)
        return EXIT_USAGE
    if command != "daemon":  # (the daemon logs them: its stderr is JSON lines)
        for warning in visible_passwords(args):
            print(f"fashiontag: warning: {warning}", file=sys.stderr)
    resume_collections()  # the command's imports are done: its work has the usual collector
    handler: Callable[[argparse.Namespace], Any] = args.handler
    restore_term: Callable[[], None] = _nothing
    try:
        if not getattr(args, "takes_signals", False):
            restore_term = interrupt_on_term()  # SIGTERM: as Ctrl-C, exit 130
            release()  # a Ctrl-C (or SIGTERM) while it started: KeyboardInterrupt here
        if args.is_async:
            return int(anyio.run(handler, args))
        return int(handler(args))
    except ConfigError as err:
        print(f"fashiontag: {one_line(str(err))}", file=sys.stderr)
        return EXIT_USAGE
    except FashiontagError as err:
        print(f"fashiontag: {one_line(str(err))}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        print("fashiontag: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    finally:
        # run or daemon ended before taking the signals over (a bad flag value): a stop
        # asked for meanwhile has its answer, the process ends now.
        release(taken=HELD)
        restore_term()
