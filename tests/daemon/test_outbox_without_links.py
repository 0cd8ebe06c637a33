"""Two daemons on an outbox whose filesystem refuses hard links (found by a review): the mark
must stay exclusive."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from fashiontag_pipeline.daemon import outbox as outbox_module
from fashiontag_pipeline.daemon.outbox import Outbox

from .test_outbox import claim_of


def test_two_daemons_without_hard_links_never_take_one_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """534364d: where ``link`` is refused, the mark is taken by "absent? then rename, then read
    back". Two daemons on a shared outbox, A and B (other contents, one STEM): A finds no
    mark; B finds none either, renames its mark in and reads it back (its own: the folder is
    B's); A then renames its own over B's and reads it back (its own: the folder is A's too).
    Two claims then write one results.jsonl. The O_EXCL create it replaced could not do so."""

    def no_links(src: object, dst: object) -> None:
        raise OSError(errno.EPERM, os.strerror(errno.EPERM))

    monkeypatch.setattr(outbox_module.os, "link", no_links)
    a, b = claim_of("cat.csv", b"a"), claim_of("cat.csv", b"b")
    real_read = Path.read_bytes
    got: dict[str, Path] = {}
    nested: list[bool] = []

    def read_bytes(self: Path) -> bytes:
        # A has found no mark and is about to put its own in: B comes in between.
        if self.name.startswith(".claim.") and not nested:
            nested.append(True)
            got["b"] = Outbox(tmp_path).outputs(b).folder
        return real_read(self)

    monkeypatch.setattr(Path, "read_bytes", read_bytes)
    got["a"] = Outbox(tmp_path).outputs(a).folder
    assert got["a"] != got["b"], f"both claims took {got['a'].name}"
