"""The [daemon] table: defaults as named constants, the shipped example decodes, errors name
the field, listen parsing."""

from __future__ import annotations

from pathlib import Path

import pytest

from fashiontag_pipeline import ConfigError
from fashiontag_pipeline._config import load_client_config, load_section
from fashiontag_pipeline.daemon.config import (
    DEFAULT_DRAIN_TIMEOUT,
    DEFAULT_LISTEN,
    DEFAULT_MAX_ACTIVE,
    DEFAULT_SCAN_INTERVAL,
    DEFAULT_SETTLE,
    DaemonConfig,
    load_daemon_config,
    parse_listen,
)
from fashiontag_pipeline.engine.config import EngineConfig

EXAMPLE = Path(__file__).resolve().parents[2] / "configs" / "daemon.toml"


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "daemon.toml"
    path.write_text(text)
    return path


def test_defaults() -> None:
    config = load_daemon_config(None)
    assert config == DaemonConfig()
    assert (config.listen, config.settle, config.scan_interval) == ("127.0.0.1:9464", 10.0, 2.0)
    assert (config.max_active, config.drain_timeout, config.log_format) == (8, 30.0, "auto")
    assert (DEFAULT_LISTEN, DEFAULT_SETTLE, DEFAULT_SCAN_INTERVAL) == ("127.0.0.1:9464", 10.0, 2.0)
    assert (DEFAULT_MAX_ACTIVE, DEFAULT_DRAIN_TIMEOUT) == (8, 30.0)
    assert config.listen_address == ("127.0.0.1", 9464)


def test_the_example_file_decodes_whole() -> None:
    config = load_daemon_config(EXAMPLE)
    assert config.inbox == "/srv/fashiontag/inbox"
    assert config.outbox == "/srv/fashiontag/outbox"
    assert config.max_active == 8
    assert config.require_folders() == (Path(config.inbox), Path(config.outbox))
    # The other sections of the same file load with their own loaders.
    assert load_client_config(EXAMPLE, environ={}).base_url == "http://127.0.0.1:8080"
    assert load_section(EXAMPLE, "engine", EngineConfig).rotate_seconds == 30.0


@pytest.mark.parametrize(
    ("line", "field"),
    [
        ("settle = -1", "daemon.settle"),
        ("scan_interval = 0", "daemon.scan_interval"),
        ("max_active = 0", "daemon.max_active"),
        ("drain_timeout = -5", "daemon.drain_timeout"),
        ('listen = "nonsense"', "daemon.listen"),
        ('listen = "127.0.0.1:99999"', "daemon.listen"),
        ('log_format = "xml"', "daemon.log_format"),
        ('inbox = ""', "daemon.inbox"),
        ("max_active = 'eight'", "daemon.max_active"),
        ("watch = true", "watch"),
        ("unreachable_after = nan", "daemon.unreachable_after"),  # /readyz never said 503
    ],
)
def test_errors_name_the_field(tmp_path: Path, line: str, field: str) -> None:
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        load_daemon_config(write(tmp_path, f"[daemon]\n{line}\n"))


def test_state_default_and_required_folders() -> None:
    assert DaemonConfig(inbox="/in").state_location() == "/in/.fashiontag-daemon.sqlite"
    assert DaemonConfig(inbox="/in", state="/var/s.db").state_location() == "/var/s.db"
    with pytest.raises(ValueError, match=r"daemon\.outbox is required"):
        DaemonConfig(inbox="/in").require_folders()


@pytest.mark.parametrize(
    ("listen", "expected"),
    [
        ("127.0.0.1:9464", ("127.0.0.1", 9464)),
        ("0.0.0.0:0", ("0.0.0.0", 0)),
        ("[::1]:9464", ("::1", 9464)),
        ("localhost:80", ("localhost", 80)),
        ("", None),
        ("  ", None),
    ],
)
def test_parse_listen(listen: str, expected: tuple[str, int] | None) -> None:
    assert parse_listen(listen) == expected


@pytest.mark.parametrize("listen", ["9464", ":9464", "::1:9464", "host:port", "h:-1"])
def test_parse_listen_refuses(listen: str) -> None:
    with pytest.raises(ValueError):
        parse_listen(listen)
