"""fashiontag_pipeline: tag fashion catalogues through a tagging service, fast and exactly once.

Two halves: the engine (``fashiontag run``), a high-throughput bulk pipeline, and the reference
service (``fashiontag serve``), a faithful implementation of the service spec. This module is the
public face of the shared foundation: the client, its configuration, the wire models and errors.
"""

from __future__ import annotations

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
    ManifestError,
    PayloadTooLargeError,
    PermissionDeniedError,
    RateLimitedError,
    RequestError,
    ResultsExpiredError,
    ResultsNotReadyError,
    ResultStoreError,
    ServerError,
    ServiceError,
    StateConflictError,
    StateError,
    TaskExpiredError,
    TaskNotFoundError,
    TimeoutError_,
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
    "RetryPolicy",
    "Secret",
    "ServerError",
    "ServiceError",
    "StateConflictError",
    "StateError",
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
