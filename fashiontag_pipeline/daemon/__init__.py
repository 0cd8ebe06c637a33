"""The ingestion daemon's parts (``fashiontag daemon``): everything around the engine.

One module per piece, each usable and tested on its own (see each module's docstring).
"""

from __future__ import annotations

from .config import DaemonConfig, load_daemon_config
from .inbox import Claim, ClaimLedger, ClaimRecord, Inbox, MemoryClaimLedger, SQLiteClaimLedger

__all__ = [
    "Claim",
    "ClaimLedger",
    "ClaimRecord",
    "DaemonConfig",
    "Inbox",
    "MemoryClaimLedger",
    "SQLiteClaimLedger",
    "load_daemon_config",
]
