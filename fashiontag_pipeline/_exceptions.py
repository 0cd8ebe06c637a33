"""Every error the package raises. Nothing foreign (aiohttp, msgspec, OS) leaks out of the API.

::

    FashiontagError
    ├── ConfigError                    bad config file, flag or environment value
    ├── ManifestError                  a manifest that cannot be read at all
    ├── StateConflictError             a state file that belongs to an unfinished run of
    │   │                              other manifests, or is in use by another run
    │   ├── StateInUseError            the state or an output is held (locked) by another
    │   │                              run at work
    │   └── LeaseLostError             a manifest's lease moved to another owner (or ended):
    │                                  this process may no longer write its state
    ├── StateError                     a state file that cannot be opened or written
    ├── ResultStoreError               a result store (--reuse) that cannot be opened, read
    │                                  or written (corrupt, not a result store, a full disk)
    ├── TLSError                       the TLS handshake was refused for a reason a retry cannot
    │                                  fix (a certificate not trusted, expired or for another
    │                                  name; no TLS at that address): nothing was sent
    ├── TransportError                 the service could not be reached or answered garbage
    │   ├── ConnectError               connection refused/failed: the request was not sent
    │   ├── TimeoutError_              no answer in time (reads only; see AmbiguousWriteError)
    │   ├── DecodeError                the body was not the JSON shape the spec promises
    │   └── AmbiguousWriteError        a POST/PUT was sent but its outcome is unknown
    └── ServiceError                   the service answered with an error status
        ├── RequestError               4xx: the request is wrong; retrying will not help
        │   ├── AuthenticationError    401 (codes 609, 612)
        │   ├── PermissionDeniedError  403: not a bulk key on a bulk path
        │   ├── TaskNotFoundError      404
        │   ├── ResultsNotReadyError   409: results asked while TASK_PROCESSING
        │   ├── ExpiredError           410
        │   │   ├── TaskExpiredError       PUT after taskExpireAt
        │   │   └── ResultsExpiredError    results after resultExpiredAt
        │   ├── ValidationError        400 (body, limits, STRICT with its failure list)
        │   ├── PayloadTooLargeError   413
        │   └── UnsupportedLanguageError  code 826
        ├── RateLimitedError           429, with retry_after seconds
        └── ServerError                5xx

Errors carry their context (HTTP status, service code, task id, retry-after) and never an API key:
no message is built from request headers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._models import FailureItem

__all__ = [
    "AmbiguousWriteError",
    "AuthenticationError",
    "ConfigError",
    "ConnectError",
    "DecodeError",
    "ExpiredError",
    "FashiontagError",
    "LeaseLostError",
    "ManifestError",
    "PayloadTooLargeError",
    "PermissionDeniedError",
    "RateLimitedError",
    "RequestError",
    "ResultStoreError",
    "ResultStoreUnavailable",
    "ResultsExpiredError",
    "ResultsNotReadyError",
    "ResumeMismatchError",
    "SchemaTooNewError",
    "ServerError",
    "ServiceError",
    "StateConflictError",
    "StateError",
    "StateInUseError",
    "StateUnavailable",
    "TLSError",
    "TaskExpiredError",
    "TaskNotFoundError",
    "TimeoutError_",
    "TransportError",
    "UnsupportedLanguageError",
    "ValidationError",
]


class FashiontagError(Exception):
    """Root of every error raised by fashiontag_pipeline."""

    #: When the client call that failed began (``time.monotonic()``; None: not a call's).
    started_at: float | None = None


class ConfigError(FashiontagError):
    """A configuration value is missing or wrong; the message names the field."""


class ManifestError(FashiontagError):
    """A manifest cannot be read at all (not CSV/JSONL, no ``url`` column, unreadable file).

    ``mid_run``: found after the run had taken rows of it in (a truncated gzip), so the state
    holds a run of that very file. ``stdin``: found reading stdin (``-``), whose rows piped
    again are resumed with ``--resume``, where a file's repaired copy is a new run."""

    mid_run: bool = False
    stdin: bool = False


class StateConflictError(FashiontagError):
    """The state file holds an unfinished run of other manifests (or of stdin, which cannot be
    checked before it is read); the message names the file and how to go on."""


class ResumeMismatchError(StateConflictError):
    """A resume given another service, account or question than its run was begun with,
    whose rows in flight would be sent (and billed) again, or answered otherwise: the state is
    left as it was. Daemons sharing a state hand such a manifest back for one given what it
    was begun with, and stop."""


class StateInUseError(StateConflictError):
    """Another run at work holds the lock of this state or of an output: nothing was touched
    (that run's files, and its ``--summary``, are its own)."""


class LeaseLostError(StateConflictError):
    """This process no longer holds the lease of a manifest (it ended, or another daemon took
    it over with a higher epoch): the write was refused and nothing of it was committed."""

    def __init__(self, message: str, *, manifest: str = "", epoch: int = 0) -> None:
        super().__init__(message)
        self.manifest = manifest
        self.epoch = epoch


class StateError(FashiontagError):
    """The state file cannot be opened or written (permissions, a full disk, not a state
    file); the message names the file."""


class StateUnavailable(StateError):
    """A PostgreSQL state could not be connected to (connections refused, the server's or the
    role's connection limit reached, the server down), or its connection was lost (the server
    ended the session, the connection broke): no fault of the manifest whose state it is. A
    shared daemon counts no attempt of a manifest for it; the manifest waits."""


class SchemaTooNewError(StateError):
    """The state was written by a newer fashiontag (a database another daemon migrated, a
    state file of a newer layout): this process must be upgraded; no manifest is at fault."""


class ResultStoreError(FashiontagError):
    """The result store of ``--reuse`` cannot be opened, read or written (not a result store,
    damaged, a newer schema, a full disk); the message names the file. Never silently
    replaced: a store that cannot be read would otherwise mean a full, billed re-tag."""


class ResultStoreUnavailable(ResultStoreError):
    """The result store's database cannot be reached (a restart, a failover, connections
    refused): no fault of the manifests using it. A shared daemon counts no attempt of a
    manifest for it; the manifest waits until the store answers again."""


class TLSError(FashiontagError):
    """The TLS handshake with the service failed for a reason that asking again will not fix:
    its certificate is not trusted (a private CA missing from the trust store), has expired or
    names another host, or the address does not speak TLS (an ``http://`` service given as
    ``https://``), or speaks only TLS (the reverse: a plain request dropped unanswered). The
    request was not sent, or not in a form the service could apply. Not a
    :class:`TransportError`: no stage retries it (a run that did would spend its whole
    ``--give-up-after`` on a configuration fault)."""

    def __init__(self, message: str, *, method: str = "", path: str = "") -> None:
        super().__init__(message)
        self.method = method
        self.path = path


class TransportError(FashiontagError):
    """The service could not be reached, or did not answer in a usable way.

    ``stalled``: the request's deadline fired long after it was due, so this process was not
    running meanwhile (SIGSTOP, a frozen container or cgroup, a paused VM): its wait says
    nothing of the service, and its failing begins when it was seen, not when it was sent.
    ``deadline``: the request deadline (seconds) a request sent went unanswered past, its
    connection made (the service was reached, and is slower than that, or hangs); else None."""

    def __init__(self, message: str, *, method: str = "", path: str = "") -> None:
        super().__init__(message)
        self.method = method
        self.path = path
        self.stalled = False
        self.deadline: float | None = None


class ConnectError(TransportError):
    """The connection could not be made: the request was certainly not delivered."""


class TimeoutError_(TransportError):
    """The service did not answer in time."""


class DecodeError(TransportError):
    """The response body was not the JSON shape the spec promises."""


class AmbiguousWriteError(TransportError):
    """A create or append was sent, but whether the service applied it is unknown.

    Raised for timeouts and dropped connections after the request left, and for 5xx answers to
    a write. The engine resolves it with its idempotency rules (run token in the description,
    duplicate ids in a task); the client never retries it blindly.
    """

    def __init__(
        self,
        message: str,
        *,
        method: str = "",
        path: str = "",
        status: int | None = None,
        applied: bool = False,
        retry_after: float | None = None,
        unanswered_for: float = 0.0,
    ) -> None:
        super().__init__(message, method=method, path=path)
        self.status = status
        #: The answer's Retry-After in seconds (a 503 shedding load), if it sent one.
        self.retry_after = retry_after
        #: True when the service answered 2xx (the write was applied) but its answer could
        #: not be read (``204 No Content``, a body that is not the spec's): which rows it
        #: took is unknown, not whether it took the write.
        self.applied = applied
        #: Seconds a write of unknown fate went unanswered (to its timeout, a dropped
        #: connection, or a gateway's 5xx: it may have given up on the service), else 0: a
        #: service that slow may still be at work on it, and apply it as late again.
        self.unanswered_for = unanswered_for


class ServiceError(FashiontagError):
    """The service answered with an error status.

    Attributes: ``status`` (HTTP status), ``code`` (service error code when the body has one),
    ``service_message`` (the service's message), ``method``/``path`` of the request,
    ``task_id`` when the request named a task, and ``foreign``: a 400, 410 or 422 whose body
    is none of the service's error bodies (a front end's page: nginx's ``400 The plain HTTP
    request was sent to HTTPS port``), which may be about no element of the request (a 410:
    no expiry of the task's).
    """

    def __init__(
        self,
        message: str,
        *,
        status: int,
        code: int | None = None,
        service_message: str = "",
        method: str = "",
        path: str = "",
        task_id: str | None = None,
        foreign: bool = False,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.service_message = service_message
        self.method = method
        self.path = path
        self.task_id = task_id
        self.foreign = foreign

    def answer(self) -> dict[str, Any]:
        """The answer's attributes as keyword arguments: another error of the same answer
        (reworded, or of another class) is ``Cls(message, **err.answer())``."""
        return {
            "status": self.status,
            "code": self.code,
            "service_message": self.service_message,
            "method": self.method,
            "path": self.path,
            "task_id": self.task_id,
            "foreign": self.foreign,
        }


class RequestError(ServiceError):
    """4xx: the request itself is wrong; retrying it unchanged will not help."""


class AuthenticationError(RequestError):
    """401: the API key is missing or unknown."""


class PermissionDeniedError(RequestError):
    """403: the key is not allowed here (a single-mode key on a bulk path)."""


class TaskNotFoundError(RequestError):
    """404: no such task for this key."""


class ResultsNotReadyError(RequestError):
    """409: results were asked for while the task is still TASK_PROCESSING."""


class ExpiredError(RequestError):
    """410: the task or its results have expired."""


class TaskExpiredError(ExpiredError):
    """410 on an append: the task is past taskExpireAt and takes no more images."""


class ResultsExpiredError(ExpiredError):
    """410 on a results read: the results are past resultExpiredAt."""


class ValidationError(RequestError):
    """400: the body or a whole-request limit was refused.

    ``failure_list`` holds the per-element failures of a STRICT request.
    """

    def __init__(
        self, message: str, *, failure_list: list[FailureItem] | None = None, **kwargs: object
    ) -> None:
        super().__init__(message, **kwargs)  # type: ignore[arg-type]
        self.failure_list: list[FailureItem] = failure_list or []


class PayloadTooLargeError(RequestError):
    """413: the request body is larger than the service accepts."""


class UnsupportedLanguageError(RequestError):
    """Service code 826: the accept-language is not supported. Never retried."""


class RateLimitedError(ServiceError):
    """429: slow down; ``retry_after`` is the service's Retry-After in seconds, if it sent one."""

    def __init__(self, message: str, *, retry_after: float | None = None, **kwargs: object) -> None:
        super().__init__(message, **kwargs)  # type: ignore[arg-type]
        self.retry_after = retry_after


class ServerError(ServiceError):
    """5xx: a fault on the service side, usually transient."""
