"""The ``fashiontag`` command line (DESIGN section 4.1).

Subcommands are thin: ``serve`` lives in :mod:`fashiontag_pipeline.service.cli`, ``run`` and
``demo`` in :mod:`fashiontag_pipeline.engine.cli`; each of those modules offers
``add_*_arguments(parser)`` and a ``*_command(args) -> int``. ``tag`` and ``tasks`` only need the
client and live here.

Exit codes: 0 success, 1 a run that ended with an error, 2 bad usage or configuration (or a
state file of an unfinished run of other manifests), 3 a run that ended with rows still lacking
an outcome, 130 interrupted.
"""

from __future__ import annotations

import argparse
import base64
import logging
import mimetypes
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import anyio
import msgspec

from ._client import TaggerClient
from ._config import (
    DEFAULT_BASE_URL,
    ENV_API_KEY,
    ENV_BULK_API_KEY,
    ClientConfig,
    load_client_config,
    with_default_keys,
)
from ._exceptions import ConfigError, FashiontagError
from ._models import LANGUAGES, Context, Detection, Image, ImageType, Task

__all__ = ["main"]

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130

EXIT_CODES = """exit codes:
  0    success (run: every row has an outcome, in the results file or in rejects)
  1    a run or request that ended with an error (refused key, service unreachable past
       --give-up-after, unreadable manifest, HTTP error); one line on stderr, state saved
  2    bad usage or configuration (unknown flag, bad flag or config value), or a state
       file that holds an unfinished run of other manifests (nothing touched: finish it, or
       --restart)
  3    run: the run ended but the state shows rows without an outcome; run it again
  130  interrupted (Ctrl-C, SIGTERM); run again with the same --state to resume
"""

KEYS_HELP = """keys and URL: flags, then FASHIONTAG_BASE_URL / FASHIONTAG_API_KEY /
FASHIONTAG_BULK_API_KEY, then the [client] table of --config. With no key anywhere, the
public development keys of `fashiontag serve` are sent."""

_FLAG_WARNING = (
    "fashiontag: warning: {flag} is visible to other users of this machine (ps, /proc); "
    "prefer {var} or a --config file only you can read"
)


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
    parser.add_argument("--config", type=Path, help="TOML config file (see configs/)")
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


def client_config_from_args(args: argparse.Namespace) -> ClientConfig:
    """The client config from --config, the environment, then flags.

    With no key configured anywhere, the public development keys are sent, so every command
    works against the embedded reference service with no setup (a real service answers 401).
    """
    api_key = getattr(args, "api_key", None)
    bulk_api_key = getattr(args, "bulk_api_key", None)
    for flag, var, value in (
        ("--api-key", ENV_API_KEY, api_key),
        ("--bulk-api-key", ENV_BULK_API_KEY, bulk_api_key),
    ):
        if value is not None:
            print(_FLAG_WARNING.format(flag=flag, var=var), file=sys.stderr)
    config = load_client_config(
        getattr(args, "config", None),
        overrides={
            "base_url": args.base_url,
            "language": args.language,
            "api_key": api_key,
            "bulk_api_key": bulk_api_key,
        },
    )
    return with_default_keys(config)


def _image_from_argument(value: str) -> Image:
    if value.startswith(("http://", "https://")):
        return Image(type=ImageType.URL, content=value)
    if value.startswith("data:image/"):
        return Image(type=ImageType.BASE64, content=value)
    path = Path(value)
    try:
        data = path.read_bytes()
    except OSError as err:
        raise ConfigError(f"cannot read image {value!r}: {err.strerror}") from None
    mime = mimetypes.guess_type(path.name)[0] or "image/jpeg"
    ext = mime.split("/", 1)[1] if mime.startswith("image/") else "jpeg"
    encoded = base64.b64encode(data).decode("ascii")
    return Image(type=ImageType.BASE64, content=f"data:image/{ext};base64,{encoded}")


async def _tag_command(args: argparse.Namespace) -> int:
    config = client_config_from_args(args)
    image = _image_from_argument(args.image)
    context = Context(detection=args.detection) if args.detection else None
    async with TaggerClient(config=config) as client:
        response = await client.tag(image, context, language=args.language)
    sys.stdout.buffer.write(msgspec.json.format(msgspec.json.encode(response), indent=2) + b"\n")
    return EXIT_OK if response.ok else EXIT_ERROR


def _task_table(tasks: Sequence[Task], limit: int | None) -> str:
    """``tasks list`` for a person: newest first, one line per task."""
    ordered = sorted(tasks, key=lambda t: t.create_date or "", reverse=True)
    shown = ordered if limit is None else ordered[:limit]
    rows = [("TASK", "STATUS", "TOTAL", "DONE", "FAILED", "CREATED", "DESCRIPTION")]
    for t in shown:
        status = str(t.task_status.value).removeprefix("TASK_")
        description = " ".join((t.description or "").split())
        if len(description) > 40:
            description = description[:39] + "~"
        rows.append(
            (
                t.task_id,
                status,
                f"{t.count.total:,}",
                f"{t.count.done:,}",
                f"{t.count.failure:,}",
                (t.create_date or "")[:19].replace("T", " "),
                description,
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    lines = [
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=False))
        + "  "
        + row[-1]
        for row in rows
    ]
    if len(shown) < len(ordered):
        lines.append(f"({len(ordered) - len(shown)} older tasks not shown; --limit N)")
    return "\n".join(line.rstrip() for line in lines) + "\n"


async def _tasks_command(args: argparse.Namespace) -> int:
    config = client_config_from_args(args)
    async with TaggerClient(config=config) as client:
        result: Any
        if args.tasks_command == "list":
            tasks = await client.list_tasks()
            if not args.json:
                sys.stdout.write(_task_table(tasks, args.limit))
                return EXIT_OK
            tasks = sorted(tasks, key=lambda t: t.create_date or "", reverse=True)
            result = tasks if args.limit is None else tasks[: args.limit]
        elif args.tasks_command == "status":
            result = await client.task_status(args.task_id)
        else:
            result = await client.task_results(
                args.task_id, offset=args.offset, size=args.size, language=args.language
            )
    sys.stdout.buffer.write(msgspec.json.format(msgspec.json.encode(result), indent=2) + b"\n")
    return EXIT_OK


def _command_of(argv: Sequence[str]) -> str | None:
    """The subcommand named on the command line (top-level options take no values)."""
    return next((arg for arg in argv if not arg.startswith("-")), None)


def _build_parser(command: str | None) -> argparse.ArgumentParser:
    """The parser. Each half's arguments (and so its imports: the whole service package, the
    engine with SQLite) are registered only when its subcommand is the one invoked, which keeps
    every run's start-up to what it uses."""
    parser = argparse.ArgumentParser(
        prog="fashiontag",
        description="Tag fashion catalogues through an image tagging service.",
        epilog=EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "-v", "--verbose", action="count", default=0, help="more logging (-vv: debug)"
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    serve = sub.add_parser("serve", help="run the reference tagging service")
    if command == "serve":
        from .service import cli as service_cli

        service_cli.add_serve_arguments(serve)
        serve.set_defaults(handler=service_cli.serve_command, is_async=False)

    run = sub.add_parser(
        "run",
        help="tag every image of one or more manifests (bulk)",
        epilog=KEYS_HELP + "\n\n" + EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    if command == "run":
        from .engine import cli as engine_cli

        engine_cli.add_run_arguments(run)
        run.set_defaults(handler=engine_cli.run_command, is_async=False)

    tag = sub.add_parser(
        "tag",
        help="tag one image (single mode)",
        epilog=KEYS_HELP + "\n\n" + EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    tag.add_argument("image", metavar="IMAGE_PATH_OR_URL")
    tag.add_argument("--detection", type=parse_detection, help="e.g. TOP,SHOES")
    add_client_arguments(tag)
    tag.set_defaults(handler=_tag_command, is_async=True)

    tasks = sub.add_parser(
        "tasks",
        help="inspect bulk tasks",
        epilog=KEYS_HELP + "\n\n" + EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    tasks_sub = tasks.add_subparsers(dest="tasks_command", required=True, metavar="ACTION")
    t_list = tasks_sub.add_parser(
        "list", help="the bulk key's tasks, newest first (a table; --json for programs)"
    )
    t_list.add_argument("--json", action="store_true", help="JSON array of the tasks")
    t_list.add_argument(
        "--limit", type=int, default=None, metavar="N", help="only the N newest tasks"
    )
    add_client_arguments(t_list)
    t_status = tasks_sub.add_parser("status", help="one task's status")
    t_status.add_argument("task_id")
    add_client_arguments(t_status)
    t_results = tasks_sub.add_parser("results", help="one page of a done task's results")
    t_results.add_argument("task_id")
    t_results.add_argument("--offset", type=int, default=0, help="first result (default 0)")
    t_results.add_argument("--size", type=int, default=100, help="results, 1-100 (default 100)")
    add_client_arguments(t_results)
    tasks.set_defaults(handler=_tasks_command, is_async=True)

    demo = sub.add_parser("demo", help="run the whole pipeline on a generated catalogue")
    if command == "demo":
        from .engine import cli as engine_cli

        engine_cli.add_demo_arguments(demo)
        demo.set_defaults(handler=engine_cli.demo_command, is_async=False)
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


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``fashiontag`` console script."""
    arguments = list(sys.argv[1:] if argv is None else argv)
    parser = _build_parser(_command_of(arguments))
    args = parser.parse_args(arguments)
    configure_logging(args.verbose)
    handler: Callable[[argparse.Namespace], Any] = args.handler
    try:
        if args.is_async:
            return int(anyio.run(handler, args))
        return int(handler(args))
    except ConfigError as err:
        print(f"fashiontag: {err}", file=sys.stderr)
        return EXIT_USAGE
    except FashiontagError as err:
        print(f"fashiontag: {err}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        print("fashiontag: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
