"""The ``fashiontag`` command line (the top layer: it may use every half; none uses it)."""

from __future__ import annotations

from .main import main

__all__ = ["main"]
