"""A slow share, for tests that stop a process while it hashes a manifest."""

from __future__ import annotations

__all__ = ["slow_hash"]


def slow_hash(module: str, block: str, pause: float) -> str:
    """Python source for a test's bootstrap script (run before ``fashiontag_pipeline.cli.main``,
    ``os`` imported): while ``FT_SLOW`` names a file, the SHA-256 of ``module`` (a module of
    ``fashiontag_pipeline`` that imports ``hashlib``) reads blocks of 4 KiB (its attribute
    ``block``), ``pause`` seconds each, and touches that file at each block (the hash has
    begun). ``FT_SLOW`` unset: as it is."""
    package, _, name = module.rpartition(".")
    return f"""
if os.environ.get("FT_SLOW"):
    import hashlib, time
    from pathlib import Path

    from fashiontag_pipeline.{package} import {name}

    BEGUN = Path(os.environ["FT_SLOW"])

    class _SlowSha256:
        def __init__(self):
            self._digest = hashlib.sha256()

        def update(self, block):
            BEGUN.touch()
            time.sleep({pause!r})
            self._digest.update(block)

        def hexdigest(self):
            return self._digest.hexdigest()

    class _Hashlib:
        sha256 = _SlowSha256

    {name}.hashlib = _Hashlib
    {name}.{block} = 4096
"""
