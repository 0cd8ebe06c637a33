"""``fashiontag demo``: the whole pipeline on one machine, from nothing.

Generates a small catalogue of product images with Pillow (garment-like shapes in real
colours), serves them from a loopback HTTP server, starts the reference service in-process
with fetching on (colours are measured from the real pixels), runs the engine over a manifest
of those URLs, and prints the summary, a few tagged results and where the files are.

The files are kept: in ``workdir`` when given, else in a new ``fashiontag-demo-*`` folder
under the system temp dir, whose path is printed at the end.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import random
import sys
import tempfile
from pathlib import Path

import anyio
from aiohttp import web
from PIL import Image, ImageDraw

from .._config import DEV_API_KEY, DEV_BULK_API_KEY, ClientConfig, Secret
from .._exceptions import FashiontagError
from ..engine import EngineConfig, run_pipeline
from ..service import ServiceConfig, running_service
from .common import EXIT_ERROR, EXIT_USAGE, run_async
from .streams import write_stdout
from .summary_file import format_summary

__all__ = ["add_demo_arguments", "demo_command", "make_catalogue", "run_demo"]

_COLOURS = [
    (200, 30, 40),
    (20, 40, 140),
    (240, 240, 235),
    (20, 20, 20),
    (60, 120, 60),
    (230, 200, 60),
    (150, 90, 50),
    (240, 150, 180),
]
_SHAPES = ("tshirt", "trousers", "dress", "shoe", "bag")


def _draw(kind: str, colour: tuple[int, int, int], rnd: random.Random) -> bytes:
    img = Image.new("RGB", (320, 400), (245, 245, 245))
    d = ImageDraw.Draw(img)
    if kind == "tshirt":
        d.polygon(
            [
                (90, 80),
                (230, 80),
                (290, 140),
                (250, 170),
                (240, 340),
                (80, 340),
                (70, 170),
                (30, 140),
            ],
            fill=colour,
        )
    elif kind == "trousers":
        d.polygon(
            [(100, 60), (220, 60), (240, 360), (180, 360), (160, 160), (140, 360), (80, 360)],
            fill=colour,
        )
    elif kind == "dress":
        d.polygon(
            [(130, 50), (190, 50), (210, 150), (270, 370), (50, 370), (110, 150)], fill=colour
        )
    elif kind == "shoe":
        d.ellipse((50, 230, 280, 320), fill=colour)
        d.rectangle((60, 180, 150, 280), fill=colour)
    else:
        d.rectangle((80, 150, 240, 330), fill=colour)
        d.arc((110, 80, 210, 200), 180, 360, fill=colour, width=12)
    if rnd.random() < 0.5:  # a print on some garments
        accent = rnd.choice(_COLOURS)
        for x in range(100, 220, 30):
            d.ellipse((x, 200, x + 12, 212), fill=accent)
    buf = io.BytesIO()
    img.save(buf, "JPEG", quality=85)
    return buf.getvalue()


def make_catalogue(folder: Path, images: int, seed: int = 1) -> list[tuple[str, str, str]]:
    """Write ``images`` JPEGs into ``folder``; (id, file name, kind) per image."""
    rnd = random.Random(seed)
    folder.mkdir(parents=True, exist_ok=True)
    rows = []
    for i in range(images):
        kind = _SHAPES[i % len(_SHAPES)]
        name = f"sku{i:05d}.jpg"
        (folder / name).write_bytes(_draw(kind, rnd.choice(_COLOURS), rnd))
        rows.append((f"SKU-{i:05d}", name, kind))
    return rows


#: What the demo writes in its folder: the names a first ``fashiontag run catalogue.csv`` gives
#: its files too. A folder holding one of them that the demo did not make (no MARKER) is the
#: user's, and is refused: the demo would replace the manifest and delete the outcomes.
_WRITES = ("catalogue.csv", "results.jsonl", "rejects.jsonl", "results.jsonl.state", "images")
MARKER = ".fashiontag-demo"


def prepare_workdir(root: Path) -> str | None:
    """Make ``--workdir`` the demo's folder (marked as such); why it cannot be, or None."""
    if os.path.lexists(root) and not root.is_dir():
        return f"--workdir {root} is not a folder: give a new or empty folder"
    if root.is_dir() and not (root / MARKER).exists():
        taken = [name for name in _WRITES if os.path.lexists(root / name)]
        if taken:
            return (
                f"--workdir {root} holds {', '.join(taken)}, which the demo would overwrite:"
                " give a new or empty folder"
            )
    try:
        root.mkdir(parents=True, exist_ok=True)
        (root / MARKER).touch()
    except OSError as err:
        return f"--workdir {root}: cannot make the folder ({err.strerror or err})"
    return None


async def run_demo(*, images: int = 200, workdir: Path | None = None) -> int:
    """The demo; returns an exit code."""

    if workdir is not None:
        root = Path(workdir)
        problem = await anyio.to_thread.run_sync(prepare_workdir, root)
        if problem is not None:
            print(f"fashiontag: {problem}", file=sys.stderr)
            return EXIT_USAGE
    else:
        root = Path(await anyio.to_thread.run_sync(tempfile.mkdtemp, "", "fashiontag-demo-"))
    catalogue = root / "images"
    print(f"generating {images} product images in {catalogue} ...", file=sys.stderr)
    rows = await anyio.to_thread.run_sync(make_catalogue, catalogue, images)

    app = web.Application()
    app.router.add_static("/img/", catalogue)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        manifest = root / "catalogue.csv"
        detection = {"shoe": "SHOES", "bag": "BAG"}
        manifest.write_text(
            "id,url,brand,detection\n"
            + "".join(
                f"{ident},http://127.0.0.1:{port}/img/{name},demo,"
                f"{detection.get(kind, 'TOP|BOTTOM|WHOLEBODY')}\n"
                for ident, name, kind in rows
            )
        )
        out, rejects = root / "results.jsonl", root / "rejects.jsonl"
        for stale in (out, rejects, root / "results.jsonl.state"):
            stale.unlink(missing_ok=True)
        async with running_service(ServiceConfig(fetch=True, fetch_allow_private=True)) as svc:
            print(f"reference service on {svc.url} (fetching images)", file=sys.stderr)
            summary = await run_pipeline(
                [manifest],
                client=ClientConfig(
                    base_url=svc.url,
                    api_key=Secret(DEV_API_KEY),
                    bulk_api_key=Secret(DEV_BULK_API_KEY),
                ),
                out=out,
                rejects=rejects,
                engine=EngineConfig(rotate_images=100, poll_min=0.05, poll_max=0.5),
                progress=sys.stderr.isatty(),
            )
    finally:
        await runner.cleanup()
    said = [format_summary(summary), "\na few tagged results:"]
    shown = 0
    with out.open() as fh:
        for line in fh:
            if shown == 3:
                break
            record = json.loads(line)
            result = record["taggingResult"]
            tags = [
                {
                    "category": (t.get("category") or {}).get("name"),
                    "item": (t.get("item") or {}).get("name"),
                    "colors": [c["name"] for c in t.get("colors", [])],
                }
                for obj in (result.get("data") or {}).get("objects", [])
                for t in obj.get("tags", [])
            ]
            if tags:
                shown += 1
                said.append(f"  {record['id']}: {result['status']} {json.dumps(tags)[:200]}")
    said.append(
        f"\nfiles kept in {root}:\n"
        f"  {out.name} (results), {rejects.name} (rejects), {manifest.name} (manifest), "
        f"{catalogue.name}/ (the generated images)\n"
        + ("  (remove the folder when done, or pass --workdir DIR)" if workdir is None else "")
    )
    # (a full disk or a closed reader: one line from demo_command, no traceback)
    write_stdout("\n".join(said) + "\n")
    return 0 if summary.complete else 1


#: The demo writes each image as a file: a catalogue past this is no demo (``benchmarks/``).
MAX_DEMO_IMAGES = 10_000


def _catalogue_size(text: str) -> int:
    """An argparse type: at least one image (a bad value is exit 2 with usage)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if not 1 <= value <= MAX_DEMO_IMAGES:
        raise argparse.ArgumentTypeError(
            f"must be from 1 to {MAX_DEMO_IMAGES:,} (each is a file of ~8 KB), got {value}"
        )
    return value


def add_demo_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of ``fashiontag demo``."""
    parser.add_argument(
        "--images",
        type=_catalogue_size,
        default=200,
        help="catalogue size, at most 10,000 (default 200)",
    )
    parser.add_argument(
        "--workdir",
        type=Path,
        help="where the images, manifest, results and state go (default: a new folder under "
        "the system temp dir, kept after the demo and named at the end)",
    )


def demo_command(args: argparse.Namespace) -> int:
    """``fashiontag demo``: the whole pipeline on a generated catalogue."""
    try:
        return run_async(lambda: run_demo(images=args.images, workdir=args.workdir))
    except FashiontagError as err:
        print(f"fashiontag: {' '.join(str(err).split())}", file=sys.stderr)
        return EXIT_ERROR
