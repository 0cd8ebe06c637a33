"""Stop signals that arrive while the ``fashiontag`` command starts.

Before a command has its own handlers (``run``'s signal receiver, the daemon's drain), SIGTERM
killed the process where it stood (exit -15: systemd and cron read a crash) and Ctrl-C printed
a traceback from the middle of an import. From the console script's first line until a command
takes them over, SIGINT, SIGTERM and SIGHUP are only noted (:func:`hold_signals`):

- ``run`` and ``daemon`` take them over once their own handlers are in place
  (:func:`take`): a stop noted before then ends the command before it reads, claims or sends
  anything, with its documented exit code;
- every other command gives them back before it starts (:func:`release`): one noted
  meanwhile acts then as it would have (SIGINT: ``KeyboardInterrupt``; SIGHUP ends the
  process), except SIGTERM, which such a command takes as a Ctrl-C
  (:func:`interrupt_on_term`): "interrupted", exit 130, as its ``--help`` says.

The cyclic garbage collector waits while the command starts (:func:`defer_collections`): its
imports make ~100k objects that live as long as the process.

Imports only :mod:`signal` and :mod:`gc`: this module is loaded before anything heavy.
"""

from __future__ import annotations

import gc
import signal
from collections.abc import Callable
from types import FrameType

__all__ = [
    "HELD",
    "defer_collections",
    "hold_signals",
    "hold_to_exit",
    "interrupt_on_term",
    "release",
    "resume_collections",
    "take",
]

#: The signals held while the command starts.
HELD = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

#: Signal -> the disposition it had before it was held.
_before: dict[int, Callable[[int, FrameType | None], object] | int | None] = {}
#: The held signals that arrived, in order.
_noted: list[int] = []
#: [the console script held them at its start, they are held until the process exits]
_held_by = [False, False]


def _note(signum: int, frame: FrameType | None) -> None:
    _noted.append(signum)


_DEFAULTS = (signal.SIG_DFL, signal.default_int_handler)


def hold_signals() -> None:
    """Note SIGINT, SIGTERM and SIGHUP instead of acting on them, until :func:`take` or
    :func:`release`. A signal the process inherited as ignored (``nohup``) stays ignored."""
    for signum in HELD:
        current = signal.getsignal(signum)
        if current not in _DEFAULTS:
            continue
        try:
            signal.signal(signum, _note)
        except ValueError:  # not the main thread: nothing to hold
            return
        _before[signum] = current
        _held_by[0] = True


def hold_to_exit() -> None:
    """The command's work is over and its own handlers are gone (``run``'s receiver, closed
    with its event loop): a stop that comes now would change nothing but the exit code, so it
    is ignored until the process exits, when the console script held the signals at its
    start. Before, a SIGTERM there ended a complete run with -15 (a Ctrl-C: 130 or a
    traceback), its ``--summary`` not yet written. SIG_IGN, not a handler: the interpreter
    gives Python handlers their defaults back as it finalizes, and uvloop does from C as it
    closes, behind Python's back (its table still reads the handler)."""
    if not _held_by[0]:
        return
    _held_by[1] = True
    for signum in HELD:
        if signal.getsignal(signum) in (*_DEFAULTS, None, _note):
            signal.signal(signum, signal.SIG_IGN)


def take(*signums: int) -> list[int]:
    """The command's own handlers for ``signums`` are in place: those of them that arrived
    while it started, in order (none: empty). The other held signals are released."""
    arrived = [signum for signum in dict.fromkeys(_noted) if signum in signums]
    release(taken=signums)
    return arrived


def release(taken: tuple[int, ...] = ()) -> None:
    """Give back the signals' dispositions (those not replaced by the command's own
    handlers meanwhile); a noted signal not in ``taken`` acts now as it would have. None
    once they are held to the exit (:func:`hold_to_exit`)."""
    if _held_by[1]:
        return
    for signum, before in list(_before.items()):
        del _before[signum]
        if signal.getsignal(signum) is _note:
            signal.signal(signum, before)
    pending = [signum for signum in dict.fromkeys(_noted) if signum not in taken]
    _noted.clear()
    for signum in pending:
        signal.raise_signal(signum)


def interrupt_on_term() -> Callable[[], None]:
    """For a command without stop handlers of its own (``tag``, ``tasks``, ``reuse``, ``demo``):
    SIGTERM (a supervisor's stop, ``timeout``) acts as Ctrl-C does, through whatever handles
    SIGINT then (asyncio's cancels the command's task), so that the command ends saying it was
    interrupted, exit 130 as its ``--help`` says, not killed where it stood (-15, no word). Call
    it before :func:`release`: a SIGTERM noted while the command started is taken so too. One
    inherited as ignored stays ignored. Returns what gives SIGTERM its disposition back."""
    current = signal.getsignal(signal.SIGTERM)
    if current is not _note and current != signal.SIG_DFL:
        return lambda: None
    before = _before.get(signal.SIGTERM, current)

    def forward(signum: int, frame: FrameType | None) -> None:
        handler = signal.getsignal(signal.SIGINT)
        if callable(handler):
            handler(signal.SIGINT, frame)
        else:  # (SIGINT inherited as ignored: a shell's background job)
            raise KeyboardInterrupt

    try:
        signal.signal(signal.SIGTERM, forward)
    except ValueError:  # not the main thread
        return lambda: None

    def restore() -> None:
        if signal.getsignal(signal.SIGTERM) is forward:
            signal.signal(signal.SIGTERM, before)

    return restore


#: The collector was on when :func:`defer_collections` turned it off (False: not turned off).
_deferred = [False]


def defer_collections() -> None:
    """No cyclic garbage collection until :func:`resume_collections`, called before the
    command runs. The command's imports make ~100k objects (modules, classes, functions)
    that live as long as the process: the collector's ~100 passes over them with Python's
    thresholds, and its passes at the interpreter's exit, were ~8% of a 100-row run's
    instructions, for no garbage."""
    if gc.isenabled() and not _deferred[0]:
        gc.disable()
        _deferred[0] = True


def resume_collections() -> None:
    """If :func:`defer_collections` turned the collector off: what the start made is frozen
    (``gc.freeze``: never walked again, the way ``run`` froze it for its own life, and
    freed by reference counting as ever), and the collector is turned back on for the
    command's own objects."""
    if _deferred[0]:
        _deferred[0] = False
        gc.freeze()
        gc.enable()
