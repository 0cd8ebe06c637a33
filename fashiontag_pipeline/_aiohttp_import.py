"""aiohttp imported with its trust store deferred (:mod:`._tls`), whichever module imports it first.

The client's modules import aiohttp under :func:`._tls.deferred_trust_store`, and so did every
process while the package's root imported the client. The root now loads its names on first
use (so that the ``fashiontag`` command holds stop signals from its first line), and the first
import of aiohttp may come from anywhere: the reference service, the daemon, a program that
imports aiohttp itself after the package. :func:`install` puts a finder first on
``sys.meta_path`` that, for the first import of aiohttp only, runs aiohttp's own loader under
the deferral, then removes itself. It costs nothing until then (this module imports only
:mod:`sys`; :mod:`._tls` and :mod:`ssl` load with aiohttp).
"""

from __future__ import annotations

import sys

#: typing.TYPE_CHECKING without importing typing (a few ms before the first line of the CLI).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from types import ModuleType
    from typing import Any

__all__ = ["install"]


class _DeferredTrustFinder:
    """Finds nothing itself: for ``aiohttp`` it takes the spec the other finders give and
    runs its loader under the deferral (PEP 451: ``exec_module``)."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name != "aiohttp":
            return None
        if self in sys.meta_path:
            sys.meta_path.remove(self)  # once: aiohttp's submodules load as they would
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            spec = find(name, path, target) if find is not None else None
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        run = getattr(loader, "exec_module", None)
        if run is None:
            return spec

        def exec_module(module: ModuleType) -> None:
            from ._tls import deferred_trust_store

            with deferred_trust_store():
                run(module)

        loader.exec_module = exec_module  # this spec's loader only
        return spec


def install() -> None:
    """Defer aiohttp's trust store whoever imports aiohttp first (nothing when it is imported
    already, or the finder is in place)."""
    if "aiohttp" in sys.modules:
        return
    if not any(isinstance(finder, _DeferredTrustFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, _DeferredTrustFinder())
