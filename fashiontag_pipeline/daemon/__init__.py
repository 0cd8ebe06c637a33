"""The ingestion daemon's parts (``fashiontag daemon``): everything around the engine.

One module per piece, each usable and tested on its own (see each module's docstring).
"""

from __future__ import annotations

from .config import DaemonConfig, load_daemon_config
from .http import DaemonStatus, Health, ManifestProgress, MonitoringServer, StatusProvider
from .inbox import Claim, ClaimLedger, ClaimRecord, Inbox, MemoryClaimLedger, SQLiteClaimLedger
from .interface import IngestEngine, ManifestOutcome, ManifestRun
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
    "ManifestOutcome",
    "ManifestOutputs",
    "ManifestProgress",
    "ManifestRun",
    "ManifestSummary",
    "MemoryClaimLedger",
    "MonitoringServer",
    "Outbox",
    "SQLiteClaimLedger",
    "StatusProvider",
    "SystemdNotifier",
    "configure_logging",
    "load_daemon_config",
]
