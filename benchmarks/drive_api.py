"""Drive the engine through its Python API, in a process of its own so its CPU is measured alone.

    python -m benchmarks.drive_api MANIFEST --base-url URL --out F --rejects F --state F
        [--summary F.json] [--engine-json '{"field": value}']

``--engine-json`` holds :class:`~fashiontag_pipeline.engine.EngineConfig` fields.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path
from typing import Any


def _config(cls: Any, fields: dict[str, Any]) -> Any:
    try:
        import msgspec

        if isinstance(cls, type) and issubclass(cls, msgspec.Struct):
            return msgspec.convert(fields, cls)
    except ImportError:  # pragma: no cover - msgspec is a dependency of the package
        pass
    return cls(**fields)


def _plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    try:
        import msgspec

        return msgspec.to_builtins(value, enc_hook=str)
    except (ImportError, TypeError):
        return {k: getattr(value, k) for k in dir(value) if not k.startswith("_")}


async def _main(args: argparse.Namespace) -> dict[str, Any]:
    from fashiontag_pipeline import ClientConfig, Secret
    from fashiontag_pipeline._config import DEV_API_KEY, DEV_BULK_API_KEY
    from fashiontag_pipeline.engine import EngineConfig, run_pipeline

    client = ClientConfig(
        base_url=args.base_url,
        api_key=Secret(DEV_API_KEY),
        bulk_api_key=Secret(DEV_BULK_API_KEY),
    )
    engine = _config(EngineConfig, json.loads(args.engine_json))
    summary = await run_pipeline(
        [Path(m) for m in args.manifest],
        client=client,
        out=Path(args.out),
        rejects=Path(args.rejects),
        state=Path(args.state),
        engine=engine,
        progress=False,
    )
    result: dict[str, Any] = _plain(summary)
    return result


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.drive_api")
    parser.add_argument("manifest", nargs="+")
    parser.add_argument("--base-url", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--rejects", required=True)
    parser.add_argument("--state", required=True)
    parser.add_argument("--summary")
    parser.add_argument("--engine-json", default="{}")
    parser.add_argument("--no-uvloop", action="store_true")
    args = parser.parse_args()

    import anyio

    options: dict[str, Any] = {}
    if not args.no_uvloop:
        try:
            import uvloop  # noqa: F401

            options = {"use_uvloop": True}
        except ImportError:
            pass
    summary = anyio.run(_main, args, backend_options=options)
    text = json.dumps(summary, default=str)
    if args.summary:
        Path(args.summary).write_text(text)
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
