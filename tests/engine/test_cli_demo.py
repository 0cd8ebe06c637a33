"""CLI contract and the demo."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest

from fashiontag_pipeline import ConfigError
from fashiontag_pipeline.cli.demo import run_demo
from fashiontag_pipeline.cli.engine_flags import engine_config_from_args
from fashiontag_pipeline.cli.run import add_run_arguments, run_command
from fashiontag_pipeline.engine import EngineConfig

from .helpers import ENV

ROOT = Path(__file__).resolve().parents[2]


def _parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_run_arguments(parser)
    return parser.parse_args(argv)


def test_example_config_and_flags_build_the_engine_config() -> None:
    args = _parse("m.csv", "--config", str(ROOT / "configs/engine.toml"), "--rotate-images", "7")
    config = engine_config_from_args(args)
    assert isinstance(config, EngineConfig)
    assert config.rotate_images == 7 and config.expiry_margin == 30.0
    assert config.stall_timeout == 7200.0
    stalled = engine_config_from_args(_parse("m.csv", "--stall-timeout", "90"))
    assert stalled.stall_timeout == 90.0


@pytest.mark.parametrize("value", ["0", "-5", "nan"])
def test_a_stall_timeout_that_is_not_positive_is_a_clear_error(value: str) -> None:
    with pytest.raises(ConfigError, match="stall_timeout must be positive"):
        engine_config_from_args(_parse("m.csv", "--stall-timeout", value))


@pytest.mark.parametrize("value", ["-1", "nan"])
def test_a_negative_give_up_after_is_a_clear_error(value: str) -> None:
    """--give-up-after -1 was taken: the first failure of an outage stopped the run."""
    with pytest.raises(ConfigError, match="give_up_after must be a number of seconds >= 0"):
        engine_config_from_args(_parse("m.csv", "--give-up-after", value))


def test_unreadable_manifest_is_a_one_line_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "m.csv"
    bad.write_text("id,link\n1,x\n")
    code = run_command(_parse(str(bad), "--out", str(tmp_path / "o.jsonl"), "--no-progress"))
    err = capsys.readouterr().err.strip()
    assert code == 1 and len(err.splitlines()) == 1 and "url" in err


async def test_demo_runs_end_to_end(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert await run_demo(images=30, workdir=tmp_path) == 0
    out = capsys.readouterr().out
    assert "run complete" in out and "tagged 30" in out


@pytest.mark.parametrize("value", ["0", "-3", "many", "10001", "99999999999"])
def test_demo_refuses_a_catalogue_size_it_cannot_make(
    value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """`demo --images -3` generated nothing and exited 0, "the demo ran end to end": a bad
    flag value is exit 2 with usage, as `demo --help` says. `--images 99999999999` began to
    write that many image files (~8 KB each) into the temp folder: 627 MB in 20 s, until the
    disk was full."""
    from fashiontag_pipeline.cli.demo import add_demo_arguments

    parser = argparse.ArgumentParser()
    add_demo_arguments(parser)
    with pytest.raises(SystemExit) as stopped:
        parser.parse_args(["--images", value])
    assert stopped.value.code == 2
    assert "--images" in capsys.readouterr().err


@pytest.mark.parametrize(
    "flags",
    [
        ("--rotate-images", "0"),  # a bad flag value
        ("--config", "{config}"),  # a bad config value
        ("--state", "redis://cache/1"),  # a state this fashiontag cannot use
        ("--rejects", "{out}"),  # two outputs on one file
    ],
)
def test_a_refused_configuration_still_replaces_the_summary(
    tmp_path: Path, flags: tuple[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    """README: `--summary FILE` is written on a failure too, with "complete": false and the
    reason in `error`, so that a cron job never reads the last night's. A run refused for its
    configuration (exit 2) left last night's `"complete": true` summary in place."""
    manifest = tmp_path / "m.csv"
    manifest.write_text("id,url\na,https://img.example/a.jpg\n")
    out = tmp_path / "o.jsonl"
    config = tmp_path / "bad.toml"
    config.write_text('[client.retry]\nmax_attempts = "x"\n')
    summary = tmp_path / "reports" / "summary.json"
    summary.parent.mkdir()
    summary.write_text('{"complete": true, "error": null}')
    given = [f.format(config=config, out=out) for f in flags]
    code = run_command(_parse(str(manifest), "--out", str(out), "--summary", str(summary), *given))
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    report = msgspec.json.decode(summary.read_bytes())
    assert report["complete"] is False
    assert report["error"] and report["error"] in err


@pytest.mark.parametrize(
    "flags", [("--detection", "SOCKS"), ("--rotate-images", "many"), ("--sink", "csv")]
)
def test_a_flag_argparse_refuses_still_replaces_the_summary(
    tmp_path: Path, flags: tuple[str, str]
) -> None:
    """The same promise when argparse itself refuses a flag value (a typo in a crontab):
    exit 2, and --summary says `"complete": false` with the usage error, not last night's."""
    import subprocess
    import sys

    summary = tmp_path / "summary.json"
    summary.write_text('{"complete": true, "error": null}')
    for given in ([f"--summary={summary}"], ["--summary", str(summary)]):
        done = subprocess.run(
            [sys.executable, "-m", "fashiontag_pipeline", "run", "m.csv", *given, *flags],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 2, done.stderr
        report = msgspec.json.decode(summary.read_bytes())
        assert report["complete"] is False and flags[0] in report["error"], report
        summary.write_text('{"complete": true, "error": null}')


def test_demo_onto_a_full_disk_is_one_line_not_a_traceback(tmp_path: Path) -> None:
    """``fashiontag demo > demo.txt`` on a full disk (``/dev/full`` here): the demo ran, then
    its summary's ``print`` ended in a traceback, ``OSError: [Errno 28]``, as ``tag`` and
    ``tasks`` did before they were fixed. One line naming stdout now, exit 1."""
    argv = ["demo", "--images", "3", "--workdir", str(tmp_path / "demo")]
    with open("/dev/full", "wb") as full:
        done = subprocess.run(
            [sys.executable, "-m", "fashiontag_pipeline", *argv],
            stdout=full,
            stderr=subprocess.PIPE,
            env=ENV,
            timeout=120,
            check=False,
        )
    err = done.stderr.decode()
    assert done.returncode == 1 and "Traceback" not in err, err[-800:]
    assert "fashiontag: cannot write to stdout: No space left on device" in err.splitlines()
