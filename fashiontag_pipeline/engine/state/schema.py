"""The state file's tables, positions and watermarks.

Schema::

    meta(key, value)           engine token, manifest fingerprints (``run``), task sequence,
                               engine-wide counters (``n_*``), next_source, completed_at,
                               id_space (ids sent as JOB/ID or as they are),
                               single_fails:POS (a pending routed row's failures counted
                               toward a poison image), single_tagged (the single endpoint
                               tagged an image of the run)
    jobs(job, key, name, sources, results, rejects, sink, state, validated, chunked,
         results_ckpt, rejects_ckpt, accepted, settled, submitted, tagged, failed, rejected,
         single, pages, tasks, completed_at, reused)
                               one row per job: a set of manifests whose outcomes go to one
                               pair of outputs (``run``: one job; the daemon: one per
                               manifest). ``key`` names it (the daemon: the claim), ``sources``
                               its source indexes and names (JSON), the watermarks and sink
                               checkpoints below are per job, and so are its counters
                               (``pages``: result pages that held its rows; ``tasks``: set
                               when it completes, from ``job_tasks``)
    job_tasks(job, task_id)    the tasks whose results held a job's rows (while it runs)
    tasks(task_id, seq, token, state, expires_at, results_expire_at, total, next_offset)
                               state: open | done | drained | expired | lost
                               (sealed: only in files of earlier versions)
                               (lost: the service forgot it; its chunks are settled by sending
                               their unwritten rows again, each chunk then ``resolved``)
    chunks(chunk_id, state, task_id, token, n, last_pos, body, n_ok, written_at, service_at)
                               state: pending (written ahead, fate unknown) | accepted |
                               orphan (fate unknown, task no longer writable) | resolved;
                               n_ok: rows of the chunk the service accepted (an orphan:
                               its rows counted as submitted so far, NULL for none); an
                               accepted chunk is deleted when its task is drained or expired;
                               written_at: wall-clock time (Unix seconds; a PostgreSQL
                               state's: the database's) the chunk was
                               written ahead, or its create last sent (a retry), after which
                               a create may have been on its way (NULL: unknown, in files of
                               earlier versions: a resume looks for its task the longest; 0:
                               a stop kept its create from being sent); service_at: the same
                               moment in the service's clock (its ``Date``, carried by the
                               writer's monotonic clock), which a resume judges the create's
                               age in (NULL: a row of an earlier version, judged by
                               written_at; -1: no ``Date`` seen yet; 0 with written_at 0)
    chunk_bodies(chunk_id, ids, body)
                               a chunk's rows ({"p": [positions], "r": [requests]}), written
                               once with the chunk and deleted when its task is drained; apart
                               from ``chunks`` so that state updates rewrite small rows only
                               (``chunks.body`` is only read, from older state files); ``ids``:
                               the ids it sends (a JSON list), so that the ids written to a task
                               are read without its bodies. It comes before ``body``: SQLite
                               reaches a column stored after a ~120 KB body only by walking the
                               body's overflow pages (a file of an older version gets it last,
                               by ALTER TABLE, and NULL in the chunks written before)
    ids(id, pos)               every id taken into the run, with the position of its first row
    ids_log(seq, batch)        (SQLite) ids taken in but not in ``ids`` yet: a JSON object
                               {id: pos} per intake batch whose ids did not sort after the
                               last of ``ids``; moved into it 100,000 at a time (:mod:`.idset`)
    id_runs(high, low, n, ids, positions)
                               (SQLite) ids taken in a batch to a row: an intake batch whose ids
                               all sorted after every id held, its ``n`` ids in order (a JSON
                               list, ``low`` the first, ``high`` the last: the key) and their
                               first rows' positions (int64, little-endian); runs never overlap,
                               and an id is in one of ``ids``, ``ids_log`` and ``id_runs`` only
                               (:mod:`.idruns`)
    singles(pos, state, body)  rows routed to the single endpoint (local files, data: URIs):
                               pending (body: the request) | done (outcome written, body NULL)

A row's *position* is ``source_index << 40 | line``, so positions order rows across manifests.
Two watermarks per job make resume exact (a job's sources are read one after the other, so its
positions only grow; jobs interleave freely):

* ``V`` (validated): every row at a position <= V has been validated, its id recorded and its
  client-side reject (if any) written; committed with the rejects and ids of each batch.
* ``W`` (chunked): every accepted row at a position <= W is in a chunk written ahead of its
  POST/PUT. Rows in ``(W, V]`` were validated but never chunked: a resume sends them again.

Rows routed to the single endpoint are never chunked, so W may pass them: each one is written
to ``singles`` (pending) in the transaction that moves V over it, and marked done in the
transaction that writes its outcome. A resume re-tags the pending ones and skips every routed
row at a position <= V (single tagging is idempotent, so a re-tag is harmless).

Two counters, per job and engine-wide, make the end of a job and of a run checkable
(:meth:`StateDB.reconcile`): ``accepted`` counts
the distinct ids taken into the run (in the transaction that records them), ``settled`` the
outcomes written for them (results lines, and rejects of accepted rows: refused by the
service, expired, single-mode failures), each in the transaction that writes it. A run is
complete only when the two are equal and no chunk, task or single row is still in flight; a job
whose manifests are read to the end is complete when its own two are equal. A row answered
from the result store (``--reuse``) is accepted and settled in one intake transaction (its
``"reused": true`` line written in it); see :mod:`.reuse_rows`.
"""

from __future__ import annotations

__all__ = [
    "BODY_SQL",
    "COUNTERS",
    "JOB_COUNTERS",
    "LONG_IDS_VERSION",
    "POS_SHIFT",
    "SCHEMA",
    "STATE_FILE_BASE",
    "STATE_FILE_VERSION",
    "TABLES",
    "position",
    "split_position",
]

POS_SHIFT = 40

#: The layout of a SQLite state file (``PRAGMA user_version``). Raised with any change an
#: older build would misread (it refuses the file: ``upgrade fashiontag``); a column added
#: with a default that older builds may leave unset does not need it. 0: a file of every build
#: before the version was kept (2026-11-26), this layout or one :class:`~.sqlite.StateDB`
#: migrates. 2: ids taken in may wait in ``ids_log`` before they reach ``ids``
#: (:mod:`.idset`); a build of version 1 would not see them, and take their rows' later
#: duplicates in. 3: the file holds the reject of an id too long to key (``rules.LONG_ID``),
#: which no store holds: a build of version 2 (before that limit) took the reject for another
#: run's line, or took the row in again and sent it. A file is marked 3 only with such a
#: reject's commit (:meth:`~.store.StateStore.long_ids_mark`), and back to
#: :data:`STATE_FILE_BASE` when its run completes: the others stay 2, which a build put back
#: after a bad deploy still reads. 4: the file holds ids in ``id_runs`` (:mod:`.idruns`),
#: which a build of version 3 would not see: marked with the commit that makes the first run,
#: kept by a long id's mark and by a completed run that still holds runs (a job left open),
#: and lowered when none remain (to 3 when the file may hold a long id's reject, to
#: :data:`STATE_FILE_BASE` once emptied: a completed run's ``reclaim``, a new run).
STATE_FILE_VERSION = 4
#: The version of a state file holding a long id's reject and no run.
LONG_IDS_VERSION = 3
#: The version of a state file holding neither (see :data:`STATE_FILE_VERSION`).
STATE_FILE_BASE = 2

COUNTERS = (
    "submitted",
    "tagged",
    "failed",
    "rejected",
    "tasks",
    "pages",
    "single",
    "accepted",
    "settled",
    "resent",
    "lost_tasks",
    "reused",
)

#: The counters kept per job as well as engine-wide.
JOB_COUNTERS = (
    "accepted",
    "settled",
    "submitted",
    "tagged",
    "failed",
    "rejected",
    "single",
    "pages",
    "tasks",
    "reused",
)

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS tasks (
    task_id TEXT PRIMARY KEY, seq INTEGER NOT NULL, token TEXT NOT NULL, state TEXT NOT NULL,
    expires_at REAL, results_expire_at REAL, total INTEGER NOT NULL DEFAULT 0,
    next_offset INTEGER NOT NULL DEFAULT 0);
CREATE TABLE IF NOT EXISTS chunks (
    chunk_id INTEGER PRIMARY KEY, state TEXT NOT NULL, task_id TEXT, token TEXT,
    n INTEGER NOT NULL, last_pos INTEGER NOT NULL, body BLOB);
CREATE INDEX IF NOT EXISTS chunks_task ON chunks (task_id);
CREATE TABLE IF NOT EXISTS chunk_bodies (
    chunk_id INTEGER PRIMARY KEY, ids BLOB, body BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS ids (id TEXT PRIMARY KEY, pos INTEGER NOT NULL) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS ids_log (seq INTEGER PRIMARY KEY, batch BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS id_runs (high TEXT PRIMARY KEY, low TEXT NOT NULL,
    n INTEGER NOT NULL, ids BLOB NOT NULL, positions BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS singles (pos INTEGER PRIMARY KEY, state TEXT NOT NULL, body BLOB);
CREATE TABLE IF NOT EXISTS jobs (
    job INTEGER PRIMARY KEY, key TEXT NOT NULL UNIQUE, name TEXT NOT NULL,
    sources TEXT NOT NULL, results TEXT NOT NULL, rejects TEXT NOT NULL,
    sink TEXT NOT NULL DEFAULT 'jsonl', state TEXT NOT NULL DEFAULT 'open',
    validated INTEGER NOT NULL DEFAULT -1, chunked INTEGER NOT NULL DEFAULT -1,
    results_ckpt INTEGER NOT NULL DEFAULT 0, rejects_ckpt INTEGER NOT NULL DEFAULT 0,
    accepted INTEGER NOT NULL DEFAULT 0, settled INTEGER NOT NULL DEFAULT 0,
    submitted INTEGER NOT NULL DEFAULT 0, tagged INTEGER NOT NULL DEFAULT 0,
    failed INTEGER NOT NULL DEFAULT 0, rejected INTEGER NOT NULL DEFAULT 0,
    single INTEGER NOT NULL DEFAULT 0, pages INTEGER NOT NULL DEFAULT 0,
    tasks INTEGER NOT NULL DEFAULT 0, completed_at TEXT,
    reused INTEGER NOT NULL DEFAULT 0, failure TEXT, rows_read INTEGER NOT NULL DEFAULT 0);
CREATE TABLE IF NOT EXISTS job_tasks (job INTEGER NOT NULL, task_id TEXT NOT NULL,
    PRIMARY KEY (job, task_id)) WITHOUT ROWID;
"""


def position(source: int, line: int) -> int:
    """The run-wide position of ``line`` of manifest number ``source``."""
    return (source << POS_SHIFT) | line


def split_position(pos: int) -> tuple[int, int]:
    """(source index, line) of a position."""
    return pos >> POS_SHIFT, pos & ((1 << POS_SHIFT) - 1)


#: A chunk's body in a ``SELECT ... FROM chunks``: its ``chunk_bodies`` row (``chunks.body`` in
#: state files written before bodies had their own table).
BODY_SQL = (
    "COALESCE((SELECT b.body FROM chunk_bodies b WHERE b.chunk_id = chunks.chunk_id), chunks.body)"
)

TABLES = ("tasks", "chunks", "chunk_bodies", "ids", "singles", "jobs", "job_tasks", "meta")
