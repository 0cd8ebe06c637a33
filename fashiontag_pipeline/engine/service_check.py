"""Whether a resumed run is given the service, and the account, its tasks are on.

A run records the base URL it sends to (without its user part: never a password, a token or a
key) and a salted HMAC of its bulk key (16 hex digits of it, under a random salt: not the key,
nor a digest of it alone). A resume given another URL (a cron line edited to a staging URL or
a new region) or another key (another account's) asks the service for one of the run's live
tasks, once: a service or account that does not know it would have every row of those tasks
sent, and billed, again (the engine takes a task 404 as one the service forgot), while the
first still tags them. That is refused; a URL reaching the same service (a proxy, a new name),
or a key of the same account (a rotated key), finds the task and the run resumes. When the
URL changed and the first service is gone (it cannot be reached, or no longer knows the task:
a region shut down), the run resumes on the service given now, its live tasks' rows sent
there, as for tasks a service forgot: refusing would leave ``--restart`` (every row billed
again) as the only way on. A service that cannot tell (unreachable, a 5xx) leaves the URL and
key recorded as they were, so that the next resume asks again.
"""

from __future__ import annotations

import contextlib
import logging
import secrets
from collections.abc import AsyncIterator

import anyio

from .. import _exceptions as exc
from .._client import TaggerClient
from .._config import ClientConfig, RetryPolicy, Secret, key_mac, with_default_keys
from .._urls import clean_base_url, shown_url
from .answers import task_description
from .state import StateStore

__all__ = [
    "NEW_STATE",
    "RESTART",
    "SERVICE",
    "check_service",
    "confirm_service",
    "record_service",
    "service_text",
]

logger = logging.getLogger("fashiontag_pipeline.engine")

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


def _bulk_key(config: ClientConfig) -> Secret | None:
    """The key a client of ``config`` sends on bulk paths (as :class:`TaggerClient` picks it)."""
    config = with_default_keys(config)
    return config.bulk_api_key if config.bulk_api_key is not None else config.api_key


def _mac(client: ClientConfig | TaggerClient, salt: bytes) -> str:
    """The HMAC of the key the client sends on bulk paths."""
    if isinstance(client, TaggerClient):
        return client.bulk_key_mac(salt)
    return key_mac(_bulk_key(client), salt)


def _key_text(client: ClientConfig | TaggerClient, salt: str) -> str:
    return f"{salt}:{_mac(client, bytes.fromhex(salt))}"


def _same_key(recorded: str | None, client: ClientConfig | TaggerClient) -> bool:
    if recorded is None:
        return True  # (a state of an older build: nothing to compare)
    try:
        return secrets.compare_digest(_key_text(client, recorded.partition(":")[0]), recorded)
    except ValueError:  # (not hex: not ours)
        return True


def record_service(db: StateStore, client: ClientConfig | TaggerClient, given: str) -> None:
    """Record the service and key the run sends to now (in the caller's transaction)."""
    db.set_meta(SERVICE, given)
    recorded = db.meta(KEY)
    if recorded is None or not _same_key(recorded, client):
        db.set_meta(KEY, _key_text(client, secrets.token_hex(16)))


#: How a run starts over, as the refusal names it (the daemon's is another state).
RESTART = "--restart starts over: every row is tagged again"
NEW_STATE = (
    "move the manifests in flight from INBOX/.work back into the inbox and start the daemon"
    " on a new --state: they are tagged again"
)


async def check_service(
    where: str,
    db: StateStore,
    client: ClientConfig | TaggerClient,
    given: str,
    start_over: str = RESTART,
) -> bool:
    """:class:`StateConflictError` when the state's unfinished run has live tasks on another
    service than ``given`` (the base URL as :func:`service_text` records it), or under
    another bulk key, the service asked with these does not know them, and (for another URL)
    the first service still does. A request or two, only when the URL or the key changed.

    True when the service and key given are the run's from now on (:func:`record_service`);
    False when the service could not tell (unreachable, a 5xx, a refused key): the run goes on
    and meets that, and the next resume asks again (recorded, they would be taken as the
    run's, and a service that does not know its tasks sent every row of them again)."""
    before = db.meta(SERVICE)
    moved = before is not None and before != given
    rekeyed = not _same_key(db.meta(KEY), client)
    if not (moved or rekeyed):
        return True
    live = [row[0] for row in db.resume_tasks() if row[3] != "lost"]
    if not live:
        if not moved or before is None:
            return True  # nothing in flight: the rows left are sent to the service given now
        return await _check_creates(where, db, client, before, given, start_over)
    async with _asking(client) as tagger:
        said = await _ask(tagger, live[0])
        if said != "unknown":
            # The same service by another name, or the same account's new key; or it cannot
            # tell (unreachable, refused, ...): the run meets that and says so.
            return said == "known"
        if moved and not rekeyed and before is not None:
            async with _first(tagger, before) as first:
                if await _ask(first, live[0]) in ("unknown", "gone"):
                    _creates_elsewhere(db)
                    return True  # the first service is gone: its tasks' rows go to this one
    tasks = f"{len(live)} live task(s)"
    if moved:
        begun = f"whose {tasks} are on the service at {shown_url(before or '')}"
        now = f"the service given now, {shown_url(given)},"
        fix = f"resume it with --base-url {before}, where their results are read"
        if rekeyed:
            fix += ", and the bulk key it was begun with"
    else:
        begun = f"whose {tasks} were created with another bulk key (another account's?)"
        key = _bulk_key(client) if isinstance(client, ClientConfig) else None
        source = key.source if key is not None and key.source else "the caller"
        now = f"the service, asked with the bulk key from {source},"
        fix = "resume it with the bulk key it was begun with, to read their results"
    raise _refusal(where, begun, now, fix, start_over)


@contextlib.asynccontextmanager
async def _asking(client: ClientConfig | TaggerClient) -> AsyncIterator[TaggerClient]:
    """The client to ask with: ``client`` itself, or one made of its config (closed after)."""
    if isinstance(client, TaggerClient):
        yield client
        return
    tagger = TaggerClient(config=client)
    try:
        yield tagger
    finally:
        await tagger.aclose()


def _first(tagger: TaggerClient, before: str) -> TaggerClient:
    """The service the run was begun on, asked with a few tries (seconds, not the run's
    give-up time): a connection refused each time, or no such host, is a service gone (a
    region shut down), not a blip; a service that answers slowly is no service gone."""
    return tagger.at(before, retry=RetryPolicy(max_attempts=3))


def _refusal(
    where: str, begun: str, now: str, fix: str, start_over: str
) -> exc.ResumeMismatchError:
    return exc.ResumeMismatchError(
        f"{where} holds an unfinished run {begun}; {now} does not know them (their rows"
        f" would be sent, and billed, again): {fix}; change it once the run is complete"
        f" (only if those tasks are gone for good, {start_over})"
    )


#: How long a daemon's start waits for the service to say whether it knows the tasks in
#: flight. Past it (a service answering 503 with a minute's Retry-After, one that takes
#: connections and never answers) it is a service that cannot tell: the daemon starts,
#: nothing recorded, and the next start asks again. Asked with the client's retries, the
#: daemon did not listen for minutes, and systemd's TimeoutStartSec killed it over and over.
CONFIRM_WITHIN = 8.0


async def confirm_service(
    where: str,
    db: StateStore,
    client: TaggerClient,
    start_over: str = NEW_STATE,
    within: float = CONFIRM_WITHIN,
) -> None:
    """:func:`check_service` for the service and key ``client`` sends to, then
    :func:`record_service` (in a transaction of its own) when they are the state's from now on:
    a long-lived state's start (the daemon's), whose manifests in flight resume on them. The
    question takes ``within`` seconds at most (see :data:`CONFIRM_WITHIN`)."""
    given = service_text(clean_base_url(client.base_url))
    confirmed = False
    with anyio.move_on_after(within) as scope:
        confirmed = await check_service(where, db, client, given, start_over)
    if confirmed:
        with db.transaction():
            record_service(db, client, given)
    elif scope.cancelled_caught:
        logger.warning(
            "the service at %s did not say within %g s whether it knows the tasks in flight:"
            " going on; the next start asks again",
            shown_url(given),
            within,
        )


def _creates_elsewhere(db: StateStore) -> None:
    """The run goes on on another service: a create of unknown fate went to the first one, and
    can never be listed by this one (its rows are sent here): a resume looks at the task list
    once, not for the request deadline after it was sent."""
    db.creates_sent_elsewhere()


async def _check_creates(
    where: str,
    db: StateStore,
    client: ClientConfig | TaggerClient,
    before: str,
    given: str,
    start_over: str,
) -> bool:
    """:func:`check_service` for a state with no task yet, only creates whose answer never
    came (killed while one was on its way): the first service may hold their task, unknown
    to the one given now, which would be sent (and bill) their rows again. The first is asked
    for the creates' tokens, once (its list may lag a create: a task not listed yet is not
    seen). A first service gone lets the run go on (its tasks' rows sent to the one given
    now); one that cannot tell (a 5xx, no answer in time, a refused key) lets it go on too,
    unrecorded, so the next resume asks again: refusing would leave ``--restart`` (every row
    billed again) as the only way on past a first service that never answers again."""
    tokens = {row[3] for row in db.resume_chunks() if row[2] is None and row[3] is not None}
    if not tokens:
        return True
    wanted = {task_description(token) for token in tokens}
    async with _asking(client) as tagger, _first(tagger, before) as first:
        try:
            listed = await first.all_tasks()
        except exc.ConnectError:
            _creates_elsewhere(db)
            return True  # the first service is gone: the creates' rows go to this one
        except exc.FashiontagError:
            return False
    held = sum(1 for task in listed if (task.description or "") in wanted)
    if not held:
        return True
    raise _refusal(
        where,
        f"whose {held} task(s), created just before it stopped, are on the service at"
        f" {shown_url(before)}",
        f"the service given now, {shown_url(given)},",
        f"resume it with --base-url {before}, where their results are read",
        start_over,
    )


async def _ask(tagger: TaggerClient, task_id: str) -> str:
    """What the service says of the task: "known", "unknown" (404), "gone" (no connection:
    refused, no such host) or "unclear" (any other failure: no answer in time, a refused key,
    a 5xx...)."""
    try:
        await tagger.task_status(task_id)
    except exc.TaskNotFoundError:
        return "unknown"
    except exc.ConnectError:
        return "gone"
    except exc.FashiontagError:
        return "unclear"
    return "known"
