"""Single-mode route: rows bulk cannot take (local files, ``data:`` URIs) go to the single
endpoint (``POST /tagger/v2/tags``) as base64, a bounded number at a time.

::

    validate --[SingleItem]--> SingleRouter --(<= single_concurrency)--> client.tag --> Journal

* At most ``single_concurrency`` rows are in flight; a local file is read (in a worker thread)
  only once its row holds a slot, so memory is bounded by the cap x ``single_max_bytes`` (x ~2.3
  for the base64 copy), whatever the manifest holds.
* The file is read and checked in the thread: missing, a directory, unreadable, empty or
  larger than ``single_max_bytes`` is a rejects line (stage ``client``) with that reason; a
  ``data:`` URI whose base64 does not decode likewise. The ``data:image/<ext>;base64,`` prefix
  of a file takes ``<ext>`` from the magic bytes (PNG, JPEG, GIF, BMP, TIFF, WEBP), else from
  the file's suffix.
* Outcome: a 200 answer (``status`` success or failure) is a results line
  ``{"id", "taskId": null, "taggingResult"}`` (``taskId`` null marks single mode), the
  answer as the service sent it (a shape the typed model does not take too, as in bulk); a
  200 that is no tagging result (not JSON, not an object) is retried as a dropped one (a
  front end's page or an empty body as a 5xx below 500, never the image's fault), and
  one with the bulk paths' error body (``{"status": "failure", "error": "<text>"}``) as a
  5xx, and one whose failure code refuses the request whatever the image (823 quota, 609
  key...: ``_responses.REFUSING_CODES``) as the error it stands for; a 4xx request error
  (801/802/804/805/413...) is a rejects line with stage
  ``server-validation`` and the service's message (a 400 or 422 that is a front end's page,
  not the service's error body, only once another image was tagged: before, it is retried
  under the budget, as nginx's answer to every request on a wrong port would be); transport
  errors, 429 and 5xx left after the client's own retries are retried under the run's
  :class:`~.flow.RetryBudget` (the run stops with :class:`~.flow.FatalRunError`, state
  saved, when the budget is spent); a refused key is
  fatal at once. An image whose request is answered a 5xx other than 502/503/504 (a 500, say)
  ``max_sends`` times, each time with another image tagged since its previous failure, is one
  the service fails on (a poison image, not an outage; a connection dropped or timed out on
  it counts too; load shedding, a gateway's 502/504, a 429 or a connection not made say
  nothing of the image and never count): a rejects line of
  stage ``unreturned`` that says so, rather than a run that stops on it every night. An
  endpoint that fails every image rejects none. With no other image left to compare with (the
  manifests read, no other routed row in flight or waiting), each such failure counts once
  the endpoint has tagged another image of the run (in this process or an earlier one), and
  the image is a reject only when the run would otherwise stop on it (``give_up_after`` spent)
  with ``max_sends`` failures counted, some of them in an earlier run: a failure of the
  endpoint shorter than that, or an outage as the last image is on its way (one run cannot
  tell it from a poison image), rejects nothing. The counts are kept in the state (``meta``),
  so they add up across resumes.
* Exactly once: each routed row was written ahead to the ``singles`` table (pending) with the
  intake that moved the validated watermark over it (see :mod:`.state`); its outcome line and
  its ``done`` mark are one journal commit. A resume re-tags the pending rows (single tagging
  is idempotent).
"""

from __future__ import annotations

import base64
import functools
from collections.abc import Callable, Sequence
from typing import Any

import anyio
import msgspec

from .. import _exceptions as exc
from .._callctx import WRITES_STOPPED
from .._client import TaggerClient
from .._images import (
    ImageFileError,
    ImageFileShortage,
    data_uri_image,
    read_image_file,
    sniff_ext,
)
from .._models import Image, ImageType
from .config import EngineConfig
from .flow import FatalRunError, RetryBudget
from .jobs import Jobs
from .pages import PageRow
from .settle import STAGE_UNRETURNED
from .sinks import Reject
from .state import Journal, changes
from .validate import SINGLE_DATA, STAGE_CLIENT, Item, SingleItem, SingleRequest

__all__ = ["SingleRejected", "SingleRouter", "load_image", "sniff_ext"]

STAGE_SERVER = "server-validation"

_body_encoder = msgspec.json.Encoder()


@functools.cache
def _body_decoder() -> msgspec.json.Decoder[SingleRequest]:
    """A pending single request's body (built on first use: only a resume with single rows
    pending reads one; built at import, it cost every start-up ~0.3 ms)."""
    return msgspec.json.Decoder(SingleRequest)


def _poison_reason(times: int, err: BaseException, *, alone: bool = False) -> str:
    message = " ".join(str(err).split())[:300]
    if alone:
        return (
            f"the service failed on this image {times} times, having tagged other images of"
            f" the run, and went on failing it with no other image left to tag (last: {message})"
        )
    return (
        f"the service failed on this image {times} times while it tagged others (last: {message})"
    )


#: 5xx that say the service is busy or a gateway failed (load shedding, an upstream down),
#: whatever the image: never a sign of a poison image.
SHEDDING_STATUSES = frozenset({502, 503, 504})


def _singles_out(err: BaseException) -> bool:
    """Whether a failed single-mode request may be the image's fault: a 5xx answered for it
    (500, say), or its connection dropped or timed out (a worker that crashes or hangs on the
    image), while others are tagged. A 502/503/504 says the service is busy or a gateway
    failed, and a connection not made never reached the service: not the image. Nor does an
    error below 500: a 408 (the body did not arrive in time) or a 200 refusing the request in
    the bulk paths' error shape (a gateway's rate limit or quota, which refuses part of the
    requests while others are tagged), or a front end's page or an empty body served 200."""
    if isinstance(err, exc.ServerError):
        return err.status >= 500 and err.status not in SHEDDING_STATUSES
    return isinstance(err, exc.TransportError) and not isinstance(err, exc.ConnectError)


def _unproven(err: exc.RequestError) -> exc.RequestError:
    """A front end's refusal (see :attr:`~.._exceptions.ServiceError.foreign`) of a request
    while the endpoint has tagged no image, worded for the run's warning and final error."""
    return exc.RequestError(
        f"{err} (a page that is not the service's answer, and no image tagged yet: is"
        " --base-url right?)",
        **err.answer(),
    )


class SingleRejected(Exception):
    """A routed row that has no image to send; the message is the reject reason."""


def load_image(request: SingleRequest, max_bytes: int) -> str:
    """The ``data:image/<ext>;base64,...`` content of a routed row (blocking: run in a
    thread). Raises :class:`SingleRejected` with the reason when there is nothing to send."""
    if request.kind == SINGLE_DATA:
        try:
            return data_uri_image(request.content, max_bytes)
        except ImageFileError as err:
            raise SingleRejected(str(err)) from None
    path = request.content
    try:
        data = read_image_file(path, max_bytes)
    except ImageFileShortage:
        raise  # (the process's lack, not the image's: read again, see SingleRouter._tag)
    except ImageFileError as err:
        raise SingleRejected(str(err)) from None
    ext = sniff_ext(data, path)
    return f"data:image/{ext};base64," + base64.b64encode(data).decode("ascii")


def pending_ops(singles: Sequence[SingleItem]) -> list[tuple[str, Sequence[Any]]]:
    """Statements writing routed rows ahead (pending)."""
    return [
        changes.single_pending(pos, _body_encoder.encode(request)) for _, pos, request in singles
    ]


def _position(row: tuple[str, int, Any]) -> int:
    return row[1]


def merge_routes(items: list[Item], singles: list[SingleItem]) -> list[Any]:
    """Bulk and routed rows of a batch in one list, in position order (so that deduplication
    keeps the first row of an id, whichever route it takes)."""
    return sorted([*items, *singles], key=_position)


def split_routes(
    rows: list[Any], keep: Sequence[int], validated: int
) -> tuple[list[Item], list[SingleItem]]:
    """The kept rows of :func:`merge_routes`'s list, as (bulk items, routed rows); routed rows
    at positions <= ``validated`` are left out (an earlier attempt wrote them ahead)."""
    bulk: list[Item] = []
    singles: list[SingleItem] = []
    for i in keep:
        row = rows[i]
        if isinstance(row[2], SingleRequest):
            if row[1] > validated:
                singles.append(row)
        else:
            bulk.append(row)
    return bulk, singles


#: Statuses of the single endpoint that refuse the image sent (its reject): a request the
#: service finds invalid (400, 422: an image it cannot read, a context field it refuses) or
#: too large (413). Any other 4xx is about no image, and stops the run.
ROW_STATUSES = frozenset({400, 413, 422})


class SingleRouter:
    """The bounded pool of single-mode requests. :meth:`run` consumes the routed rows of the
    validator (and, on resume, the rows left pending) until its stream ends."""

    def __init__(
        self,
        *,
        client: TaggerClient,
        journal: Journal,
        config: EngineConfig,
        budget: RetryBudget,
        jobs: Jobs,
        on_idle: Callable[[], None],
    ) -> None:
        self.client = client
        self.jobs = jobs
        self.journal = journal
        self.config = config
        self.budget = budget
        self.on_idle = on_idle
        self.cap = config.single_concurrency
        self._slots = anyio.Semaphore(self.cap)
        self.inflight = 0
        self.peak = 0
        self.active = 0
        self.intake_done = False
        self.idle = anyio.Event()
        self._stop_scope = anyio.CancelScope()
        #: Images the single endpoint has answered (200) so far: a failure with one of them
        #: since the image's previous failure is no outage of the endpoint.
        self.tagged = 0
        #: Whether the endpoint tagged an image of the run in an earlier process (the state).
        self.tagged_before = False
        #: Failures counted toward ``max_sends`` in earlier processes, by pending position.
        self.failures: dict[int, int] = {}

    def stop(self) -> None:
        """Start no new row (a drain): the requests in flight end."""
        self._stop_scope.cancel()

    # ------------------------------------------------------------------ resume

    def _load_pending(self) -> list[SingleItem]:
        self.tagged_before, self.failures = self.journal.db.single_failures()
        out: list[SingleItem] = []
        for pos, body in self.journal.db.pending_singles():
            request = _body_decoder().decode(body)
            out.append((request.context.id or "", pos, request))
        return out

    async def load_pending(self) -> list[SingleItem]:
        """Routed rows written ahead whose outcome was never committed."""
        return await self.journal.run(self._load_pending)

    # ------------------------------------------------------------------ the pool

    async def run(
        self,
        items: anyio.abc.ObjectReceiveStream[list[SingleItem]],
        pending: Sequence[SingleItem] = (),
    ) -> None:
        async with anyio.create_task_group() as tg, items:
            self.active += 1
            try:
                with self._stop_scope:
                    for item in pending:
                        await self._start(tg, item)
                    async for batch in items:
                        for item in batch:
                            await self._start(tg, item)
                if self._stop_scope.cancel_called:
                    # Stopped (a drain, SIGTERM): the rows not started are not sent. Each was
                    # written ahead (pending) with its intake, so a resume tags it; the
                    # requests in flight end (or are cancelled by an abort).
                    async for _ in items:
                        pass
            finally:
                self.active -= 1
                self.intake_done = True
                self._check_idle()

    async def _start(self, tg: anyio.abc.TaskGroup, item: SingleItem) -> None:
        await self._slots.acquire()
        self.active += 1
        tg.start_soon(self._one, item)

    def _check_idle(self) -> None:
        if self.intake_done and self.active == 0 and not self.idle.is_set():
            self.idle.set()
            self.on_idle()

    async def _one(self, item: SingleItem) -> None:
        self.inflight += 1
        self.peak = max(self.peak, self.inflight)
        try:
            await self._tag(item)
        finally:
            self.inflight -= 1
            self.active -= 1
            self._slots.release()
            self._check_idle()

    async def _tag(self, item: SingleItem) -> None:
        ident, pos, request = item
        # A drain ends the run's wait before a retry too (a Retry-After of a minute).
        stopped = WRITES_STOPPED.get()
        while True:
            if self._stop_scope.cancel_called or (stopped is not None and stopped.is_set()):
                return  # a drain: refused (not tagged), the row waits in the state
            try:
                content = await anyio.to_thread.run_sync(
                    load_image, request, self.config.single_max_bytes
                )
            except SingleRejected as err:
                await self._reject(item, str(err), STAGE_CLIENT)
                return
            except ImageFileShortage as err:  # (EMFILE: the requests in flight hold them)
                await self.budget.failed(err, "single-mode image read", until=stopped)
                continue
            break
        image = Image(type=ImageType.BASE64, content=content)
        del content
        context = request.context
        if context.detection is None and self.config.default_detection:
            context = msgspec.structs.replace(
                context, detection=list(self.config.default_detection)
            )
        # This image's failures with another image tagged since its previous one (the
        # endpoint works, so the failure is this image's: a poison image), or with no other
        # image left to compare with, once the endpoint has tagged one (kept in the state).
        alone = self.failures.pop(pos, 0)
        # Failures counted in an earlier run: a lone image is ended only then (inside one
        # run, an outage of the endpoint as the last image is on its way looks the same).
        earlier = alone > 0
        tagged = self.tagged
        while True:
            if self._stop_scope.cancel_called or (stopped is not None and stopped.is_set()):
                return  # a drain: refused (not tagged), the row waits in the state
            try:
                answer = await self.client.tag_raw(image, context)
            except (
                exc.AuthenticationError,
                exc.PermissionDeniedError,
                exc.UnsupportedLanguageError,
            ) as err:
                raise FatalRunError(f"the service refused the run: {err}") from err
            except exc.RateLimitedError as err:
                await self.budget.failed(err, "single-mode tag", until=stopped)
                continue
            except (exc.TransportError, exc.ServerError) as err:
                last = _singles_out(err) and self._last_left()
                if _singles_out(err) and (self.tagged != tagged or last):
                    alone += 1
                    tagged = self.tagged
                    if alone >= self.config.max_sends and not last:
                        await self._reject(item, _poison_reason(alone, err), STAGE_UNRETURNED)
                        return
                    await self.journal.commit(ops=[changes.single_failed(pos, alone)])
                try:
                    await self.budget.failed(err, "single-mode tag", until=stopped)
                except FatalRunError:
                    if not (
                        last and earlier and alone >= self.config.max_sends and self._last_left()
                    ):
                        raise
                    reason = _poison_reason(alone, err, alone=True)
                    await self._reject(item, reason, STAGE_UNRETURNED)
                    return
                continue
            except exc.RequestError as err:
                message = err.service_message or str(err)
                if err.status not in ROW_STATUSES:
                    # A 404 or 405 (a gateway that does not route the endpoint, a wrong base
                    # URL) is about no image: every row would be refused for nothing it holds.
                    raise FatalRunError(
                        f"the single endpoint answered HTTP {err.status}, which is about no"
                        f" image ({' '.join(message.split())[:200]}): check --base-url; the"
                        " rows for it wait in the state"
                    ) from err
                if err.foreign and not self.tagged:
                    # A front end's page, not the service's error (nginx's "400 The plain
                    # HTTP request was sent to HTTPS port"), while no image is tagged: nothing
                    # says it is about this image. Retried under the budget until one is
                    # tagged (then it is), else the run stops with the rows kept.
                    await self.budget.failed(_unproven(err), "single-mode tag", until=stopped)
                    continue
                reason = f"{err.code}: {message}" if err.code is not None else message
                await self._reject(item, reason, STAGE_SERVER)
                return
            except exc.ServiceError as err:  # an unexpected status: transient until proven
                await self.budget.failed(err, "single-mode tag", until=stopped)
                continue
            break
        self.budget.ok()
        self.tagged += 1
        del image
        await self._result(ident, pos, answer)

    def _last_left(self) -> bool:
        """Whether a failing image is the last routed row left (the manifests read, no other
        in flight or waiting) and the endpoint has tagged another image of the run: no other
        image is left to show the endpoint works, and it worked for images."""
        lone = self.intake_done and self.active == 1
        return lone and (self.tagged > 0 or self.tagged_before)

    def _job(self, pos: int) -> int:
        job = self.jobs.of_pos(pos)
        return job.id if job is not None else -1

    async def _result(self, ident: str, pos: int, answer: bytes) -> None:
        # As the service sent it (on one line), as a bulk result is written.
        row = PageRow(ident, msgspec.Raw(answer))
        job = self._job(pos)
        await self.journal.commit(
            page=(None, [row]),
            page_job=job,
            ops=[
                *changes.single_done(pos),
                *([] if self.tagged_before else [changes.single_tagged()]),
            ],
            counters={"single": 1},
            by_job={job: {"single": 1}},
        )
        self.tagged_before = True

    async def _reject(self, item: SingleItem, reason: str, stage: str) -> None:
        ident, pos, request = item
        job = self._job(pos)
        await self.journal.commit(
            rejects=[(job, Reject(ident, reason, stage, request.line, request.source))],
            settle=True,
            ops=changes.single_done(pos),
            counters={"single": 1},
            by_job={job: {"single": 1}},
        )
