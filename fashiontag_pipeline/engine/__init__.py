"""The bulk engine: manifests -> tagging service bulk API -> sinks, exactly once, resumable.

Python API (the CLI ``fashiontag run`` and the benchmark harness use it)::

    from fashiontag_pipeline.engine import EngineConfig, run_pipeline

    summary = await run_pipeline(
        ["catalogue.csv.gz"],
        client=ClientConfig(base_url="http://127.0.0.1:8080"),
        out=Path("results.jsonl"),
        rejects=Path("rejects.jsonl"),
        engine=EngineConfig(rotate_images=20_000),
    )

One module per stage: :mod:`.source`, :mod:`.validate`, :mod:`.batcher`, :mod:`.tracker`,
:mod:`.pagers`, :mod:`.sinks`, :mod:`.state`; :mod:`.run` wires them in one task group.
"""

from __future__ import annotations

from .config import EngineConfig, RunSummary
from .flow import FatalRunError
from .run import RunControl, default_state_path, run_pipeline

__all__ = [
    "EngineConfig",
    "FatalRunError",
    "RunControl",
    "RunSummary",
    "default_state_path",
    "run_pipeline",
]
