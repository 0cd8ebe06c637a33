"""The reference tagging service (``fashiontag serve``): the whole interface spec on aiohttp.web.

Start it in-process::

    async with running_service(ServiceConfig(rate=0.0), port=0) as svc:
        ...  # talk to svc.url with TaggerClient

or inside an anyio task group: ``url = await tg.start(run_service, config, "127.0.0.1", 0)``.
The analyzer is a reference, not a fashion model: see :mod:`.analyzer`.
"""

from __future__ import annotations

from .analyzer import Analysis, Analyzer, ImageRejected, ReferenceAnalyzer
from .app import RunningService, ServiceConfig, create_app, run_service, running_service
from .faults import FaultSpec
from .taxonomy import Taxonomy, load_taxonomy, parse_accept_language

__all__ = [
    "Analysis",
    "Analyzer",
    "FaultSpec",
    "ImageRejected",
    "ReferenceAnalyzer",
    "RunningService",
    "ServiceConfig",
    "Taxonomy",
    "create_app",
    "load_taxonomy",
    "parse_accept_language",
    "run_service",
    "running_service",
]
