"""A leased manifest's outputs: one pair of files per lease (epoch), published when settled.

Beside several daemons, each lease of a manifest (its epoch) writes files of its own, hidden
beside the final ones (``.results.e<epoch>.jsonl``). A daemon that takes a manifest over starts
its files with the committed prefix of the previous epoch's (as many bytes as the state counts
written), and the settled epoch's files are renamed over ``results.jsonl`` and
``rejects.jsonl``. A daemon that lost its lease can only ever write its own epoch's files,
which nobody reads.
"""

from __future__ import annotations

import contextlib
import logging
import os
from pathlib import Path

from .. import _exceptions as exc
from ._files import fsync_dir
from .outbox import CLAIM_FILE, ManifestOutputs, Outbox

__all__ = [
    "claim_state_url",
    "committed_file",
    "copy_prefix",
    "drop_empty_epoch",
    "drop_epoch_files",
    "epoch_outputs",
    "follow_recorded",
    "publish_outputs",
]

logger = logging.getLogger("fashiontag_pipeline.daemon")


def copy_prefix(src: Path, keep: int, dst: Path) -> None:
    """Write the first ``keep`` bytes of ``src`` (an earlier owner's output) to ``dst`` (this
    owner's, new). A source shorter than ``keep`` lost lines the state counts as written: a
    :class:`StateError`, never a silent gap."""
    with dst.open("wb") as out:
        left = keep
        if keep:
            try:
                src_fh = src.open("rb")
            except FileNotFoundError:
                src_fh = None
            if src_fh is not None:
                with src_fh:
                    while left > 0:
                        block = src_fh.read(min(left, 1 << 20))
                        if not block:
                            break
                        out.write(block)
                        left -= len(block)
        if left:
            raise exc.StateError(
                f"{src} holds {keep - left:,} bytes but the state counts {keep:,} written: "
                "committed lines are missing from it"
            )
        out.flush()
        os.fsync(out.fileno())


def committed_file(outputs: ManifestOutputs, recorded: str, final: Path) -> Path:
    """Where an earlier epoch's committed lines are, as this daemon sees them.

    The state records the file by the path its writer saw, and another machine may mount the
    shared outbox elsewhere: the file is looked up by its name in this claim's folder (which
    this daemon found by the claim's mark). An epoch that was settled far enough to publish
    its files (renamed over the final ones) before its daemon died has its lines in ``final``.
    """
    own = outputs.folder / Path(recorded).name
    if not own.exists() and final.exists():
        return final
    return own


def follow_recorded(outbox: Outbox, outputs: ManifestOutputs, recorded: str) -> None:
    """A manifest taken over from a daemon of the fleet started with another ``--outbox``:
    when this daemon sees the folder the state records (``recorded``: the earlier epoch's
    results file), marked as this claim's, and its committed lines are not in ``outputs``
    here, the manifest ends there, beside its rows (as one daemon restarted with another
    ``--outbox`` does); ``outputs`` is pointed there, the folder made here for it removed.
    The taker found none of the rows here: each attempt stopped, and the manifest went to
    ``failed/``, its committed rows hidden in the other outbox (dropped again: billed again).
    """
    folder = Outbox.folder_of(recorded)
    here = outputs.folder
    if folder == here or (here / Path(recorded).name).exists() or outputs.results.exists():
        return  # (the same folder, or the share mounted elsewhere: found by name here)
    if not folder.is_dir() or outbox.outputs(outputs.claim, folder).folder != folder:
        return
    with contextlib.suppress(OSError):
        if os.listdir(here) == [CLAIM_FILE]:  # (made for it now: nothing but the mark)
            (here / CLAIM_FILE).unlink()
            here.rmdir()
    outputs.folder = folder
    logger.warning(
        "manifest taken over into its folder in another outbox (the daemon that began it has"
        " another --outbox): it ends there",
        extra={"manifest": outputs.claim.name, "folder": str(folder)},
    )


def epoch_outputs(outputs: ManifestOutputs, epoch: int) -> tuple[Path, Path]:
    """The files one lease (epoch) writes: hidden beside the final ones, renamed over them
    when the manifest is settled. A daemon that lost its lease only ever writes its own."""
    folder = outputs.folder
    return folder / f".results.e{epoch}.jsonl", folder / f".rejects.e{epoch}.jsonl"


def publish_outputs(outputs: ManifestOutputs, epoch: int) -> None:
    """The settled epoch's files become ``results.jsonl`` and ``rejects.jsonl``; earlier
    epochs' files are deleted."""
    results, rejects = epoch_outputs(outputs, epoch)
    for src, dst in ((results, outputs.results), (rejects, outputs.rejects)):
        if src.exists():
            os.replace(src, dst)
    drop_epoch_files(outputs)


def drop_epoch_files(outputs: ManifestOutputs) -> None:
    """Every epoch's files deleted: those left once published, or by the leases of a claim
    that ends a duplicate (a dead daemon's partial outputs, never published)."""
    for stale in outputs.folder.glob(".re*.e*.jsonl"):
        with contextlib.suppress(FileNotFoundError):
            stale.unlink()
    fsync_dir(outputs.folder)


def drop_empty_epoch(outputs: ManifestOutputs, epoch: int) -> None:
    """A lost lease's own files deleted when they are empty (its engine stopped). Paused past
    its lease before its first line, a daemon woke after the daemon that took the manifest
    over had finished it (and deleted every epoch's files): at its next poll it made its empty
    files again (as outputs a cleanup of empty files removed), and left them in the finished
    folder. Lines in them are left: the state may count them (the taker's prefix)."""
    for path in epoch_outputs(outputs, epoch):
        with contextlib.suppress(OSError):
            if path.stat().st_size == 0:
                path.unlink()


def claim_state_url(url: str, claim_id: int) -> str:
    """The state of a claim in the database: ``#claim_<id>``."""
    return f"{url.partition('#')[0]}#claim_{claim_id}"
