"""Wire shapes of the tagging service (spec sections 2.1-2.4 and 4.1-4.6).

Every shape is a msgspec Struct:

* ``rename="camel"`` where the wire is camelCase (``pair_index`` <-> ``pairIndex``);
* ``omit_defaults=True`` so that what we send carries no unset optional field;
* unknown fields are ignored when decoding (msgspec's default), so the service may add fields;
* every optional field has a default (msgspec schema-evolution rule);
* response structs are ``gc=False``: they never form reference cycles, and a 100-result page
  decodes measurably faster without GC tracking.

Expiry times come under two spellings (``taskExpiredAt`` in create/append responses,
``taskExpireAt`` on task resources); both are decoded and :attr:`expires_at` reads either.
Times stay as the service wrote them (strings, or JSON numbers of epoch seconds or
milliseconds: :data:`WireTime`) and are parsed with :func:`parse_time`, which also accepts the
looser forms a real service may send.
"""

from __future__ import annotations

import enum
from datetime import datetime
from typing import TYPE_CHECKING, Any, NamedTuple

import msgspec

from ._tagging import STATUS_SUCCESS as STATUS_SUCCESS
from ._tagging import (  # the tagging response (spec 2.3), re-exported
    Color,
    ColorDetail,
    DetectedObject,
    ErrorInfo,
    IdName,
    Position,
    ScoredTag,
    Tag,
    TaggingData,
    TaggingResponse,
)
from ._tagging import says_success as says_success
from ._taskstatus import is_done_word, is_ended_word
from ._times import WireTime, time_or_none
from ._times import format_time as format_time
from ._times import parse_time as parse_time

__all__ = [
    "BulkContext",
    "BulkTaskRequest",
    "BulkTaskResponse",
    "Color",
    "ColorDetail",
    "Context",
    "DetectedObject",
    "Detection",
    "EncodedRequests",
    "ErrorInfo",
    "FailureItem",
    "IdName",
    "Image",
    "ImageType",
    "Position",
    "ResultItem",
    "ScoredTag",
    "Tag",
    "TaggingData",
    "TaggingRequest",
    "TaggingResponse",
    "Task",
    "TaskCount",
    "TaskInfo",
    "TaskListData",
    "TaskListPage",
    "TaskListResponse",
    "TaskResultsData",
    "TaskResultsResponse",
    "TaskStatus",
    "TaskStatusResponse",
    "Validation",
    "format_time",
    "parse_time",
]

#: ``status`` value of a successful response. Anything else (``failure``, ``fail``) is a failure.
STATUS_FAILURE = "failure"

#: Spec section 8 limits, shared by the client, the engine and the reference service.
MAX_REQUESTS_PER_WRITE = 1000
MAX_PAGE_SIZE = 100
MAX_DESCRIPTION_LENGTH = 1024
LANGUAGES = ("en", "ko", "zh", "ja")


class Detection(enum.StrEnum):
    """Detection targets a request may ask for (spec 2.2)."""

    TOP = "TOP"
    BOTTOM = "BOTTOM"
    WHOLEBODY = "WHOLEBODY"
    SWIMWEAR = "SWIMWEAR"
    SHOES = "SHOES"
    BAG = "BAG"
    HAT = "HAT"
    JEWELRY = "JEWELRY"
    ACCESSORY = "ACCESSORY"


#: Detection used when a request names none: clothing only (spec 2.2 rule 1, 4.2 default).
CLOTHING_DETECTION: tuple[Detection, ...] = (
    Detection.TOP,
    Detection.BOTTOM,
    Detection.WHOLEBODY,
    Detection.SWIMWEAR,
)


class TaskStatus(enum.StrEnum):
    """Task states (spec 3)."""

    PROCESSING = "TASK_PROCESSING"
    DONE = "TASK_DONE"


_SPEC_STATUSES = frozenset(TaskStatus)


class ImageType(enum.StrEnum):
    """How ``image.content`` is to be read (spec 2.1). Bulk mode accepts ``url`` only."""

    URL = "url"
    BASE64 = "base64"


# --------------------------------------------------------------------------- requests


class Image(msgspec.Struct, omit_defaults=True, gc=False):
    """The image of a tagging request. Like the two below, built once per row of a manifest
    and never part of a reference cycle, so the cyclic GC does not track it (``gc=False``:
    building a row's request costs ~20% less)."""

    type: ImageType
    content: str


class Context(msgspec.Struct, omit_defaults=True, rename="camel"):
    """Single-mode context: every field optional, ``age`` a string."""

    id: str | None = None
    detection: list[Detection] | None = None
    gender: str | None = None
    brand: str | None = None
    currency: str | None = None
    price: str | None = None
    age: str | None = None
    keywords: str | None = None
    product_content_name: str | None = None
    season: str | None = None


class BulkContext(msgspec.Struct, omit_defaults=True, rename="camel", gc=False):
    """Bulk-mode context: ``id`` required and unique within a task, ``age`` a list."""

    id: str
    detection: list[Detection] | None = None
    gender: str | None = None
    brand: str | None = None
    currency: str | None = None
    price: str | None = None
    age: list[str] | None = None
    keywords: str | None = None
    product_content_name: str | None = None
    season: str | None = None


class SingleTagRequest(msgspec.Struct, omit_defaults=True):
    """Body of ``POST /tagger/v2/tags``."""

    image: Image
    context: Context | None = None


class TaggingRequest(msgspec.Struct, omit_defaults=True, gc=False):
    """One element of a bulk ``taggingRequest`` array."""

    image: Image
    context: BulkContext


class EncodedRequests(NamedTuple):
    """Tagging requests already encoded as a JSON array (``size`` of them): a bulk write sends
    these bytes as they are, so a caller that keeps the encoded form (the engine stores it as
    the chunk written ahead) encodes each request once."""

    raw: msgspec.Raw
    size: int


class BulkTaskRequest(msgspec.Struct, omit_defaults=True, rename="camel"):
    """Body of a bulk create (POST) or append (PUT)."""

    tagging_request: list[TaggingRequest]
    album_name: str | None = None
    option: list[str] | None = None
    default_detection: list[Detection] | None = None
    description: str | None = None


# --------------------------------------------------------------------------- bulk responses


class Validation(msgspec.Struct, gc=False):
    """How many requests of a create/append passed validation."""

    accept: int = 0
    failure: int = 0


if TYPE_CHECKING:
    WireTaskId = str
    WireObject = dict[str, Any]
    WireText = str
else:
    #: A task id as services send it: the spec's string, or a JSON integer (services that
    #: number their resources). ``__post_init__`` makes an integer its decimal text, the ``str``
    #: the type checker is told about (``/bulk/42`` and ``"taskId": "42"``: the same task).
    WireTaskId = str | int
    #: A failure echo's field, or ``null`` (a Go nil map or pointer): ``FailureItem`` drops it.
    WireObject = dict[str, Any] | None
    WireText = str | None


class FailureItem(msgspec.Struct, rename="camel", gc=False):
    """One request that failed validation, echoed back with the reason.

    The echo is kept as plain JSON values: it repeats what was sent, including what made it
    invalid, so it cannot be held to the request's own types (a ``null`` field: absent).
    """

    request: WireObject = {}
    error_message: WireText = ""

    def __post_init__(self) -> None:
        self.request = self.request or {}
        self.error_message = self.error_message or ""

    @property
    def context_id(self) -> str | None:
        """The echoed ``context.id``: a string, or an integer's decimal text (``"id": 17``:
        such a refused row was taken as accepted, and sent again)."""
        context = self.request.get("context")
        if isinstance(context, dict):
            value = context.get("id")
            if isinstance(value, str):
                return value
            if type(value) is int:
                return str(value)
        return None


if TYPE_CHECKING:
    WireFailures = list[FailureItem]
else:
    #: A bulk answer's array, or ``null`` for an empty one (a Go nil slice): ``__post_init__``
    #: makes it the empty list the type checker is told of (it was "not the expected JSON").
    WireFailures = list[FailureItem] | None


def _task_id_text(task_id: str | int) -> str:
    return task_id if type(task_id) is str else str(task_id)


class BulkTaskResponse(msgspec.Struct, rename="camel", gc=False):
    """202 body of a bulk create or append."""

    task_id: WireTaskId
    album_name: str | None = None
    task_expired_at: WireTime = None
    task_expire_at: WireTime = None
    validation: Validation = msgspec.field(default_factory=Validation)
    failure_list: WireFailures = []

    @property
    def expires_at(self) -> datetime | None:
        """The task expiry, whichever spelling the service used."""
        return time_or_none(self.task_expired_at or self.task_expire_at)

    def __post_init__(self) -> None:
        self.task_id = _task_id_text(self.task_id)
        if self.failure_list is None:
            self.failure_list = []


class TaskCount(msgspec.Struct, gc=False):
    """Per-task request counts."""

    total: int = 0
    done: int = 0
    processing: int = 0
    failure: int = 0


class Task(msgspec.Struct, rename="camel", gc=False):
    """A bulk task resource (spec 2.4)."""

    task_id: WireTaskId
    count: TaskCount = msgspec.field(default_factory=TaskCount)
    description: str | None = None
    #: A :class:`TaskStatus` when it is one of the spec's two; any other string as the service
    #: sent it (the spec names two states, services name more: one task of the key's list in
    #: a state of its own must not make the whole list unreadable). See :attr:`done` and
    #: :attr:`ended`.
    task_status: str = TaskStatus.PROCESSING
    task_expire_at: WireTime = None
    task_expired_at: WireTime = None
    result_expired_at: WireTime = None
    create_date: WireTime = None
    album_name: str | None = None

    def __post_init__(self) -> None:
        self.task_id = _task_id_text(self.task_id)
        if self.task_status in _SPEC_STATUSES:
            self.task_status = TaskStatus(self.task_status)

    @property
    def done(self) -> bool:
        """True once every image of the task is processed and results can be read: the spec's
        ``TASK_DONE``, in any case or spelling of the word (``task_done``, ``DONE``,
        ``TASK_COMPLETED``)."""
        status = self.task_status
        if status is TaskStatus.DONE:
            return True
        return status is not TaskStatus.PROCESSING and is_done_word(status)

    @property
    def ended(self) -> bool:
        """True when the service says the task ended without becoming done (``TASK_FAILED``,
        ``CANCELLED``, ``ABORTED``, ...): it never will be, though the results of the images
        it did process may be readable. A state that is neither done nor ended is taken as
        processing."""
        status = self.task_status
        if isinstance(status, TaskStatus):
            return False
        return is_ended_word(status)

    @property
    def expires_at(self) -> datetime | None:
        """The task (append) expiry, whichever spelling the service used."""
        return time_or_none(self.task_expire_at or self.task_expired_at)

    @property
    def results_expire_at(self) -> datetime | None:
        """When results stop being readable; None until the task is done."""
        return time_or_none(self.result_expired_at)

    @property
    def created_at(self) -> datetime | None:
        """The task's creation time (None: not given, or in no form :func:`parse_time` reads)."""
        return time_or_none(self.create_date)


class TaskListPage(msgspec.Struct, rename="camel", gc=False):
    """``data.taskInfo`` of a paged task list (the reference service's; absent elsewhere)."""

    total_count: int | None = None
    offset: int = 0
    size: int = 0


if TYPE_CHECKING:
    WireTasks = list[Task]
else:
    WireTasks = list[Task] | None  # (null: an empty array, see WireFailures)


class TaskListData(msgspec.Struct, rename="camel", gc=False):
    tasks: WireTasks = []
    task_info: TaskListPage | None = None

    def __post_init__(self) -> None:
        if self.tasks is None:
            self.tasks = []


class TaskListResponse(msgspec.Struct, omit_defaults=True, gc=False):
    """Body of ``GET /tagger/v2.12/bulk``."""

    status: str
    data: TaskListData | None = None
    error: str | None = None


class TaskStatusResponse(msgspec.Struct, omit_defaults=True, gc=False):
    """Body of ``GET /tagger/v2.12/bulk/{task}/status``."""

    status: str
    data: Task | None = None
    error: str | None = None


class TaskInfo(msgspec.Struct, rename="camel", gc=False):
    total_count: int = 0
    offset: int = 0
    size: int = 0


class ResultItem(msgspec.Struct, rename="camel", gc=False):
    """One image's outcome in a results page."""

    id: str
    tagging_result: TaggingResponse


if TYPE_CHECKING:
    WireResults = list[ResultItem]
else:
    WireResults = list[ResultItem] | None  # (null: an empty array, see WireFailures)


class TaskResultsData(msgspec.Struct, rename="camel", gc=False):
    task_info: TaskInfo = msgspec.field(default_factory=TaskInfo)
    results: WireResults = []

    def __post_init__(self) -> None:
        if self.results is None:
            self.results = []


class TaskResultsResponse(msgspec.Struct, omit_defaults=True, gc=False):
    """Body of ``GET /tagger/v2.12/bulk/{task}?offset=&size=``. Spec 4.6 shows ``data`` alone:
    ``status`` may be absent."""

    status: str | None = None
    data: TaskResultsData | None = None
    error: str | None = None
