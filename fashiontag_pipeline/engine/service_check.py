"""Whether a resumed run is given the service its tasks are on.

A run records the base URL it sends to (without its user part: never a password, a token or a
key). A resume given another one (a cron line edited to a staging URL or a new region) asks the
service given now for one of the run's live tasks, once: a service that does not know it would
have every row of those tasks sent, and billed, again (the engine takes a task 404 as one the
service forgot), while the first service still tags them. That is refused; a URL reaching the
same service (a proxy, a new name) finds the task and the run resumes there.
"""

from __future__ import annotations

from .. import _exceptions as exc
from .._client import TaggerClient
from .._config import ClientConfig
from .._urls import shown_url
from .state import StateStore

__all__ = ["SERVICE", "check_service", "service_text"]

#: The meta key of the base URL a run's tasks were created on.
SERVICE = "service"


def service_text(base_url: str) -> str:
    """``base_url`` as recorded: its user part (``user:password@``, ``TOKEN@``) left out,
    taken as :func:`~.._urls.shown_url` takes it (to the last ``@``: a password may hold an
    unencoded ``/``)."""
    scheme, sep, rest = base_url.partition("://")
    return f"{scheme}{sep}{rest.rpartition('@')[2]}".rstrip("/")


async def check_service(
    where: str, db: StateStore, client: ClientConfig | TaggerClient, given: str
) -> None:
    """:class:`StateConflictError` when the state's unfinished run has live tasks on another
    service than ``given`` (the base URL as :func:`service_text` records it) and the service
    at ``given`` does not know them. One request, only when the URL changed."""
    before = db.meta(SERVICE)
    if before is None or before == given:
        return
    live = [row[0] for row in db.resume_tasks() if row[3] != "lost"]
    if not live:
        return  # nothing in flight: the rows left are sent to the service given now
    tagger = TaggerClient(config=client) if isinstance(client, ClientConfig) else client
    try:
        await tagger.task_status(live[0])
    except exc.TaskNotFoundError:
        pass
    except exc.FashiontagError:
        return  # unreachable, refused, ...: the run meets it and says so
    else:
        return  # the same service by another name
    finally:
        if tagger is not client:
            await tagger.aclose()
    raise exc.StateConflictError(
        f"{where} holds an unfinished run whose {len(live)} live task(s) are on the service at"
        f" {shown_url(before)}; the service given now, {shown_url(given)}, does not know them"
        " (their rows would be sent, and billed, again there): resume it with --base-url"
        f" {before}, where their results are read, and change the URL once the run is"
        " complete (only if that service is gone for good, --restart starts over: every row"
        " is tagged again)"
    )
