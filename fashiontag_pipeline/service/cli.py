"""``fashiontag serve``: run the reference service until SIGTERM/SIGINT (DESIGN section 4.1).

Settings come from, lowest to highest priority: defaults, the config file's ``[service]``
table, the environment (``FASHIONTAG_API_KEY`` / ``FASHIONTAG_BULK_API_KEY`` add accepted
keys), then flags. Fetching is off unless ``--fetch`` (or ``fetch = true``) is given: by
default images are tagged from their URL text, which needs no network.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path

import anyio
import msgspec

from .._config import ENV_API_KEY, ENV_BULK_API_KEY, Secret, key_problem, load_section
from .._exceptions import ConfigError
from .app import running_service as _running_service
from .config import (
    DEFAULT_BODY_TIMEOUT,
    DEFAULT_DECODE_WORKERS,
    DEFAULT_FETCH_PER_HOST,
    DEFAULT_HEADER_TIMEOUT,
    DEFAULT_KEEPALIVE_TIMEOUT,
    DEFAULT_MAX_BODY_BYTES,
    DEFAULT_MAX_CONNECTIONS,
    DEFAULT_MAX_LIVE_TASKS,
    DEFAULT_RESULT_TTL,
    DEFAULT_TASK_TTL,
    ServiceConfig,
)
from .faults import FaultSpec
from .journal import StateFileError

__all__ = ["ServiceConfigFile", "add_serve_arguments", "main", "serve_command"]

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8080


class ServiceConfigFile(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The ``[service]`` table of a config file."""

    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    api_keys: list[str] = []
    bulk_api_keys: list[str] = []
    task_ttl: float = DEFAULT_TASK_TTL
    result_ttl: float = DEFAULT_RESULT_TTL
    rate: float = 0.0
    fetch: bool = False
    faults: str | None = None
    state: str | None = None
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    max_connections: int = DEFAULT_MAX_CONNECTIONS
    keepalive_timeout: float = DEFAULT_KEEPALIVE_TIMEOUT
    header_timeout: float = DEFAULT_HEADER_TIMEOUT
    body_timeout: float = DEFAULT_BODY_TIMEOUT
    max_live_tasks: int = DEFAULT_MAX_LIVE_TASKS
    decode_workers: int = DEFAULT_DECODE_WORKERS
    fetch_per_host: int = DEFAULT_FETCH_PER_HOST
    fetch_allow_private: bool = False

    def __repr__(self) -> str:
        # Keys never reach a repr (a traceback, a debug print): masked, their number kept.
        fields = []
        for name in self.__struct_fields__:
            value = getattr(self, name)
            if name in ("api_keys", "bulk_api_keys"):
                value = ["***"] * len(value)
            fields.append(f"{name}={value!r}")
        return f"ServiceConfigFile({', '.join(fields)})"


def add_serve_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of ``fashiontag serve``."""
    parser.add_argument("--host", help=f"address to listen on (default {DEFAULT_HOST})")
    parser.add_argument(
        "--port", type=int, help=f"port, 0 = any free port (default {DEFAULT_PORT})"
    )
    parser.add_argument(
        "--api-key",
        action="append",
        default=[],
        metavar="K",
        help="accepted single-mode key (repeatable; env FASHIONTAG_API_KEY)",
    )
    parser.add_argument(
        "--bulk-api-key",
        action="append",
        default=[],
        metavar="K",
        help="accepted bulk key (repeatable; env FASHIONTAG_BULK_API_KEY)",
    )
    parser.add_argument("--task-ttl", type=float, metavar="SECONDS", help="task expiry (600)")
    parser.add_argument(
        "--result-ttl", type=float, metavar="SECONDS", help="result expiry after done (7 days)"
    )
    parser.add_argument(
        "--rate",
        type=float,
        metavar="IMAGES_PER_S",
        help="tagging throughput cap, 0 = none (default 0)",
    )
    parser.add_argument(
        "--fetch",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="download and decode images (default: --no-fetch, tag from the URL text)",
    )
    parser.add_argument(
        "--fetch-allow-private",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="let --fetch download from loopback/private addresses (default: refused; for tests)",
    )
    parser.add_argument(
        "--fetch-per-host",
        type=int,
        metavar="N",
        help=f"connections to one image host at once (default {DEFAULT_FETCH_PER_HOST})",
    )
    parser.add_argument(
        "--max-connections",
        type=int,
        metavar="N",
        help=f"open connections; past it the oldest idle one is closed ({DEFAULT_MAX_CONNECTIONS})",
    )
    parser.add_argument(
        "--keepalive-timeout",
        type=float,
        metavar="SECONDS",
        help=f"idle keep-alive connections are closed after this ({DEFAULT_KEEPALIVE_TIMEOUT:g})",
    )
    parser.add_argument(
        "--header-timeout",
        type=float,
        metavar="SECONDS",
        help=f"request headers must arrive within this ({DEFAULT_HEADER_TIMEOUT:g})",
    )
    parser.add_argument(
        "--body-timeout",
        type=float,
        metavar="SECONDS",
        help=f"a request body must arrive within this, else 408 ({DEFAULT_BODY_TIMEOUT:g})",
    )
    parser.add_argument(
        "--max-body-bytes",
        type=int,
        metavar="BYTES",
        help=f"larger request bodies get 413 ({DEFAULT_MAX_BODY_BYTES})",
    )
    parser.add_argument(
        "--max-live-tasks",
        type=int,
        metavar="N",
        help=f"live tasks per key; the next create gets 429 ({DEFAULT_MAX_LIVE_TASKS})",
    )
    parser.add_argument(
        "--decode-workers",
        type=int,
        metavar="N",
        help=f"threads decoding images (default {DEFAULT_DECODE_WORKERS})",
    )
    parser.add_argument("--faults", metavar="SPEC", help="e.g. 500=0.05,429=0.02,drop=0.01")
    parser.add_argument("--config", type=Path, metavar="FILE", help="TOML file with [service]")
    parser.add_argument("--state", type=Path, metavar="FILE", help="SQLite file to keep tasks in")


def build_config(
    args: argparse.Namespace, environ: dict[str, str] | None = None
) -> tuple[ServiceConfig, str, int]:
    """(config, host, port) from the file, the environment and the flags."""
    env = dict(os.environ) if environ is None else environ
    path = getattr(args, "config", None)
    file = load_section(path, "service", ServiceConfigFile)
    api_keys = _keys(file.api_keys, f"api_keys in [service] of {path}", env, ENV_API_KEY)
    api_keys += _keys(args.api_key, "--api-key")
    bulk_keys = _keys(
        file.bulk_api_keys, f"bulk_api_keys in [service] of {path}", env, ENV_BULK_API_KEY
    )
    bulk_keys += _keys(args.bulk_api_key, "--bulk-api-key")
    for flag, var, given in (
        ("--api-key", ENV_API_KEY, args.api_key),
        ("--bulk-api-key", ENV_BULK_API_KEY, args.bulk_api_key),
    ):
        if given:
            print(
                f"fashiontag serve: warning: {flag} is visible to other users of this machine"
                f" (ps, /proc); prefer {var} or a --config file only you can read",
                file=sys.stderr,
            )
    faults_text = args.faults if args.faults is not None else file.faults
    try:
        faults = FaultSpec.parse(faults_text) if faults_text else None
    except ValueError as err:
        raise ConfigError(f"invalid --faults: {err}") from None
    file_state = Path(file.state).expanduser() if file.state else None  # (TOML expands no ~)
    state = args.state if args.state is not None else file_state

    def pick(flag: float | None, value: float) -> float:
        return value if flag is None else flag

    def pick_int(flag: int | None, value: int) -> int:
        return value if flag is None else flag

    try:
        config = ServiceConfig(
            api_keys=tuple(dict.fromkeys(api_keys)),
            bulk_api_keys=tuple(dict.fromkeys(bulk_keys)),
            task_ttl=pick(args.task_ttl, file.task_ttl),
            result_ttl=pick(args.result_ttl, file.result_ttl),
            rate=pick(args.rate, file.rate),
            fetch=file.fetch if args.fetch is None else args.fetch,
            faults=faults,
            state_path=state,
            max_body_bytes=pick_int(args.max_body_bytes, file.max_body_bytes),
            max_connections=pick_int(args.max_connections, file.max_connections),
            keepalive_timeout=pick(args.keepalive_timeout, file.keepalive_timeout),
            header_timeout=pick(args.header_timeout, file.header_timeout),
            body_timeout=pick(args.body_timeout, file.body_timeout),
            max_live_tasks=pick_int(args.max_live_tasks, file.max_live_tasks),
            decode_workers=pick_int(args.decode_workers, file.decode_workers),
            fetch_per_host=pick_int(args.fetch_per_host, file.fetch_per_host),
            fetch_allow_private=(
                file.fetch_allow_private
                if args.fetch_allow_private is None
                else args.fetch_allow_private
            ),
        )
    except ValueError as err:
        raise ConfigError(f"invalid service configuration: {err}") from None
    host = args.host or file.host
    port = file.port if args.port is None else args.port
    if not 0 <= port <= 65535:  # (the socket layer takes a larger one modulo 65536)
        where = "--port" if args.port is not None else "port in [service]"
        raise ConfigError(f"invalid service configuration: {where} must be 0 to 65535, got {port}")
    return config, host, port


def _keys(
    given: list[str], where: str, env: dict[str, str] | None = None, var: str = ""
) -> list[str]:
    """The accepted keys from ``given`` (and the variable ``var`` of ``env`` when set), without
    the spaces at their ends (a header's value is read without them). A key no ``x-api-key``
    header can carry (empty, a control character such as the ``\\r`` a CRLF env file keeps)
    would refuse every request: a :class:`ConfigError` naming where it came from, never the
    key."""
    pairs = [(key, where) for key in given]
    if env is not None and env.get(var):
        pairs.append((env[var], var))
    keys = []
    for value, source in pairs:
        key = value.strip(" ")
        problem = "is empty" if not key else None
        if any(ord(char) < 0x20 or ord(char) == 0x7F for char in key):
            problem = key_problem(Secret(key))  # (a UTF-8 key, which curl sends, is kept)
        if problem is not None:
            raise ConfigError(
                f"invalid service configuration: the key from {source} {problem} (no request"
                " could carry it)"
            )
        keys.append(key)
    return keys


async def _serve(
    config: ServiceConfig,
    host: str,
    port: int,
    take: Callable[..., list[int]] | None = None,
) -> None:
    with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        # ``take``: the stops that came while the command started (``fashiontag``'s entry
        # point holds them until now); one did: stopped before serving (exit 0).
        if take is not None and take(signal.SIGTERM, signal.SIGINT):
            return
        async with _running_service(config, host, port) as service:
            print(f"listening on {service.url}", flush=True)
            async for _ in signals:
                break


def serve_command(args: argparse.Namespace) -> int:
    """Run the service until SIGTERM/SIGINT; returns the exit code."""
    config, host, port = build_config(args)
    if config.uses_dev_keys:
        print(
            "fashiontag serve: warning: no API keys configured; accepting the public development "
            "keys (set --api-key/--bulk-api-key or FASHIONTAG_API_KEY/FASHIONTAG_BULK_API_KEY)",
            file=sys.stderr,
        )
    elif not config.bulk_api_keys:  # (single-mode keys only: bulk paths take none of them)
        print(
            "fashiontag serve: warning: no bulk key configured; the bulk paths refuse every key"
            " (set --bulk-api-key or FASHIONTAG_BULK_API_KEY)",
            file=sys.stderr,
        )
    backend_options: dict[str, object] = {}
    try:
        import uvloop  # noqa: F401

        backend_options["use_uvloop"] = True
    except ImportError:
        pass
    try:
        take = getattr(args, "take_signals", None)
        anyio.run(_serve, config, host, port, take, backend_options=backend_options)
    except StateFileError as err:
        raise ConfigError(f"--state {config.state_path}: {err}") from None
    except OSError as err:
        raise ConfigError(f"cannot listen on {host}:{port}: {err.strerror or err}") from None
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m fashiontag_pipeline.service [serve flags]``."""
    import logging

    parser = argparse.ArgumentParser(prog="fashiontag serve", description=__doc__)
    parser.add_argument("-v", "--verbose", action="count", default=0)
    add_serve_arguments(parser)
    args = parser.parse_args(argv)
    level = [logging.WARNING, logging.INFO, logging.DEBUG][min(args.verbose, 2)]
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        return serve_command(args)
    except ConfigError as err:
        print(f"fashiontag serve: {err}", file=sys.stderr)
        return 2
