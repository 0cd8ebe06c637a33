"""Whether a resumed run is given the service, and the account, its tasks are on.

A run records the base URL it sends to (without its user part: never a password, a token or a
key) and a salted HMAC of its bulk key (16 hex digits of it, under a random salt: not the key,
nor a digest of it alone). A resume given another URL (a cron line edited to a staging URL or
a new region) or another key (another account's) asks the service for one of the run's live
tasks, once: a service or account that does not know it would have every row of those tasks
sent, and billed, again (the engine takes a task 404 as one the service forgot), while the
first still tags them. That is refused; a URL reaching the same service (a proxy, a new name),
or a key of the same account (a rotated key), finds the task and the run resumes.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

from .. import _exceptions as exc
from .._client import TaggerClient
from .._config import ClientConfig, Secret, with_default_keys
from .._urls import shown_url
from .state import StateStore

__all__ = ["SERVICE", "check_service", "record_service", "service_text"]

#: The meta key of the base URL a run's tasks were created on.
SERVICE = "service"
#: The meta key of ``salt:HMAC`` of the bulk key the run's tasks were created with.
KEY = "service_key"


def service_text(base_url: str) -> str:
    """``base_url`` as recorded: its user part (``user:password@``, ``TOKEN@``) left out,
    taken as :func:`~.._urls.shown_url` takes it (to the last ``@``: a password may hold an
    unencoded ``/``)."""
    scheme, sep, rest = base_url.partition("://")
    return f"{scheme}{sep}{rest.rpartition('@')[2]}".rstrip("/")


def _bulk_key(client: ClientConfig | TaggerClient) -> Secret | None:
    """The key the client sends on bulk paths (as :class:`TaggerClient` picks it)."""
    if isinstance(client, TaggerClient):
        return client._bulk_api_key
    config = with_default_keys(client)
    return config.bulk_api_key if config.bulk_api_key is not None else config.api_key


def _key_text(key: Secret | None, salt: str) -> str:
    value = (key.reveal() if key is not None else "").encode("utf-8", "surrogatepass")
    digest = hmac.new(bytes.fromhex(salt), value, hashlib.sha256).hexdigest()[:16]
    return f"{salt}:{digest}"


def _same_key(recorded: str | None, key: Secret | None) -> bool:
    if recorded is None:
        return True  # (a state of an older build: nothing to compare)
    try:
        return hmac.compare_digest(_key_text(key, recorded.partition(":")[0]), recorded)
    except ValueError:  # (not hex: not ours)
        return True


def record_service(db: StateStore, client: ClientConfig | TaggerClient, given: str) -> None:
    """Record the service and key the run sends to now (in the caller's transaction)."""
    db.set_meta(SERVICE, given)
    key, recorded = _bulk_key(client), db.meta(KEY)
    if recorded is None or not _same_key(recorded, key):
        db.set_meta(KEY, _key_text(key, secrets.token_hex(16)))


async def check_service(
    where: str, db: StateStore, client: ClientConfig | TaggerClient, given: str
) -> None:
    """:class:`StateConflictError` when the state's unfinished run has live tasks on another
    service than ``given`` (the base URL as :func:`service_text` records it), or under
    another bulk key, and the service asked with these does not know them. One request, only
    when the URL or the key changed."""
    before, key = db.meta(SERVICE), _bulk_key(client)
    moved = before is not None and before != given
    rekeyed = not _same_key(db.meta(KEY), key)
    if not (moved or rekeyed):
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
        return  # the same service by another name, or the same account's new key
    finally:
        if tagger is not client:
            await tagger.aclose()
    tasks = f"{len(live)} live task(s)"
    if moved:
        begun = f"whose {tasks} are on the service at {shown_url(before or '')}"
        now = f"the service given now, {shown_url(given)},"
        fix = f"resume it with --base-url {before}, where their results are read"
        if rekeyed:
            fix += ", and the bulk key it was begun with"
    else:
        source = key.source if key is not None and key.source else "the caller"
        begun = f"whose {tasks} were created with another bulk key (another account's?)"
        now = f"the service, asked with the bulk key from {source},"
        fix = "resume it with the bulk key it was begun with, to read their results"
    raise exc.StateConflictError(
        f"{where} holds an unfinished run {begun}; {now} does not know them (their rows"
        f" would be sent, and billed, again): {fix}; change it once the run is complete"
        " (only if those tasks are gone for good, --restart starts over: every row is tagged"
        " again)"
    )
