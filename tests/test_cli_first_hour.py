"""A new user's first hour: the service's address as it is first written (the endpoint's URL
copied from the spec, a value kept in quotes by an env file), answered with the fix."""

from __future__ import annotations

import gzip
import os
import re
import subprocess
import sys
from pathlib import Path

import anyio
import pytest

from fashiontag_pipeline.service import ServiceConfig, running_service

from .engine.helpers import dead_port

ENV = {k: v for k, v in os.environ.items() if not k.startswith("FASHIONTAG_")}


async def fashiontag(*args: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    result = await anyio.run_process(
        [sys.executable, "-m", "fashiontag_pipeline", *args], check=False, env=env or ENV
    )
    return result.returncode, result.stderr.decode()


def last_line(stderr: str) -> str:
    assert "Traceback" not in stderr, stderr[-2000:]
    lines = [line for line in stderr.splitlines() if line.startswith("fashiontag: ")]
    assert lines, stderr[-1000:]
    return lines[-1]


@pytest.mark.parametrize("suffix", ["/tagger/v2.12/bulk", "/tagger/v2.12/", "/tagger/v2/tags"])
async def test_a_base_url_ending_in_the_apis_own_path_names_the_base_url_to_give(
    tmp_path: Path, suffix: str
) -> None:
    """The endpoint's URL copied from the spec as the base URL (``.../tagger/v2.12/bulk``):
    every request went to ``/tagger/v2.12/bulk/tagger/v2.12/bulk``, a 404 whose line asked only
    "is the base URL right?". It says now that the client adds that path itself, and which
    base URL to give; for ``run``, ``tag`` and ``tasks`` alike."""
    manifest = tmp_path / "m.csv"
    manifest.write_text("id,url\na,https://img.example/a.jpg\n")
    async with running_service(ServiceConfig()) as svc:
        base = svc.url + suffix
        commands = [
            ("run", str(manifest), "--out", str(tmp_path / "r.jsonl"), "--no-progress"),
            ("tag", "https://img.example/a.jpg", "--give-up-after", "0"),
            ("tasks", "list", "--give-up-after", "0"),
        ]
        for command in commands:
            code, err = await fashiontag(*command, "--base-url", base)
            assert code == 1, (command, err)
            line = last_line(err)
            assert "the client adds" in line and f"give {svc.url} " in line + " ", (command, line)


async def test_a_base_url_in_quotes_says_to_remove_them(tmp_path: Path) -> None:
    """``FASHIONTAG_BASE_URL="http://..."`` in a Docker ``--env-file`` keeps its quotes: the
    line said only that the URL must start with http://, the value shown in other quotes. It
    says now that the value starts and ends with a quote, to be removed (as for a key)."""
    for quoted in ('"http://127.0.0.1:8080"', "'https://tagger.example/'"):
        code, err = await fashiontag("tasks", "list", env={**ENV, "FASHIONTAG_BASE_URL": quoted})
        assert code == 2, err
        line = last_line(err)
        assert "starts and ends with a quote" in line and "FASHIONTAG_BASE_URL" in line, line


async def test_a_manifest_given_to_tag_says_to_run_it(tmp_path: Path) -> None:
    """``fashiontag tag catalogue.csv`` (``tag`` taken for ``run``): the manifest's bytes were
    sent as one image (a request the service may bill) and the answer was a failure to decode
    it, exit 1. A file that is no image and reads as a manifest (a CSV naming a url column,
    JSONL, a URL list, gzip) is refused now, exit 2, nothing sent, naming ``fashiontag run``."""
    csv_file = tmp_path / "catalogue.csv"
    csv_file.write_bytes(b"\xef\xbb\xbfID,URL\r\nsku-1,https://img.example/1.jpg\r\n")
    jsonl = tmp_path / "catalogue.jsonl"
    jsonl.write_text('{"id": "sku-1", "url": "https://img.example/1.jpg"}\n')
    urls = tmp_path / "urls.txt"
    urls.write_text("https://img.example/1.jpg\nhttps://img.example/2.jpg\n")
    gz = tmp_path / "dump.csv.gz"
    gz.write_bytes(gzip.compress(csv_file.read_bytes()))
    for manifest in (csv_file, jsonl, urls, gz):
        # (a port nobody listens on: a request sent would be exit 1, cannot connect)
        code, err = await fashiontag(
            "tag",
            str(manifest),
            "--base-url",
            f"http://127.0.0.1:{dead_port()}",
            "--give-up-after",
            "0",
        )
        assert code == 2, (manifest.name, err)
        line = last_line(err)
        assert f"fashiontag run {manifest}" in line and "not an image" in line, line


@pytest.mark.parametrize(
    ("command", "typo", "meant"),
    [
        (("run", "m.csv", "--out", "r.jsonl"), "--rejets", "--rejects"),
        (("tasks", "list"), "--jsn", "--json"),
        (("reuse", "stats", "store.db"), "--jsonn", "--json"),
        (("daemon", "--inbox", "in", "--outbox", "out"), "--setle", "--settle"),
    ],
)
async def test_a_misspelt_flag_is_named_by_its_command_with_the_flag_meant(
    tmp_path: Path, command: tuple[str, ...], typo: str, meant: str
) -> None:
    """``fashiontag run m.csv --rejets r.jsonl``: exit 2 under the usage of ``fashiontag``
    itself (``[-h] [-v] COMMAND ...``, as if the command were wrong), nothing on the flag
    meant. It is the command's usage and line now, naming the flag meant."""
    result = await anyio.run_process(
        [sys.executable, "-m", "fashiontag_pipeline", *command, typo, "x"],
        check=False,
        env=ENV,
        cwd=tmp_path,
    )
    err = result.stderr.decode()
    assert result.returncode == 2, err
    assert "Traceback" not in err and "COMMAND ..." not in err, err
    prog = "fashiontag " + " ".join(
        command[:2] if command[0] in ("tasks", "reuse") else command[:1]
    )
    line = err.splitlines()[-1]
    assert line.startswith(f"{prog}: error: unrecognized arguments: {typo}"), line
    assert f"did you mean {meant}?" in line, line


def _flags(text: str) -> set[str]:
    """The long flags ``text`` names (``--no-fetch`` is ``--fetch``'s other half)."""
    return {f.replace("--no-", "--") for f in re.findall(r"--[a-z][a-z-]*", text)} - {"--help"}


def _help_flags(*command: str) -> set[str]:
    result = subprocess.run(
        [sys.executable, "-m", "fashiontag_pipeline", *command, "--help"],
        capture_output=True,
        text=True,
        check=True,
        env=ENV,
    )
    options = result.stdout.split("options:", 1)[1].split("\n\n", 1)[0]
    return _flags(options) - {"--verbose"}


def test_the_readmes_commands_name_every_flag_each_command_takes() -> None:
    """The README's list of commands is where a new user looks for a flag: `tag` took
    `--base-url`, `--config` and the keys of the other commands, none of them listed there."""
    readme = (Path(__file__).parent.parent / "README.md").read_text()
    block = readme.split("## Commands\n", 1)[1].split("```", 2)[1]
    synopsis: dict[str, str] = {}
    name = ""
    for line in block.strip().splitlines():
        if line.startswith("fashiontag "):
            name = line.split()[1]
        synopsis[name] = synopsis.get(name, "") + line
    for name in ("serve", "run", "tag", "demo"):
        missing = _help_flags(name) - _flags(synopsis[name])
        assert not missing, (name, sorted(missing))
    for action in ("list", "status", "results"):
        missing = _help_flags("tasks", action) - _flags(synopsis["tasks"])
        assert not missing, ("tasks", action, sorted(missing))
    for action in ("stats", "prune"):
        missing = _help_flags("reuse", action) - _flags(synopsis["reuse"])
        assert not missing, ("reuse", action, sorted(missing))
    # (the daemon's line ends: "the client and engine options of run")
    missing = _help_flags("daemon") - _flags(synopsis["daemon"]) - _help_flags("run")
    assert not missing, ("daemon", sorted(missing))


async def test_a_config_file_saved_as_utf16_is_said_to_be(tmp_path: Path) -> None:
    """A config file Notepad saved as "Unicode" (UTF-16, its byte order mark first): exit 2
    said "byte 0xff at offset 0, as a Latin-1 editor writes an accent", a cause the user had
    not met. The line names UTF-16 now, with the fix."""
    config = tmp_path / "fashiontag.toml"
    config.write_text("[engine]\nrotate_images = 5000\n", encoding="utf-16")
    code, err = await fashiontag("tasks", "list", "--config", str(config))
    assert code == 2, err
    line = last_line(err)
    assert "a UTF-16 file" in line and "save it as UTF-8" in line, line


@pytest.mark.parametrize(
    ("flag", "url"),
    [
        ("--out", "s3://bucket/nightly/results.jsonl"),
        ("--rejects", "gs://bucket/rejects.jsonl"),
        ("--summary", "s3://bucket/summary.json"),
    ],
)
async def test_an_output_given_as_an_object_store_url_is_refused(
    tmp_path: Path, flag: str, url: str
) -> None:
    """``--out s3://bucket/nightly/results.jsonl`` (object storage is not written): the run
    wrote a local folder ``s3:/bucket/...`` under the current one and ended exit 0, a cron job
    reporting results uploaded that never left the machine. Exit 2 now, nothing sent, saying
    outputs are local files."""
    manifest = tmp_path / "m.csv"
    manifest.write_text("id,url\na,https://img.example/a.jpg\n")
    async with running_service(ServiceConfig()) as svc:
        args = ["run", str(manifest), "--base-url", svc.url, "--no-progress"]
        if flag != "--out":
            args += ["--out", str(tmp_path / "r.jsonl")]
        result = await anyio.run_process(
            [sys.executable, "-m", "fashiontag_pipeline", *args, flag, url],
            check=False,
            env=ENV,
            cwd=tmp_path,
        )
    err = result.stderr.decode()
    assert result.returncode == 2, err
    assert "Traceback" not in err and "local file" in err.splitlines()[-1], err
    assert not (tmp_path / (url.split(":")[0] + ":")).exists()


@pytest.mark.parametrize(
    "url", ["https://shop.example/exports/catalogue.csv", "s3://bucket/catalogue.csv.gz"]
)
async def test_a_manifest_given_as_a_url_says_how_to_read_it(tmp_path: Path, url: str) -> None:
    """``fashiontag run https://shop.example/exports/catalogue.csv`` (manifests are not
    downloaded): "cannot read manifest URL: No such file or directory", as if a file were
    missing. The line says now that it is a URL and how to give it (downloaded, or piped)."""
    async with running_service(ServiceConfig()) as svc:
        result = await anyio.run_process(
            [sys.executable, "-m", "fashiontag_pipeline", "run", url, "--base-url", svc.url],
            check=False,
            env=ENV,
            cwd=tmp_path,
        )
    err = result.stderr.decode()
    assert result.returncode == 1, err
    line = last_line(err)
    assert "a URL" in line and "| fashiontag run -" in line, line
