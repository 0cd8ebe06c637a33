"""``fashiontag tag`` (one image, single mode) and ``fashiontag tasks`` (inspect bulk tasks):
the commands that need only the client."""

from __future__ import annotations

import argparse
import base64
import math
import os
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

import msgspec

from .._callctx import GIVE_UP
from .._client import TaggerClient
from .._config import ClientConfig
from .._exceptions import ConfigError, DecodeError, RateLimitedError
from .._images import (
    DEFAULT_SINGLE_MAX_BYTES,
    ImageFileError,
    data_uri_image,
    manifest_kind,
    read_image_file,
    sniff_ext,
)
from .._models import Context, Image, ImageType, Task, says_success
from .._surrogates import mend
from .common import EXIT_ERROR, EXIT_OK, client_config_from_args, not_utf8, one_line
from .streams import write_stdout

__all__ = ["ONE_SHOT_GIVE_UP", "add_give_up_argument", "tag_command", "tasks_command"]

#: Seconds a one-shot command (``tag``, ``tasks``) keeps trying a failing service (429, 5xx,
#: unreachable) before it gives up, by default: a person or a script waits for its answer, so
#: it is not the run's 120 s, and never the client's 5 x 120 s of Retry-After.
ONE_SHOT_GIVE_UP = 30.0


def add_give_up_argument(parser: argparse.ArgumentParser) -> None:
    """``--give-up-after`` of a one-shot command."""
    parser.add_argument(
        "--give-up-after",
        type=_seconds,
        default=ONE_SHOT_GIVE_UP,
        metavar="S",
        help="seconds of failure (service rate limiting, refusing, unreachable) before the "
        f"command gives up, exit 1 (default {ONE_SHOT_GIVE_UP:g})",
    )


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be a number of seconds >= 0, got {text}")
    return value


@contextmanager
def _giving_up_after(seconds: float) -> Iterator[None]:
    """The client's give-up rule (:data:`~.._callctx.GIVE_UP`) for this command: no retry
    starts, and no Retry-After is waited, past ``seconds`` after a call began failing. A rate
    limit given up on says so first (the request's own words follow)."""
    budget: Callable[[float], float] | None = None
    if not math.isinf(seconds):

        def budget(since: float) -> float:
            return seconds - (time.monotonic() - since)

    token = GIVE_UP.set(budget)
    try:
        yield
    except RateLimitedError as err:
        raise RateLimitedError(
            f"the service rate limits this key; given up (--give-up-after {seconds:g}): {err}",
            retry_after=err.retry_after,
            **err.answer(),
        ) from None
    finally:
        GIVE_UP.reset(token)


def _within_give_up(config: ClientConfig, seconds: float) -> ClientConfig:
    """``config`` with a request deadline no longer than the command's give-up: a service
    that takes the connection and never answers held ``tag --give-up-after 3`` for the whole
    request deadline (70 s at the defaults), past what the command promises. ``0`` (no
    retry: give up at the first failure) keeps the request's own deadline, which is how a
    silent service's failure is told: cut to a millisecond, every answer timed out."""
    timeout = config.timeout
    whole = timeout.total
    if whole is None and timeout.connect is not None and timeout.read is not None:
        whole = timeout.connect + timeout.read
    if not seconds or math.isinf(seconds) or (whole is not None and whole <= seconds):
        return config
    return msgspec.structs.replace(config, timeout=msgspec.structs.replace(timeout, total=seconds))


def _image_from_argument(value: str) -> Image:
    """The image ``value`` names, read by ``run``'s rules (:mod:`..engine.rules`): an http(s)
    URL (its scheme in any case, sent lower-cased), a ``data:image/`` URI, or a local file (a
    path, or a ``file:///absolute/path`` URL) as base64, read as ``run`` reads one (a regular
    file of at most 20 MiB, its type from its magic bytes). A value ``run`` rejects (no host,
    a space, another scheme, a mistyped one) is refused with ``run``'s reason, nothing sent,
    unless it names a file that is there (``C:\\img\\a.png`` on Linux, ``IMG:001.png``): the
    argument is a path too (DESIGN 4.1: ``IMAGE_PATH_OR_URL``), which a manifest's cell is not."""
    from ..engine.rules import SINGLE_DATA, SINGLE_FILE, NotHttp, RowError, http_url, single_target

    try:
        try:
            url = http_url(value)
        except NotHttp:
            try:
                kind, content = single_target(value, True, "")  # (a path as given: no getcwd)
            except RowError:
                if not os.path.lexists(value):
                    raise
                kind, content = SINGLE_FILE, value
        else:
            if (problem := not_utf8(url)) is not None:  # (a path may hold such bytes)
                raise RowError(f"url: {problem}")
            return Image(type=ImageType.URL, content=url)
    except RowError as err:
        raise ConfigError(f"cannot read image: {err}") from None
    if kind == SINGLE_DATA:
        if (problem := not_utf8(content)) is not None:
            raise ConfigError(f"cannot read image: data: URI: {problem}")
        try:
            return Image(
                type=ImageType.BASE64, content=data_uri_image(content, DEFAULT_SINGLE_MAX_BYTES)
            )
        except ImageFileError as err:
            raise ConfigError(f"cannot read image: {err}") from None
    try:
        data = read_image_file(content, DEFAULT_SINGLE_MAX_BYTES)
    except ImageFileError as err:
        raise ConfigError(f"cannot read image: {err}") from None
    if (listing := manifest_kind(data)) is not None:
        raise ConfigError(
            f"cannot read image: {content} is {listing}, not an image: to tag every image it"
            f" lists, give it to fashiontag run {content}"
        )
    encoded = base64.b64encode(data).decode("ascii")
    return Image(
        type=ImageType.BASE64, content=f"data:image/{sniff_ext(data, content)};base64,{encoded}"
    )


class _Answer(msgspec.Struct, gc=False):
    """What ``tag`` reads of an answer it prints as the service sent it: any tagging result
    (:meth:`~.._client.TaggerClient.tag_raw`), a shape the typed model does not take too."""

    status: str = ""
    error: Any = None


async def tag_command(args: argparse.Namespace) -> int:
    config = _within_give_up(client_config_from_args(args), args.give_up_after)
    image = _image_from_argument(args.image)
    context = Context(detection=args.detection) if args.detection else None
    with _giving_up_after(args.give_up_after):
        async with TaggerClient(config=config) as client:
            answer = await client.tag_raw(image, context, language=args.language)
    response = msgspec.json.decode(answer, type=_Answer)
    if says_success(response.status):
        write_stdout(msgspec.json.format(answer, indent=2) + b"\n")
        return EXIT_OK
    # A failure's words may quote the key sent: masked, in the answer and the reason.
    answer = client.masked(answer.decode("utf-8", "surrogateescape")).encode(
        "utf-8", "surrogateescape"
    )
    write_stdout(msgspec.json.format(answer, indent=2) + b"\n")
    response = msgspec.json.decode(answer, type=_Answer)
    error = response.error
    if isinstance(error, dict) and ("code" in error or "message" in error):
        message = one_line(str(error.get("message") or ""))
        reason = f"code {error.get('code')}: {message}" if message else f"code {error.get('code')}"
    elif error is not None:
        reason = one_line(str(error))
    else:
        reason = f"status {response.status!r}, no error given"
    print(f"fashiontag: the service could not tag the image ({reason})", file=sys.stderr)
    return EXIT_ERROR


class _Page(msgspec.Struct, gc=False):
    """What ``tasks results`` reads of a results page, whose ``data`` it prints as the
    service sent it (a tagging result the typed model does not take too: it was exit 1, "not
    a results page", as ``tag`` was). Spec 4.6 shows no ``status``: it may be absent."""

    status: Any = None
    data: msgspec.Raw = msgspec.Raw(b"")  # (empty: none given)
    error: Any = None


def _page_data(body: bytes, task_id: str, masked: Callable[[str], str]) -> msgspec.Raw:
    # An id cut across an emoji by a UTF-16 service (``"\\ud83d"``): read as run's pages read
    # it, the half as U+FFFD (printing the page as sent failed: the JSON is malformed).
    body = mend(body) or body
    try:
        page = msgspec.json.decode(body, type=_Page)
    except (msgspec.DecodeError, RecursionError, UnicodeDecodeError) as err:
        raise DecodeError(f"task {task_id}: the answer is not a results page: {err}") from None
    failed = isinstance(page.status, str) and not says_success(page.status)
    if failed or bytes(page.data) in (b"", b"null"):
        reason = masked(" ".join(str(page.error or "no reason given").split()))  # (the key?)
        raise DecodeError(f"task {task_id}: the answer holds no results page ({reason})")
    return page.data


def _newest_first(tasks: Sequence[Task]) -> list[Task]:
    """Tasks by creation time, newest first (a time given in no form read: last)."""
    oldest = datetime.min.replace(tzinfo=UTC)
    return sorted(tasks, key=lambda t: t.created_at or oldest, reverse=True)


def _created(task: Task) -> str:
    """A task's creation time for a person: as the service wrote it (to the second), or,
    written as an epoch number, in UTC."""
    given = task.create_date
    if not given:
        return ""
    if isinstance(given, str):
        return given[:19].replace("T", " ")
    moment = task.created_at
    return moment.strftime("%Y-%m-%d %H:%M:%S") if moment else str(given)


def _task_table(tasks: Sequence[Task], limit: int | None) -> str:
    """``tasks list`` for a person: newest first, one line per task."""
    ordered = _newest_first(tasks)
    shown = ordered if limit is None else ordered[:limit]
    rows = [("TASK", "STATUS", "TOTAL", "DONE", "FAILED", "CREATED", "DESCRIPTION")]
    for t in shown:
        status = str(t.task_status).removeprefix("TASK_")
        description = one_line(t.description or "")
        if len(description) > 40:
            description = description[:39] + "~"
        rows.append(
            (
                one_line(t.task_id),
                one_line(status),
                f"{t.count.total:,}",
                f"{t.count.done:,}",
                f"{t.count.failure:,}",
                _created(t),
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


async def tasks_command(args: argparse.Namespace) -> int:
    config = _within_give_up(client_config_from_args(args), args.give_up_after)
    with _giving_up_after(args.give_up_after):
        async with TaggerClient(config=config) as client:
            result: Any
            if args.tasks_command == "list":
                tasks = await client.all_tasks()
                if not args.json:
                    write_stdout(_task_table(tasks, args.limit))
                    return EXIT_OK
                tasks = _newest_first(tasks)
                result = tasks if args.limit is None else tasks[: args.limit]
            elif args.tasks_command == "status":
                result = await client.task_status(args.task_id)
            else:
                body = await client.task_results_raw(
                    args.task_id, offset=args.offset, size=args.size, language=args.language
                )
                result = _page_data(body, args.task_id, client.masked)
    write_stdout(msgspec.json.format(msgspec.json.encode(result), indent=2) + b"\n")
    return EXIT_OK
