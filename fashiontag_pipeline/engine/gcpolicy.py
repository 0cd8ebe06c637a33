"""The cyclic garbage collector's setting during a run (see :func:`tune_gc`)."""

from __future__ import annotations

import gc
from collections.abc import Callable

__all__ = ["tune_gc"]

#: Young-generation threshold of the cyclic GC during a run (Python's default is 700).
GC_GEN0 = 50_000
_gc_users = 0
_gc_saved: tuple[int, int, int] | None = None
#: Whether the run froze the objects (not when its host had frozen some: see :func:`tune_gc`).
_gc_froze = False


def tune_gc() -> Callable[[], None]:
    """Make the cyclic GC cheap for the duration of a run; returns the function that undoes it.

    A run allocates a few container objects per row (row tuples, request structs), which
    triggers a young collection every 700 allocations and, every 100 of those, a full one that
    walks every object the interpreter holds (modules, classes: ~100k objects). Freezing what
    exists at start moves those out of the collector's sight, and a larger young threshold
    makes collections rare; reference counting still frees everything the run drops (the
    engine's objects form no cycles), so memory is unchanged. Nested or concurrent runs share
    one setting, restored when the last one ends.

    A host that froze objects itself (a pre-fork server, before it forks its workers) is left
    its freeze: ``gc.unfreeze()`` cannot tell its objects from the run's, and unfreezing them
    at the run's end had the next full collection write to each, copying every page the
    workers shared. Only the threshold is raised then; so too under the ``fashiontag``
    command, which froze what its start made before the command ran
    (:func:`fashiontag_pipeline.cli.startup.resume_collections`)."""
    global _gc_users, _gc_saved, _gc_froze
    if _gc_users == 0:
        _gc_saved = gc.get_threshold()
        _gc_froze = gc.get_freeze_count() == 0
        if _gc_froze:
            gc.freeze()
        gc.set_threshold(max(GC_GEN0, _gc_saved[0]), _gc_saved[1], _gc_saved[2])
    _gc_users += 1
    done = False

    def restore() -> None:
        global _gc_users, _gc_saved, _gc_froze
        nonlocal done
        if done:
            return
        done = True
        _gc_users -= 1
        if _gc_users == 0 and _gc_saved is not None:
            gc.set_threshold(*_gc_saved)
            if _gc_froze:
                gc.unfreeze()
            _gc_saved, _gc_froze = None, False

    return restore
