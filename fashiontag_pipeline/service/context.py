"""What the handlers share (:class:`ServiceState`, reached through :data:`STATE`), and the
key ring."""

from __future__ import annotations

import hashlib
import hmac
import time
from collections.abc import Callable

import msgspec
from aiohttp import web

from .._config import DEV_API_KEY, DEV_BULK_API_KEY
from .analyzer import Analysis, Analyzer, ReferenceAnalyzer
from .config import ServiceConfig
from .connections import ConnectionGuard
from .decoding import DecodePool
from .errors import CODE_AUTH_FAILED, CODE_KEY_REQUIRED, Reject
from .faults import FaultDice
from .fetching import ImageFetcher
from .store import TaskStore
from .worker import TaggingWorker

__all__ = ["STATE", "KeyRing", "ServiceState"]

_encoder = msgspec.json.Encoder()


def _fingerprint(key: bytes) -> bytes:
    return hashlib.sha256(b"fashiontag-owner:" + key).digest()[:16]


class KeyRing:
    """Accepted keys. Comparison is constant-time and visits every key."""

    def __init__(self, single: tuple[str, ...], bulk: tuple[str, ...]) -> None:
        if not single and not bulk:
            single, bulk = (DEV_API_KEY,), (DEV_BULK_API_KEY,)
        self._keys = [(k.encode(), False) for k in single] + [(k.encode(), True) for k in bulk]

    def identify(self, request: web.Request, *, bulk: bool) -> bytes:
        """The owner fingerprint of the request's key; :class:`Reject` 401/403 otherwise."""
        given = request.headers.get("x-api-key")
        if not given:
            raise Reject(401, CODE_KEY_REQUIRED, "API key required (header x-api-key)")
        raw = given.encode("utf-8", "surrogateescape")
        matched = False
        is_bulk = False
        for key, key_is_bulk in self._keys:
            if hmac.compare_digest(raw, key):
                matched = True
                is_bulk = is_bulk or key_is_bulk
        if not matched:
            raise Reject(401, CODE_AUTH_FAILED, "authentication failed")
        if bulk and not is_bulk:
            raise Reject(403, CODE_AUTH_FAILED, "this API key is not a bulk key")
        return _fingerprint(raw)


class ServiceState:
    """What the handlers share: config, keys, store, decode pool, analyzer, worker, fault dice."""

    def __init__(self, config: ServiceConfig) -> None:
        self.config = config
        #: Why the service can no longer tag (its worker stopped on an error); every request
        #: is then answered 503 instead of accepting images nobody would tag.
        self.broken: str | None = None
        self.clock: Callable[[], float] = config.clock or time.time
        self.keys = KeyRing(config.api_keys, config.bulk_api_keys)
        self.store = TaskStore(
            clock=self.clock,
            task_ttl=config.task_ttl,
            result_ttl=config.result_ttl,
            state_path=config.state_path,
        )
        self.decode = DecodePool(config.decode_workers)
        #: Request body bytes read and not yet decoded, over every request (bounded by
        #: ``config.bodies_budget``: see :func:`.parsing.read_json`).
        self.body_bytes = 0
        self.connections = ConnectionGuard(
            max_connections=config.max_connections, header_timeout=config.header_timeout
        )
        self.analyzer: Analyzer = config.analyzer or ReferenceAnalyzer(
            fetcher=ImageFetcher(
                per_host=config.fetch_per_host, allow_private=config.fetch_allow_private
            ),
            decode=self.decode,
        )
        self.worker = TaggingWorker(
            self.store,
            self.analyzer,
            rate=config.rate,
            fetch_concurrency=config.fetch_concurrency,
        )
        self.dice: FaultDice | None = (
            config.faults.dice() if config.faults is not None and config.faults.active else None
        )
        self.inline = config.rate <= 0 and not config.fetch
        self.render_json = json_renderer(self.analyzer)


def json_renderer(analyzer: Analyzer) -> Callable[[Analysis, int, int], bytes]:
    """The analyzer's ``render_json`` when it has one, else its ``render`` encoded."""
    fast: Callable[[Analysis, int, int], bytes] | None = getattr(analyzer, "render_json", None)
    if fast is not None:
        return fast
    render = analyzer.render

    def encoded(analysis: Analysis, detection: int, lang: int) -> bytes:
        return _encoder.encode(render(analysis, detection, lang))

    return encoded


STATE: web.AppKey[ServiceState] = web.AppKey("fashiontag_state", ServiceState)
