"""HTTP answers as the exception tree: the one table that maps a status, a service code and an
error body (either shape of the interface) to an exception, and reads ``Retry-After``."""

from __future__ import annotations

import re
from typing import Any

import msgspec

from . import _exceptions as exc
from ._models import FailureItem, Validation, says_success
from ._times import retry_after
from ._urls import api_path_in_base, shown_url

__all__ = [
    "Response",
    "error_for",
    "failure_in_success",
    "front_end_answer",
    "no_tagging_result",
    "no_task_named",
    "not_the_shape",
    "parse_error_body",
    "unreadable_write",
]

CODE_UNSUPPORTED_LANGUAGE = 826
#: Codes of the single endpoint's failure body (the service family's: docs/service.md) that
#: refuse the request whatever its image, and the HTTP status each stands for: 500 internal
#: error, 609 authentication failed, 612 API key required, 623 invalid URI or method (the
#: service's 405: a base URL that reaches it at another path), 823 usage quota exceeded, 826
#: unsupported language. An answer 200 with one is that error, no failure of the image.
REFUSING_CODES = {
    500: 500,
    609: 401,
    612: 401,
    623: 405,
    823: 429,
    CODE_UNSUPPORTED_LANGUAGE: 400,
}

_error_body_decoder = msgspec.json.Decoder(dict[str, Any])


class Response(msgspec.Struct, frozen=True):
    """An answer of the service: its status, body and headers (a Struct, not a dataclass:
    created in C, where a dataclass exec()s its generated methods at every start-up)."""

    status: int
    body: bytes
    headers: Any


def error_for(
    response: Response,
    method: str,
    path: str,
    task_id: str | None,
    key_hint: str,
    *,
    endpoint: str | None = None,
) -> exc.FashiontagError:
    """The exception for an error answer (``key_hint`` says which key a 401/403 refused;
    ``endpoint``, the full URL of an endpoint that is no task's, is named when it is not found:
    a base URL without the gateway's path prefix, or with another one)."""
    status = response.status
    code, message, failures = parse_error_body(response.body)
    where = f"{method} {path}"
    text = f"{where}: HTTP {status}" + (f" (code {code})" if code is not None else "")
    if message:
        text += f": {message}"
    if endpoint is not None and status in (404, 405):
        hint = api_path_in_base(endpoint[: -len(path)])
        text += f" (no such endpoint at {endpoint}: is the base URL right?{hint})"
    if 300 <= status < 400:
        location = response.headers.get("Location") if response.headers is not None else None
        moved = _moved_base(location, path)
        text += (
            f" (the service redirects to {shown_url(location) if location else 'another address'}:"
            " redirects are not followed, so that the API key goes only to the configured base"
            " URL" + (f"; if the service has moved, give the base URL {moved})" if moved else ")")
        )
    common: dict[str, Any] = {
        "status": status,
        "code": code,
        "service_message": message,
        "method": method,
        "path": path,
        "task_id": task_id,
    }
    if code == CODE_UNSUPPORTED_LANGUAGE:
        return exc.UnsupportedLanguageError(text, **common)
    if status == 429:
        wait = retry_after(response.headers)
        return exc.RateLimitedError(text + _asks_to_wait(wait), retry_after=wait, **common)
    if status >= 500 or status == 408:  # 408 Request Timeout: a transient fault too
        return exc.ServerError(text + _asks_to_wait(retry_after(response.headers)), **common)
    if status in (401, 403):
        text += f" ({key_hint})"
        if status == 401:
            return exc.AuthenticationError(text, **common)
        return exc.PermissionDeniedError(text, **common)
    if status == 404:
        if method != "POST" and _not_an_error_of_the_service(response.body):
            # A read or an append answered 404 with a page that is not the service's JSON
            # (``404 page not found``, an HTML page, Envoy's empty body, Kong's ``{"message":
            # "no Route matched ..."}``): a gateway or ingress that has no route to the
            # service for a while (a redeploy). It says nothing about the task, which
            # the service may well hold: taken for "task gone", its rows were sent and billed
            # again (a results page), or the run stopped (the task list). Transient, like a
            # 5xx. (A create or a single-mode request so answered stops the run, as a wrong
            # base URL does.)
            return exc.ServerError(text + " (not the service's answer)", **common)
        return exc.TaskNotFoundError(text, **common)
    if status == 409:
        return exc.ResultsNotReadyError(text, **common)
    if status == 410:
        # (a front end's page, not the service's JSON: no word of the service's on the task)
        common["foreign"] = _not_an_error_of_the_service(response.body)
        if method == "PUT":
            return exc.TaskExpiredError(text, **common)
        return exc.ResultsExpiredError(text, **common)
    if status == 413:
        return exc.PayloadTooLargeError(text, **common)
    if status == 400 or status == 422:
        if _not_an_error_of_the_service(response.body):
            common["foreign"] = True  # (a front end's page: see exc.ServiceError)
        return exc.ValidationError(text, failure_list=failures, **common)
    return exc.RequestError(text, **common)


def refused_in_success(
    response: Response, code: int, message: str, path: str, key_hint: str
) -> exc.FashiontagError:
    """The error a single-mode answer of HTTP ``response.status`` (a success) stands for
    when its failure body's code refuses the request (:data:`REFUSING_CODES`)."""
    status = REFUSING_CODES[code]
    text = f"POST {path}: HTTP {response.status} with a failure refusing the request (code {code})"
    text += f": {message}" if message else ""
    common: dict[str, Any] = {
        "status": status,
        "code": code,
        "service_message": message,
        "method": "POST",
        "path": path,
    }
    if code == CODE_UNSUPPORTED_LANGUAGE:
        return exc.UnsupportedLanguageError(text, **common)
    if status == 401:
        return exc.AuthenticationError(f"{text} ({key_hint})", **common)
    if status == 429:
        wait = retry_after(response.headers)
        return exc.RateLimitedError(text + _asks_to_wait(wait), retry_after=wait, **common)
    if status == 405:  # (about no image: the run stops, as on a 405 answered so)
        return exc.RequestError(text, **common)
    return exc.ServerError(text, **common)


def failure_in_success(
    response: Response,
    status: str,
    error: str | None,
    method: str,
    path: str,
    task_id: str | None,
    *,
    code: int | None = None,
    write: bool = False,
) -> exc.ServerError:
    """A read (list, status) answered with the spec's failure body, yet HTTP 2xx: no request
    error of ours can be told from it, and asking again is harmless, so it is a transient
    fault of the service (retried under the run's give-up budget). A ``write`` so answered
    that names no task and took no row (:func:`_took_nothing`) is one too: nothing applied."""
    return exc.ServerError(
        f"{method} {path}: service answered HTTP {response.status} with"
        f" status={status!r}: {error or 'no reason given'}"
        + (" (nothing applied)" if write else ""),
        status=response.status,
        code=code,
        service_message=error or "",
        method=method,
        path=path,
        task_id=task_id,
    )


def not_the_shape(response: Response, method: str, path: str, err: Exception) -> exc.DecodeError:
    """An answer whose body is not the JSON its request expects (``err``: msgspec's words)."""
    return exc.DecodeError(
        f"{method} {path}: HTTP {response.status} body is not the expected JSON: {err}",
        method=method,
        path=path,
    )


def no_tagging_result(response: Response, path: str, err: ValueError) -> exc.FashiontagError:
    """The error of a single-mode answer (a success status) that is no tagging result (why:
    ``err``). An empty body or a page that is not JSON comes from a front end in the way (a
    load balancer's maintenance page served 200 by a backend switched over, part of the
    requests): it says nothing of the image sent, transient like a 5xx. Any other is the
    service's answer, unreadable."""
    body = response.body
    if body[:1] != b"{" and (not body.strip() or _front_end_page(body)):
        text = _page_text(body) if body.strip() else "an empty body"
        return exc.ServerError(
            f"POST {path}: HTTP {response.status} with a page that is not the service's JSON:"
            f" {text} (not the service's answer)",
            status=response.status,
            service_message=text,
            method="POST",
            path=path,
        )
    return exc.DecodeError(
        f"POST {path}: HTTP {response.status} body is not a tagging result: {err}",
        method="POST",
        path=path,
    )


def front_end_answer(
    response: Response, method: str, path: str, task_id: str | None
) -> exc.ServerError | None:
    """The error for a 2xx answer whose body is not JSON at all (an HTML or text page), None
    for any other. The service answers JSON; such a page comes from a front end in its way (a
    load balancer's maintenance page served 200 OK while the service is switched over), says
    nothing of what was asked, and is gone a moment later: transient, like a 5xx. So is an
    empty answer to a read (a front end's fixed response; a write's is applied: 204). Only the
    first byte is looked at for a body that begins as the service's objects do."""
    body = response.body
    if body[:1] == b"{":  # (every page of the service's: nothing more is looked at)
        return None
    empty = method == "GET" and not body.strip()
    if not (empty or _front_end_page(body)):
        return None
    text = "an empty body" if empty else _page_text(body)
    return exc.ServerError(
        f"{method} {path}: HTTP {response.status} with a page that is not the service's JSON:"
        f" {text} (not the service's answer)",
        status=response.status,
        service_message=text,
        method=method,
        path=path,
        task_id=task_id,
    )


def no_task_named(response: Response, method: str, path: str) -> exc.DecodeError:
    """A create's answer that names no task (``"taskId": ""``): an answer that cannot be
    read, so applied, its task found by its token. Before, "" was taken for the task's id
    and every request to the task failed with a ValueError traceback."""
    return exc.DecodeError(
        f"{method} {path}: HTTP {response.status} answer names no task (an empty taskId)",
        method=method,
        path=path,
    )


def unreadable_write(
    response: Response,
    method: str,
    path: str,
    err: exc.DecodeError,
    page: exc.ServerError | None,
    *,
    create: bool = False,
) -> exc.AmbiguousWriteError | exc.ValidationError | exc.ServerError:
    """The error of a write answered 2xx whose answer cannot be read (``err``): which task,
    which rows is unknown, and it is never sent again blindly. It was applied (the service
    answered it), unless its body is a front end's ``page`` (not JSON at all: a maintenance
    page served 200 OK, which the service never saw): then its fate is unknown. Taken as
    applied, a create so answered was looked for by its token until the give-up budget ran
    out, and the run stopped.

    A ``create`` answered with no task, its ``validation.accept`` 0 and the rows refused in
    its ``failureList`` (a service that makes no task of a create that took nothing: the spec
    does not say it makes one), is the refusal of those rows, as a 400 with them: before, its
    task was looked for until the give-up budget ran out, the run stopped, and every resume
    the same. So is the bulk paths' failure body under a 2xx (``{"status": "failure",
    "error": ...}``, no task named): nothing applied, a fault of the service asked again as a
    poll so answered is (before, taken for an applied write, the same)."""
    if (refused := _took_nothing(response, method, path, create)) is not None:
        return refused
    return exc.AmbiguousWriteError(
        f"{page}; the write may or may not have been applied"
        if page is not None
        else f"{method} {path}: HTTP {response.status} answer could not be read ({err});"
        " the write was applied",
        method=method,
        path=path,
        status=response.status,
        applied=page is None,
    )


class _Untasked(msgspec.Struct, rename="camel", gc=False):
    """A write's answer read for whether it took any row (``taskId`` of any type, or none)."""

    status: Any = None
    task_id: Any = None
    validation: Validation | None = None
    failure_list: list[FailureItem] | None = None


_untasked_decoder = msgspec.json.Decoder(_Untasked, strict=False)


def _took_nothing(
    response: Response, method: str, path: str, create: bool
) -> exc.ValidationError | exc.ServerError | None:
    """See :func:`unreadable_write`."""
    try:
        answer = _untasked_decoder.decode(response.body)
    except (msgspec.DecodeError, RecursionError, UnicodeDecodeError):
        return None
    failures = answer.failure_list
    if answer.task_id not in (None, "") or (answer.validation and answer.validation.accept):
        return None  # a task named, or rows taken (billed) whatever its status: applied
    refusal = isinstance(answer.status, str) and not says_success(answer.status)
    if refusal and not failures:
        code, message, _ = parse_error_body(response.body)
        return failure_in_success(
            response, answer.status, message, method, path, None, code=code, write=True
        )
    if not (create or refusal) or not failures:
        return None
    if not refusal and (answer.validation is None or answer.validation.accept != 0):
        return None
    reason = next((f.error_message for f in failures if f.error_message), "no reason given")
    return exc.ValidationError(
        f"{method} {path}: HTTP {response.status} took none of the rows and named no task"
        f" ({len(failures)} refused): {reason}",
        failure_list=failures,
        status=response.status,
        service_message=reason,
        method=method,
        path=path,
    )


def _asks_to_wait(wait: float | None) -> str:
    """What an error's message adds for a Retry-After of ``wait`` seconds (a day's quota spent
    is told from a second's pause)."""
    if wait is None:
        return ""
    hours = f" ({wait / 3600:.3g} h)" if wait >= 3600 else ""
    return f" (the service asks to wait {wait:g} s{hours}: Retry-After)"


def _moved_base(location: str | None, path: str) -> str | None:
    """The base URL a redirect points to: ``location`` (absolute) without the request's path
    and query, when it ends with that path (a front end that moved the whole service)."""
    if not location or not location.startswith(("http://", "https://")) or not path:
        return None
    head = location.split("?", 1)[0].split("#", 1)[0]
    if not head.endswith(path):
        return None
    base = head[: -len(path)]
    return shown_url(base) if base.count("/") >= 2 and len(base) > len("https://") else None


def _front_end_page(body: bytes) -> bool:
    """Whether an answer's body is a page of something other than the service: not empty,
    and not JSON (the service's error bodies are JSON objects, its 404s included)."""
    if not body.strip():
        return False
    try:
        _error_body_decoder.decode(body)
    except (msgspec.DecodeError, RecursionError, UnicodeDecodeError):  # (see _http.decode)
        return True
    return False


def _not_an_error_of_the_service(body: bytes) -> bool:
    """Whether an error answer's body is none of the service's error bodies (which are JSON
    objects with ``status`` or ``error``): empty, not JSON, or JSON without either."""
    try:
        data = _error_body_decoder.decode(body)
    except (msgspec.DecodeError, RecursionError, UnicodeDecodeError):  # (b"" included)
        return True
    return "error" not in data and "status" not in data


_HTML = re.compile(rb"<(?:!doctype|html|head|body|title)\b", re.IGNORECASE)
_TITLE = re.compile(r"<title[^>]*>(.*?)</title>", re.IGNORECASE | re.DOTALL)
_TAG = re.compile(r"<[^>]*>")


def _page_text(body: bytes) -> str:
    """What a body that is not JSON says, in at most 200 characters: the title of an HTML page
    (a gateway's ``502 Bad Gateway``) or its text without markup, else the body's start."""
    head = body[:4096]
    if not _HTML.search(head[:512]):
        return body[:200].decode("utf-8", "replace").strip()
    text = head.decode("utf-8", "replace")
    title = _TITLE.search(text)
    titled = title is not None and title.group(1).strip()
    text = title.group(1) if title is not None and titled else _TAG.sub(" ", text)
    import html  # (its entity table only for an HTML error page: not at every start-up)

    return " ".join(html.unescape(text).split())[:200]


def parse_error_body(body: bytes) -> tuple[int | None, str, list[FailureItem]]:
    """(code, message, failureList) from either error body shape of DESIGN section 3."""
    try:
        data = _error_body_decoder.decode(body)
    except (msgspec.DecodeError, RecursionError, UnicodeDecodeError):  # (see _http.decode)
        return None, _page_text(body), []
    code: int | None = None
    message = ""
    error = data.get("error")
    if isinstance(error, dict):
        raw_code = error.get("code")
        if isinstance(raw_code, int):
            code = raw_code
        elif isinstance(raw_code, str) and raw_code.isdigit():
            code = int(raw_code)
        message = str(error.get("message", ""))
    elif isinstance(error, str):
        message = error
    elif isinstance(data.get("message"), str):  # (a gateway's own: Kong, AWS API Gateway)
        message = data["message"]
    failures: list[FailureItem] = []
    raw_failures = data.get("failureList")
    if isinstance(raw_failures, list):
        try:
            failures = msgspec.convert(raw_failures, list[FailureItem])
        except msgspec.ValidationError:
            failures = []
    return code, message, failures
