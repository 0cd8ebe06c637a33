"""fashiontag_pipeline: tag fashion catalogues through a tagging service, fast and exactly once.

Two halves: the engine (``fashiontag run``), a high-throughput bulk pipeline, and the reference
service (``fashiontag serve``), a faithful implementation of the service spec. This module is the
public face of the shared foundation: the client, its configuration, the wire models and errors.

The names load when first used (PEP 562): ``import fashiontag_pipeline`` imports none of the
client's dependencies, so that the ``fashiontag`` command holds the stop signals from its first
line (:mod:`fashiontag_pipeline.cli`), not after some 100 ms of imports.
"""

from __future__ import annotations

import importlib

from . import _aiohttp_import

# aiohttp's SSL contexts load the CA bundle on first TLS use, whoever imports it first.
_aiohttp_import.install()

#: typing.TYPE_CHECKING, known to mypy by its name, without importing typing (a few ms).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from ._client import ClientStats, TaggerClient
    from ._config import ClientConfig, Limits, RetryPolicy, Secret, Timeout, load_client_config
    from ._exceptions import (
        AmbiguousWriteError,
        AuthenticationError,
        ConfigError,
        ConnectError,
        DecodeError,
        ExpiredError,
        FashiontagError,
        LeaseLostError,
        ManifestError,
        PayloadTooLargeError,
        PermissionDeniedError,
        RateLimitedError,
        RequestError,
        ResultsExpiredError,
        ResultsNotReadyError,
        ResultStoreError,
        ResumeMismatchError,
        ServerError,
        ServiceError,
        StateConflictError,
        StateError,
        StateInUseError,
        TaskExpiredError,
        TaskNotFoundError,
        TimeoutError_,
        TLSError,
        TransportError,
        UnsupportedLanguageError,
        ValidationError,
    )
    from ._models import (
        BulkContext,
        BulkTaskResponse,
        Context,
        Detection,
        Image,
        ImageType,
        ResultItem,
        TaggingRequest,
        TaggingResponse,
        Task,
        TaskResultsData,
        TaskStatus,
    )

__version__ = "0.1.0"

__all__ = [
    "AmbiguousWriteError",
    "AuthenticationError",
    "BulkContext",
    "BulkTaskResponse",
    "ClientConfig",
    "ClientStats",
    "ConfigError",
    "ConnectError",
    "Context",
    "DecodeError",
    "Detection",
    "ExpiredError",
    "FashiontagError",
    "Image",
    "ImageType",
    "LeaseLostError",
    "Limits",
    "ManifestError",
    "PayloadTooLargeError",
    "PermissionDeniedError",
    "RateLimitedError",
    "RequestError",
    "ResultItem",
    "ResultStoreError",
    "ResultsExpiredError",
    "ResultsNotReadyError",
    "ResumeMismatchError",
    "RetryPolicy",
    "Secret",
    "ServerError",
    "ServiceError",
    "StateConflictError",
    "StateError",
    "StateInUseError",
    "TLSError",
    "TaggerClient",
    "TaggingRequest",
    "TaggingResponse",
    "Task",
    "TaskExpiredError",
    "TaskNotFoundError",
    "TaskResultsData",
    "TaskStatus",
    "Timeout",
    "TimeoutError_",
    "TransportError",
    "UnsupportedLanguageError",
    "ValidationError",
    "__version__",
    "load_client_config",
]

#: Where the public names live, searched in this order (the cheap modules first).
_HOMES = ("._exceptions", "._models", "._config", "._client")


def __getattr__(name: str) -> object:
    if name in __all__:
        for home in _HOMES:
            module = importlib.import_module(home, __name__)
            if name in vars(module):
                value = vars(module)[name]
                globals()[name] = value
                return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
