"""``fashiontag run`` stopped (SIGTERM, Ctrl-C) while it fingerprints a large manifest, before
it reads a row: the SHA-256 of the file its reader has open, which a resume compares.

Found by a hunt: the stop waited for the whole hash, however long: a 2.2 GB manifest held a
SIGTERM sent 2.5 s into the run for 22 s (0 rows read, exit 130), so a manifest of tens of GB,
or one on a slow share, outlasted a supervisor's stop timeout (SIGKILL) and a Ctrl-C. The hash
now gives up between two blocks: "interrupted while starting", exit 130, nothing sent.

A slow share is made in the real process by a small bootstrap: the fingerprint reads 4 KiB
blocks, 200 ms each (the hash ~44 s; the stop may take up to 10 s on a loaded CI machine),
and says when it has begun.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import anyio

from fashiontag_pipeline.service import ServiceConfig, running_service

from ..slow_share import slow_hash
from .helpers import ENV, assert_exactly_once, run_args, write_csv

_BOOT = (
    "import os, sys\n"
    "sys.path.insert(0, os.getcwd())  # (as -m would: the package of the checkout under test)\n"
    + slow_hash("engine.manifests", "_READ", 0.2)
    + "\nfrom fashiontag_pipeline.cli import main\nraise SystemExit(main(sys.argv[1:]))\n"
)


async def test_a_stop_while_a_large_manifest_is_fingerprinted_ends_the_run_at_once(
    tmp_path: Path,
) -> None:
    n = 16_000  # ~900 KiB: ~220 blocks of 4 KiB, ~44 s of hashing
    manifest = write_csv(tmp_path / "m.csv", n)
    out = tmp_path / "out.jsonl"
    summary = tmp_path / "summary.json"
    boot = tmp_path / "boot.py"
    boot.write_text(_BOOT)
    begun = tmp_path / "hash-begun"
    async with running_service(ServiceConfig()) as svc:
        args = run_args(svc.url, out, str(manifest), "--summary", str(summary))
        at = args.index("-m")
        booted = [*args[:at], str(boot), *args[at + 2 :]]
        env = {**ENV, "FT_SLOW": str(begun)}
        err_path = tmp_path / "stderr"
        with err_path.open("wb") as err_file:
            proc = await anyio.open_process(booted, env=env, stderr=err_file)
        try:
            with anyio.fail_after(30):
                while not begun.exists():
                    assert proc.returncode is None
                    await anyio.sleep(0.01)
            proc.send_signal(signal.SIGTERM)
            signalled = time.monotonic()
            with anyio.fail_after(60):
                code = await proc.wait()
            took = time.monotonic() - signalled
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
            await proc.aclose()
        err = err_path.read_text()
        assert code == 130, err[-800:]
        assert took < 10.0, f"exited {took:.1f} s after SIGTERM: {err[-400:]}"
        assert "interrupted while starting" in err, err[-800:]
        assert svc.store.image_count == 0
        again = await anyio.run_process(args, check=False, env=ENV, stderr=subprocess.PIPE)
        assert again.returncode == 0, again.stderr.decode()[-800:]
        assert svc.store.image_count == n, "rows billed twice"
    assert_exactly_once(out, out.with_suffix(".rej"), {f"p{i}" for i in range(n)})
    assert os.path.exists(summary)
