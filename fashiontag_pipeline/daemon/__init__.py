"""The ingestion daemon's parts (``fashiontag daemon``): everything around the engine.

One module per piece, each usable and tested on its own:

* :mod:`.inbox`: which files in ``INBOX`` are manifests, when they are ready (``NAME.ready``
  or ``settle`` seconds unchanged, by polling), and the crash-safe claim (hash, record in the
  :class:`~.inbox.ClaimLedger`, rename to ``.work/``); ``done/`` and ``failed/`` afterwards.
* :mod:`.outbox`: ``OUTBOX/STEM/{results,rejects}.jsonl`` then ``summary.json`` by atomic
  rename; :class:`~.outbox.ManifestSummary` is its shape.
* :mod:`.metrics`: the Prometheus metrics of the contract, in their own registry.
* :mod:`.http`: ``/metrics``, ``/livez``, ``/readyz``, ``/status`` (aiohttp), with the
  :class:`~.http.Health` facts ``/readyz`` decides from; :mod:`.room` tells it whether a
  SQLite state file can be written (a full or read-only file system under an idle daemon).
* :mod:`.notify`: systemd ``READY=1`` / ``WATCHDOG=1`` / ``STOPPING=1`` (never blocks).
* :mod:`.logs`: JSON lines on stderr (text on a terminal), API keys redacted.
* :mod:`.config`: :class:`~.config.DaemonConfig`, the ``[daemon]`` table.
* :mod:`.ledger`: the claim ledger (memory, SQLite, PostgreSQL) and, in PostgreSQL, the manifest
  leases that let several daemons share one state (:class:`~.keeper.LeaseKeeper`).
* :mod:`.interface`: what the long-lived engine plugs into.

How the engine plugs in (:mod:`.interface`). For each claim, in arrival order and at most
``max_active`` at a time, the daemon calls ``await engine.open_manifest(claim, outputs)`` and
gets a ``ManifestRun``: ``run.progress()`` gives per-manifest counts for ``/status`` (rows
read, submitted, tagged, failed, rejected, pending), and ``await run.outcome()`` returns a
``ManifestOutcome`` once every row has its outcome written to ``outputs.results`` /
``outputs.rejects`` (``status="done"`` with the run summary's counts) or once the manifest
proves unreadable (``status="failed"`` with a reason). The daemon turns it into
``summary.json`` (``outcome.summary(outputs, finished_at=...)``), then moves the manifest to
``done/`` or ``failed/``. Duplicates (same sha256 as a completed manifest, found with
``ClaimLedger.find_completed``) never reach the engine. The engine reports rows, requests,
retries and its gauges into the shared :class:`~.metrics.DaemonMetrics`, and service
reachability and state-store health into :class:`~.http.Health`, in batches.
"""

from __future__ import annotations

from .config import DaemonConfig, load_daemon_config
from .http import DaemonStatus, Health, ManifestProgress, MonitoringServer, StatusProvider
from .inbox import Claim, Inbox
from .interface import IngestEngine, ManifestOutcome, ManifestRun
from .keeper import LeaseKeeper
from .leases import Lease, PostgresClaimLedger
from .ledger import ClaimLedger, ClaimRecord, MemoryClaimLedger, SQLiteClaimLedger
from .logs import configure_logging
from .metrics import DaemonMetrics
from .notify import SystemdNotifier
from .outbox import ManifestOutputs, ManifestSummary, Outbox

__all__ = [
    "Claim",
    "ClaimLedger",
    "ClaimRecord",
    "DaemonConfig",
    "DaemonMetrics",
    "DaemonStatus",
    "Health",
    "Inbox",
    "IngestEngine",
    "Lease",
    "LeaseKeeper",
    "ManifestOutcome",
    "ManifestOutputs",
    "ManifestProgress",
    "ManifestRun",
    "ManifestSummary",
    "MemoryClaimLedger",
    "MonitoringServer",
    "Outbox",
    "PostgresClaimLedger",
    "SQLiteClaimLedger",
    "StatusProvider",
    "SystemdNotifier",
    "configure_logging",
    "load_daemon_config",
]
