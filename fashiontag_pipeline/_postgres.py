"""The state in PostgreSQL (``--state postgresql://...``): URLs, connections, versioned schema.

Every table the package keeps in PostgreSQL is created by :data:`MIGRATIONS`, an ordered list of
SQL steps. The database records the steps it has applied in ``schema_version``; :func:`migrate`
applies the missing ones, in order, in one transaction, under an advisory lock (several daemons
starting at once against one new database create the schema once). A database whose version is
newer than this code knows is refused: an older daemon must not write a schema it does not
understand.

Versions:

1. ``claims``: the daemon's claim ledger (the table of the SQLite ledger).
2. manifest leases on ``claims``: ``owner``, ``epoch``, ``lease_expires_at`` (database time).
3. ``states``: the engine states the database holds, each in a schema of its own
   (:mod:`fashiontag_pipeline.engine.state.pgstore`), with the version of its tables.
4. ``reuse_results`` and ``reuse_runs``: the result store of ``--reuse postgresql://...``
   (:mod:`fashiontag_pipeline.engine.reuse.pgstore`).

A URL may carry a password: it never reaches a message, a log or a repr (:func:`redact_url`).
Driver errors become :class:`~._exceptions.StateError` here, in one place (:func:`state_errors`).
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from typing import TYPE_CHECKING, LiteralString, NamedTuple
from urllib.parse import SplitResult, parse_qsl, unquote, urlencode, urlsplit, urlunsplit

from ._config import shown_url
from ._exceptions import SchemaTooNewError, StateError, StateUnavailable

if TYPE_CHECKING:
    import psycopg

__all__ = [
    "MIGRATIONS",
    "SCHEMA_VERSION",
    "Migration",
    "check_url",
    "connection_lost",
    "foreign_advice",
    "foreign_url",
    "holds_password",
    "is_postgres_url",
    "keyword_conninfo",
    "migrate",
    "redact_url",
    "schema_version",
    "state_errors",
    "url_problem",
]

URL_SCHEMES = ("postgresql://", "postgres://")

#: Any constant: the key of the advisory lock that serializes migrations.
MIGRATION_LOCK = 0x66746167  # "ftag"


class Migration(NamedTuple):
    """One step of the schema: applied once, in order, never edited after release (a change is
    a new step)."""

    version: int
    description: str
    statements: tuple[LiteralString, ...]


MIGRATIONS: tuple[Migration, ...] = (
    Migration(
        1,
        "the daemon's claim ledger",
        (
            """
            CREATE TABLE claims (
                id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
                name text NOT NULL,
                sha256 text NOT NULL,
                size bigint NOT NULL,
                claimed_at double precision NOT NULL,
                status text NOT NULL CHECK (
                    status IN ('claimed', 'done', 'failed', 'duplicate', 'abandoned')),
                settled_as text NOT NULL DEFAULT ''
            )
            """,
            "CREATE UNIQUE INDEX claims_in_flight ON claims (name) WHERE status = 'claimed'",
            "CREATE INDEX claims_sha256 ON claims (sha256, status)",
        ),
    ),
    Migration(
        2,
        "manifest leases: owner, epoch, expiry in database time",
        (
            """
            ALTER TABLE claims
                ADD COLUMN owner text,
                ADD COLUMN epoch bigint NOT NULL DEFAULT 0,
                ADD COLUMN lease_expires_at timestamptz
            """,
            "CREATE INDEX claims_leasable ON claims (lease_expires_at) WHERE status = 'claimed'",
        ),
    ),
    Migration(
        3,
        "engine states: one schema each, with the version of its tables",
        (
            """
            CREATE TABLE states (
                name text COLLATE "C" PRIMARY KEY,
                schema_name text COLLATE "C" NOT NULL UNIQUE,
                version integer NOT NULL,
                created_at timestamptz NOT NULL DEFAULT now()
            )
            """,
        ),
    ),
    Migration(
        4,
        "the result store of --reuse",
        (
            """
            CREATE TABLE reuse_results (
                fp bytea PRIMARY KEY,
                task_id text NOT NULL,
                stored_at double precision NOT NULL,
                result bytea NOT NULL
            )
            """,
            "CREATE INDEX reuse_results_stored_at ON reuse_results (stored_at)",
            """
            CREATE TABLE reuse_runs (
                run_id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
                started_at double precision NOT NULL,
                finished_at double precision NOT NULL,
                looked_up bigint NOT NULL,
                reused bigint NOT NULL,
                stored bigint NOT NULL
            )
            """,
        ),
    ),
)

#: The version this code writes: the last step's.
SCHEMA_VERSION = MIGRATIONS[-1].version

_VERSION_TABLE = """
CREATE TABLE IF NOT EXISTS schema_version (
    version integer PRIMARY KEY,
    description text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
)
"""


def is_postgres_url(text: str) -> bool:
    """Whether a ``--state`` value names a PostgreSQL database rather than a file."""
    return text.startswith(URL_SCHEMES)


#: libpq's keyword/value form (``host=db dbname=tags user=tagger``), by its first keyword.
_KEYWORD = (
    r"(host|hostaddr|port|dbname|user|password|passfile|service|sslmode|options"
    r"|connect_timeout|application_name|target_session_attrs)\s*="
)
_KEYWORDS = re.compile(rf"\s*{_KEYWORD}")


def keyword_conninfo(text: str) -> bool:
    """Whether a ``--state`` or ``--reuse`` value is a libpq keyword/value string, not a
    file's path: only ``postgresql://`` URLs are read as databases."""
    return _KEYWORDS.match(text) is not None


def foreign_url(text: str) -> bool:
    """Whether a ``--state`` or ``--reuse`` value is a URL of another kind than PostgreSQL's
    (``mysql://``, SQLAlchemy's ``postgresql+psycopg://``) or libpq's keyword/value form:
    refused, never taken for a path."""
    if keyword_conninfo(text):
        return True
    return re.match(r"[A-Za-z][A-Za-z0-9+.-]+:/", text) is not None and not is_postgres_url(text)


def foreign_advice(text: str) -> str:
    """What to give instead of a :func:`foreign_url` value (the end of its refusal)."""
    if keyword_conninfo(text):
        return (
            "a libpq keyword=value string is not read: write it as a URL,"
            " postgresql://USER@HOST:PORT/DBNAME (?host=/socket/folder for a socket)"
        )
    return "give a file path or a postgresql:// URL (its scheme in lower case)"


#: The query parameters of a URL libpq reads a secret from: the password, and the passphrase
#: of an encrypted client key (``sslpassword``), masked in every message as the password is.
SECRET_PARAMS = frozenset({"password", "sslpassword"})


def holds_password(url: str) -> bool:
    """Whether ``url`` holds a password (in the authority or a :data:`SECRET_PARAMS`), as
    :func:`redact_url` masks it. Not ``redact_url(url) != url``: that re-encodes the query
    (``application_name=a%20b``, ``options=-c%20...``) and so differs with no password."""
    if shown_url(url) != url:
        return True
    try:
        pairs = parse_qsl(urlsplit(url).query, keep_blank_values=True)
    except ValueError:  # (redact_url masks all of it)
        return True
    return any(k in SECRET_PARAMS for k, _ in pairs)


def redact_url(url: str) -> str:
    """The URL without its password (in the authority or as a :data:`SECRET_PARAMS` one).

    Everything between ``://`` and the last ``@`` of the authority is the user's part: a
    password with an unencoded ``/``, ``#`` or ``?`` in it is still masked (a URL parser would
    end the authority early and show the rest)."""
    if "://" not in url:  # (a keyword/value string: its keywords, not a value, shown)
        found = re.findall(rf"(?:^|\s){_KEYWORD}", url) if keyword_conninfo(url) else ()
        return " ".join(f"{k}=..." for k in found) or "postgresql://***"
    scheme, _, rest = shown_url(url).partition("://")  # (the authority's password masked)
    try:
        parts = urlsplit(f"{scheme}://{rest}")
        pairs = parse_qsl(parts.query)
        query = urlencode([(k, "***" if k in SECRET_PARAMS else v) for k, v in pairs], safe="/")
        # A fragment after a password parameter may be the password's tail (an unencoded #).
        hidden = parts.fragment and any(k in SECRET_PARAMS for k, _ in pairs)
        fragment = "***" if hidden else parts.fragment
        # (The scheme as written: urlsplit lower-cases it, and a message about a URL written
        # PostgreSQL:// must show it so.)
        shown = urlunsplit(SplitResult("", parts.netloc, parts.path, query, fragment))
        return f"{scheme}://{shown.removeprefix('//')}"
    except ValueError:
        return f"{scheme}://***"


def url_problem(url: str) -> str | None:
    """Why libpq would misread ``url``'s authority (None when it would not): an unencoded
    ``@`` in the user or the password. libpq ends the user's part at the first ``@`` and takes
    the rest of the password for the host, which its errors then quote."""
    authority = re.split(r"[/?#]", url.partition("://")[2], maxsplit=1)[0]
    if authority.count("@") > 1:
        return (
            "the user or password in the URL holds an unencoded '@': write it as %40 "
            "(percent-encode the password)"
        )
    # libpq refuses a query part without '=' and quotes it: a password's tail after a '&'.
    if any(part and "=" not in part for part in url.partition("?")[2].split("&")):
        return (
            "a part of the URL's query has no '=' (an unencoded '&' in a value, such as a "
            "password?): write '&' as %26 (percent-encode the password)"
        )
    return None


def check_url(url: str) -> None:
    """Raise StateError, naming the redacted URL, when libpq would misread it
    (:func:`url_problem`)."""
    problem = url_problem(url)
    if problem is not None:
        raise StateError(f"PostgreSQL state {redact_url(url)}: {problem}")


def _secrets_of(url: str) -> list[str]:
    """The password of ``url`` as written and decoded (to scrub it from driver messages)."""
    found: list[str] = []
    head = url.partition("://")[2].rpartition("@")[0]
    if ":" in head:
        found.append(head.partition(":")[2])
    with contextlib.suppress(ValueError):
        found += [v for k, v in parse_qsl(urlsplit(url).query) if k in SECRET_PARAMS]
    out: list[str] = []
    for secret in found:
        if secret:
            out += [secret, unquote(secret)]
    return sorted(set(out), key=len, reverse=True)


def scrub(message: str, url: str) -> str:
    """``message`` with the password of ``url`` (and any quoted token of the URL a parse
    error repeats) masked."""
    for secret in _secrets_of(url):
        message = message.replace(secret, "***")
    return message


@contextlib.contextmanager
def state_errors(url: str, doing: str, kind: type[StateError] = StateError) -> Iterator[None]:
    """Turn the driver's errors into :class:`StateError` (or ``kind``) naming the (redacted)
    database.

    LeaseLostError and other errors of the package pass through unchanged.
    """
    import psycopg
    import psycopg_pool

    try:
        yield
    except (psycopg.Error, psycopg_pool.PoolTimeout) as exc:
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        if kind is StateError and connection_lost(exc):
            kind = StateUnavailable  # (no fault of what was being written: see the class)
        # The driver's own error is not chained: libpq's messages may quote the URL.
        raise kind(f"PostgreSQL state {redact_url(url)}: {doing}: {scrub(reason, url)}") from None


#: SQLSTATEs of a session the server ended: an administrator (``pg_terminate_backend``, a
#: fast shutdown), a crash of another backend, a server starting or stopping.
_ENDED = frozenset({"57P01", "57P02", "57P03"})


def connection_lost(err: BaseException) -> bool:
    """Whether ``err`` is the loss of the connection (the server ended the session, or the
    connection broke: libpq's own errors carry no SQLSTATE), not an error of a statement."""
    import psycopg

    if not isinstance(err, psycopg.OperationalError):
        return False
    state = err.sqlstate
    return state is None or state.startswith("08") or state in _ENDED


def schema_version(conn: psycopg.Connection[tuple[object, ...]]) -> int:
    """The version of the schema in the database (0: none yet)."""
    row = conn.execute("SELECT to_regclass('schema_version') IS NOT NULL").fetchone()
    if row is None or not row[0]:
        return 0
    row = conn.execute("SELECT coalesce(max(version), 0) FROM schema_version").fetchone()
    return int(row[0]) if row else 0  # type: ignore[call-overload]


def migrate(conn: psycopg.Connection[tuple[object, ...]], *, target: int = SCHEMA_VERSION) -> int:
    """Bring the schema to ``target`` (the latest by default); returns the version found before.

    One transaction for every missing step, under an advisory lock: concurrent callers wait and
    then find the work done. Raises StateError when the database is newer than this code.
    """
    if not 0 <= target <= SCHEMA_VERSION:
        raise ValueError(f"no schema version {target}")
    begins = conn.info.transaction_status == 0  # (pq.TransactionStatus.IDLE: ours to begin)
    with conn.transaction():
        if begins:
            # The version is read after the lock's wait, not from a snapshot taken before it
            # (a database whose default isolation is repeatable read or serializable): else a
            # caller that waited for another's migration found none and made it again.
            conn.execute("SET TRANSACTION ISOLATION LEVEL READ COMMITTED")
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK,))
        found = schema_version(conn)
        if found > SCHEMA_VERSION:
            raise SchemaTooNewError(
                f"the PostgreSQL state has schema version {found}; this fashiontag knows up to "
                f"{SCHEMA_VERSION}: upgrade fashiontag"
            )
        if found >= target:
            # Current: nothing to write. A role granted only the tables' rows (no CREATE on
            # the schema, a DBA's least privilege) was refused the DDL below even so.
            return found
        conn.execute(_VERSION_TABLE)
        for step in MIGRATIONS:
            if found < step.version <= target:
                for statement in step.statements:
                    conn.execute(statement)
                conn.execute(
                    "INSERT INTO schema_version (version, description) VALUES (%s, %s)",
                    (step.version, step.description),
                )
    return found
