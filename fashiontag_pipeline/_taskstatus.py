"""Task states the spec does not name: which words of other services say done, or ended.

The spec names two task states (``TASK_PROCESSING``, ``TASK_DONE``); services name more, and
spell them their own way (``task_done``, ``COMPLETED``, ``TASK_FAILED``, ``CANCELLED``). A
status is reduced to its word (:func:`status_word`) and looked up here: done (results readable)
or ended (never done: its pages are read, then its rows without a result are sent again). Any
other word is taken as processing.
"""

from __future__ import annotations

__all__ = ["is_done_word", "is_ended_word", "status_word"]

#: ``taskStatus`` words (upper case, ``TASK_`` and separators dropped: ``task_done``,
#: ``Task-Done`` and ``DONE`` are one) that say a task is finished and its results readable.
_DONE_WORDS = frozenset({"DONE", "COMPLETE", "COMPLETED", "FINISHED", "SUCCEEDED"})
#: Words that say a task ended without being done: the service will never make it done.
_ENDED_WORDS = frozenset(
    {
        "FAILED",
        "FAILURE",
        "FAIL",
        "ERROR",
        "CANCELLED",
        "CANCELED",
        "ABORTED",
        "EXPIRED",
        "DELETED",
        "REJECTED",
        "STOPPED",
        "KILLED",
    }
)


def status_word(status: str) -> str:
    """A ``taskStatus`` reduced to its word: upper case, without a ``TASK_`` prefix and
    without separators (``task_done`` -> ``DONE``, ``TASK_PROCESSING`` -> ``PROCESSING``)."""
    word = status.strip().upper().replace("-", "_").replace(" ", "_")
    return word.removeprefix("TASK_").replace("_", "")


def is_done_word(status: str) -> bool:
    """True when ``status`` (not the spec's) says the task is done, its results readable."""
    return status_word(status) in _DONE_WORDS


def is_ended_word(status: str) -> bool:
    """True when ``status`` (not the spec's) says the task ended without its results."""
    return status_word(status) in _ENDED_WORDS
