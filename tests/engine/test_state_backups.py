"""A state file copied back from a backup beside newer outputs (a restore after a disk fault;
a state per weekday, ``--state state-$(date +%a)``, beside one results file)."""

from __future__ import annotations

import shutil
from pathlib import Path

from fashiontag_pipeline.engine import EngineConfig, run_pipeline
from fashiontag_pipeline.service import ServiceConfig, running_service

from .helpers import client_config

FAST = EngineConfig(poll_min=0.02, poll_max=0.2, linger_seconds=0.2)


def _dump(path: Path, urls: dict[str, str]) -> None:
    path.write_text("id,url\n" + "".join(f"{i},{u}\n" for i, u in urls.items()))


async def test_a_complete_state_from_a_backup_never_takes_another_nights_results_for_its_own(
    tmp_path: Path,
) -> None:
    """Monday's dump is tagged and its state backed up; Tuesday's (a URL changed, a row gone,
    two rows new) is tagged into the same results file; Monday's state comes back from the
    backup and Wednesday's dump is Monday's again, byte for byte. The state found its run
    complete and said "nothing to do", exit 0, not a word more: the results file held
    Tuesday's lines (p1 tagged for Tuesday's image, p2 missing, n1 and n2 not in the dump). It
    says now that the results file was written by another run since, and to pass --restart."""
    monday = {f"p{i}": f"https://img.example/{i}.jpg" for i in range(200)}
    tuesday = {**monday, "p1": "https://img.example/1-new.jpg", "n1": "https://img.example/n1.jpg"}
    tuesday["n2"] = "https://img.example/n2.jpg"
    del tuesday["p2"]
    dump, out, rej = tmp_path / "dump.csv", tmp_path / "out.jsonl", tmp_path / "rej.jsonl"
    state, backup = tmp_path / "s.state", tmp_path / "backup"
    async with running_service(ServiceConfig()) as svc:

        async def night(urls: dict[str, str]) -> str:
            _dump(dump, urls)
            summary = await run_pipeline(
                [dump],
                client=client_config(svc.url),
                out=out,
                rejects=rej,
                state=state,
                engine=FAST,
            )
            assert summary.complete
            return summary.note

        await night(monday)
        backup.mkdir()
        for f in tmp_path.glob("s.state*"):
            shutil.copy(f, backup / f.name)
        await night(tuesday)
        for f in tmp_path.glob("s.state*"):
            f.unlink()
        for f in backup.iterdir():
            shutil.copy(f, tmp_path / f.name)
        note = await night(monday)
    assert "nothing to do" in note
    assert f"its results file {out}" in note and "another run" in note, note
    assert "--restart" in note
