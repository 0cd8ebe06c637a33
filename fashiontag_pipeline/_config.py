"""Configuration: small frozen value objects, one source of truth for every option and default.

TOML files decode into the same msgspec Structs the code uses (``configs/*.toml``)::

    [client]
    base_url = "http://127.0.0.1:8080"
    language = "en"
    [client.timeout]
    connect = 10.0
    [client.retry]
    max_attempts = 6

The environment overrides the file: ``FASHIONTAG_BASE_URL``, ``FASHIONTAG_API_KEY``,
``FASHIONTAG_BULK_API_KEY``; command-line flags override both. Other halves of the package
(engine, service) keep their own sections in the same file and load them with
:func:`load_section`, so one file configures a whole deployment.
"""

from __future__ import annotations

import hashlib
import hmac
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

import msgspec

from ._exceptions import ConfigError
from ._fieldtypes import check_field_types
from ._models import LANGUAGES
from ._tomlfile import read_toml
from ._urls import base_url_problem, clean_base_url, shown_url

__all__ = [
    "DEFAULT_BASE_URL",
    "ClientConfig",
    "Limits",
    "RetryPolicy",
    "Secret",
    "Timeout",
    "base_url_problem",
    "clean_base_url",
    "key_mac",
    "key_problem",
    "load_client_config",
    "load_section",
    "shown_url",
    "with_default_keys",
]

DEFAULT_BASE_URL = "http://127.0.0.1:8080"

#: Development keys: what ``fashiontag serve`` accepts and ``run``/``tag``/``tasks`` send when no
#: key is configured anywhere, so the embedded default works on one machine with no setup.
#: They are public by design; a real deployment configures its own keys.
DEV_API_KEY = "dev-api-key"
DEV_BULK_API_KEY = "dev-bulk-api-key"
ENV_BASE_URL = "FASHIONTAG_BASE_URL"
ENV_API_KEY = "FASHIONTAG_API_KEY"
ENV_BULK_API_KEY = "FASHIONTAG_BULK_API_KEY"
_KEY_VARS = (("api_key", ENV_API_KEY), ("bulk_api_key", ENV_BULK_API_KEY))

DEFAULT_CONNECT_TIMEOUT = 10.0
DEFAULT_READ_TIMEOUT = 60.0
DEFAULT_MAX_ATTEMPTS = 6
DEFAULT_BACKOFF_BASE = 0.2
DEFAULT_BACKOFF_MAX = 20.0
DEFAULT_MAX_RETRY_AFTER = 120.0
DEFAULT_MAX_CONNECTIONS = 64
DEFAULT_KEEPALIVE = 30.0
DEFAULT_MAX_ANSWER_BYTES = 16 << 20  # a page of 100 results of 160 KiB, a list of 50k tasks

_MASK = "********"
DEV_KEY_SOURCE = "the development default (no key configured)"


class Secret:
    """A string that never shows itself: repr, str and encoding all print a mask.

    Use :meth:`reveal` at the single place the value is needed (the request header).
    ``source`` says where the value came from (``--bulk-api-key``, ``FASHIONTAG_API_KEY``,
    a config file's field, the development default), so that an error about a refused key
    can tell the user what to fix without showing the key.
    """

    __slots__ = ("_value", "source")

    def __init__(self, value: str, *, source: str | None = None) -> None:
        if not isinstance(value, str):
            raise TypeError("Secret holds a string")
        self._value = value
        self.source = source

    def reveal(self) -> str:
        """The secret value. Call only where it must be sent."""
        return self._value

    def __repr__(self) -> str:
        return f"Secret('{_MASK}')"

    def __str__(self) -> str:
        return _MASK

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and other._value == self._value

    def __hash__(self) -> int:
        return hash(("Secret", self._value))

    def __bool__(self) -> bool:
        return bool(self._value)

    def __reduce__(self) -> Any:
        raise TypeError("a Secret is not picklable")


class Timeout(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Per-request timeouts in seconds (None = no limit).

    ``connect``: to open a connection. ``read``: with ``connect``, the deadline of the whole
    exchange when ``total`` is not set (one timer per request; not a per-read socket timeout).
    ``total``: the deadline of the whole exchange, connection included."""

    connect: float | None = DEFAULT_CONNECT_TIMEOUT
    read: float | None = DEFAULT_READ_TIMEOUT
    total: float | None = None

    def __post_init__(self) -> None:
        check_field_types(self, "timeout.")
        # aiohttp reads 0, < 0 or nan as "no limit" (a frozen service would hold a run for
        # ever), fails on inf mid-run (an OverflowError). TOML has no None: inf is no limit.
        for name in ("connect", "read", "total"):
            value = getattr(self, name)
            if value == math.inf:
                msgspec.structs.force_setattr(self, name, None)
            elif value is not None and not 0 < value < math.inf:
                raise ValueError(
                    f"timeout.{name} must be a number of seconds > 0 (inf: no limit), got {value}"
                )


class RetryPolicy(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Retries of reads and of writes known not to have been applied.

    Exponential backoff with full jitter: attempt ``n`` (from 1) sleeps a uniform random time in
    ``[0, min(backoff_max, backoff_base * 2**(n-1))]``, or the service's Retry-After when it
    sent one (capped at ``max_retry_after``).
    """

    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    backoff_base: float = DEFAULT_BACKOFF_BASE
    backoff_max: float = DEFAULT_BACKOFF_MAX
    max_retry_after: float = DEFAULT_MAX_RETRY_AFTER

    def __post_init__(self) -> None:
        check_field_types(self, "retry.")
        if self.max_attempts < 1:
            raise ValueError("retry.max_attempts must be at least 1")
        for name in ("backoff_base", "backoff_max", "max_retry_after"):
            value = getattr(self, name)
            if not 0 <= value < math.inf:  # nan, inf: a wait of nan, or for ever
                raise ValueError(f"retry.{name} must be finite seconds >= 0, got {value}")

    def backoff(self, attempt: int, rand: float) -> float:
        """Delay before retry number ``attempt`` (1-based), given ``rand`` uniform in [0, 1)."""
        ceiling: float = min(self.backoff_max, self.backoff_base * (2.0 ** (attempt - 1)))
        return ceiling * rand


class Limits(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Connection pool limits of the client, and the longest answer body it reads (decoded)."""

    max_connections: int = DEFAULT_MAX_CONNECTIONS
    keepalive_expiry: float = DEFAULT_KEEPALIVE
    max_answer_bytes: int = DEFAULT_MAX_ANSWER_BYTES

    def __post_init__(self) -> None:
        check_field_types(self, "limits.")
        if self.max_connections < 1 or self.max_answer_bytes < 1:
            raise ValueError("limits.max_connections and max_answer_bytes must be at least 1")
        if not 0 <= self.keepalive_expiry < math.inf:  # nan: idle connections kept for ever
            raise ValueError(
                "limits.keepalive_expiry must be a finite number of seconds >= 0, got"
                f" {self.keepalive_expiry}"
            )


class ClientConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Everything a :class:`~fashiontag_pipeline.TaggerClient` needs."""

    base_url: str = DEFAULT_BASE_URL
    api_key: Secret | None = None
    bulk_api_key: Secret | None = None
    language: str = "en"
    timeout: Timeout = Timeout()
    retry: RetryPolicy = RetryPolicy()
    limits: Limits = Limits()

    def __post_init__(self) -> None:
        # A key given as a str (``ClientConfig(api_key="...")``) is wrapped: masked, a Secret.
        for name in ("api_key", "bulk_api_key"):
            value = getattr(self, name)
            if isinstance(value, str):
                msgspec.structs.force_setattr(
                    self, name, Secret(value, source=f"ClientConfig({name}=...)")
                )
            elif value is not None and not isinstance(value, Secret):
                raise TypeError(f"{name} must be a str or a Secret")
            secret = getattr(self, name)
            problem = key_problem(secret) if secret is not None else None
            if problem is not None:
                raise ValueError(f"{name} {problem}")
        check_field_types(self, "")  # (keys given as str are Secrets by now)
        base_url = clean_base_url(self.base_url)
        if base_url != self.base_url:
            msgspec.structs.force_setattr(self, "base_url", base_url)
        problem = base_url_problem(base_url)
        if problem is not None:
            raise ValueError(f"base_url {problem}")
        if self.language not in LANGUAGES:
            raise ValueError(
                f"language must be one of {', '.join(LANGUAGES)}, got {self.language!r}"
            )

    def __repr__(self) -> str:
        # Keys print as their mask (Secret); a password in the base URL is masked too.
        fields = ", ".join(
            f"{name}={shown_url(self.base_url) if name == 'base_url' else getattr(self, name)!r}"
            for name in self.__struct_fields__
        )
        return f"ClientConfig({fields})"


def with_default_keys(config: ClientConfig) -> ClientConfig:
    """``config`` with keys when it has none at all: ``FASHIONTAG_API_KEY`` and
    ``FASHIONTAG_BULK_API_KEY`` when either is set (a program's ``ClientConfig`` sent the
    development keys past them), else the public development keys. The CLI, ``run_pipeline``
    and :class:`~fashiontag_pipeline.TaggerClient` all apply it, so the embedded reference
    service works with no setup (a real service answers 401, and the error says what to set).
    """
    if config.api_key is not None or config.bulk_api_key is not None:
        return config
    env = {k: Secret(os.environ[v], source=v) for k, v in _KEY_VARS if os.environ.get(v)}
    for key, secret in env.items():  # named by its variable, never shown
        if (problem := key_problem(secret)) is not None:
            raise ConfigError(f"the {key.replace('_', ' ')} from {secret.source} {problem}")
    if env:  # (an empty variable is none, as load_client_config reads it)
        return msgspec.structs.replace(config, **env)
    return msgspec.structs.replace(
        config,
        api_key=Secret(DEV_API_KEY, source=DEV_KEY_SOURCE),
        bulk_api_key=Secret(DEV_BULK_API_KEY, source=DEV_KEY_SOURCE),
    )


def key_mac(secret: Secret | None, salt: bytes) -> str:
    """16 hex digits of HMAC-SHA256 under ``salt`` of a key (of "" for none): one key told from
    another in a state, never the key nor a digest of it alone."""
    value = (secret.reveal() if secret is not None else "").encode("utf-8", "surrogatepass")
    return hmac.new(salt, value, hashlib.sha256).hexdigest()[:16]


def key_hint(secret: Secret | None, *, bulk: bool) -> str:
    """What to tell a user whose key was refused: where the key came from and what to set.

    Never the key itself."""
    flag, var = ("--bulk-api-key", ENV_BULK_API_KEY) if bulk else ("--api-key", ENV_API_KEY)
    kind = "bulk key" if bulk else "single-mode key"
    field = "bulk_api_key" if bulk else "api_key"
    fix = f"set {var}, {flag} or {field} in [client] to a {kind} the service accepts"
    if secret is None:
        return f"no {kind} was sent: {fix}"
    source = secret.source or "the caller"
    return f"the {kind} from {source} was refused{_key_oddity(secret.reveal())}: {fix}"


def _key_oddity(value: str) -> str:
    """What looks wrong in a refused key, never the key: the quotes a Docker ``--env-file``
    or a systemd ``EnvironmentFile`` keeps from ``KEY="..."``. (Spaces at its ends are not
    the key's: a header's value is read without them.)"""
    value = value.strip()
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
        return " (it starts and ends with a quote, which is sent as part of the key: remove them)"
    return ""


def _dec_hook(type_: type, obj: Any) -> Any:
    if type_ is Secret:
        if isinstance(obj, str):
            return Secret(obj)
        raise ValueError("expected a string")
    raise NotImplementedError(f"cannot decode {type_!r}")


def _enc_hook(obj: Any) -> Any:
    if isinstance(obj, Secret):
        return _MASK
    raise NotImplementedError(f"cannot encode {type(obj)!r}")


def to_builtins(value: Any) -> Any:
    """Plain data for a config value, secrets masked (for printing or summaries)."""
    return msgspec.to_builtins(value, enc_hook=_enc_hook)


T = TypeVar("T")
KEY_FIELDS = ("api_key", "bulk_api_key")


def convert(data: Mapping[str, Any], type_: type[T], *, where: str) -> T:
    """Convert plain data to a config struct; errors name the field (``$.client.retry...``)."""
    try:
        return msgspec.convert(data, type_, dec_hook=_dec_hook)
    except msgspec.ValidationError as exc:
        message = str(exc).replace("$", where, 1) if "$" in str(exc) else f"{exc} (in {where})"
        raise ConfigError(f"invalid configuration: {message}") from None


def load_section(path: str | Path | None, section: str, type_: type[T]) -> T:
    """Decode ``[section]`` of a TOML file (or defaults when there is no file) into ``type_``."""
    data: dict[str, Any] = {}
    if path is not None:
        raw = read_toml(path).get(section, {})
        if not isinstance(raw, dict):
            raise ConfigError(f"invalid configuration: [{section}] in {path} must be a table")
        data = raw
    return convert(data, type_, where=section)


def load_client_config(
    path: str | Path | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> ClientConfig:
    """Client config from a file's ``[client]`` table, then the environment, then ``overrides``.

    ``overrides`` holds flag values; ``None`` values are ignored so unset flags fall through
    (an empty one is not: ``--api-key "$UNSET"`` is refused, as an empty key is anywhere)."""
    env = os.environ if environ is None else environ
    data: dict[str, Any] = {}
    sources: dict[str, str] = {}
    if path is not None:
        raw = read_toml(path).get("client", {})
        if not isinstance(raw, dict):
            raise ConfigError(f"invalid configuration: [client] in {path} must be a table")
        data.update(raw)
        for key in KEY_FIELDS:
            sources[key] = f"{key} in [client] of {path}"
    if "base_url" in data:
        sources["base_url"] = f"base_url in [client] of {path}"
    for key, var in (("base_url", ENV_BASE_URL), *_KEY_VARS):
        if env.get(var):
            data[key] = env[var]
            sources[key] = var
    for key, value in (overrides or {}).items():
        if value is not None:
            data[key] = value
            sources[key] = "--" + key.replace("_", "-")
    url = data.get("base_url")
    if isinstance(url, str):  # named by where it came from, as keys are
        data["base_url"] = url = clean_base_url(url)
        if (problem := base_url_problem(url)) is not None:
            where = sources["base_url"]
            raise ConfigError(f"invalid configuration: base_url {problem} (from {where})")
    for key in KEY_FIELDS:  # named by where it came from (the key itself never shown)
        value = data.get(key)
        problem = key_problem(Secret(value)) if isinstance(value, str) else None
        if isinstance(value, str) and not value.strip():
            problem = "is empty (a variable not set where the value was written?)"
        if problem is not None:
            raise ConfigError(f"the {key.replace('_', ' ')} from {sources.get(key)} {problem}")
    config = convert(data, ClientConfig, where="client")
    for key in KEY_FIELDS:
        secret = getattr(config, key)
        if secret is not None:
            secret.source = sources.get(key)
    return config


def key_problem(secret: Secret) -> str | None:
    """Why a key cannot be sent in a header (a control character, such as the line end a key
    read from a file or a CRLF env file keeps; a character outside Latin-1), else None. The
    message never shows the key."""
    value = secret.reveal()
    for char in value:
        if ord(char) < 0x20 or ord(char) == 0x7F:
            return (
                f"holds a control character ({char!r}): a line end kept from a file or a CRLF"
                " env file? Remove it"
            )
        if ord(char) > 0xFF:
            return "holds a character an HTTP header cannot carry (outside Latin-1)"
    return None
