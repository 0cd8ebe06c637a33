"""The shipped systemd unit: parsed as systemd reads it (sections, continuation lines), the
keys the daemon's notify/watchdog/drain behaviour relies on, hardening, and an ExecStart that
uses only the documented flags of `fashiontag daemon`."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from fashiontag_pipeline.daemon.config import DEFAULT_DRAIN_TIMEOUT

UNIT = Path(__file__).resolve().parents[2] / "deploy" / "fashiontag-daemon.service"

#: The flags of `fashiontag daemon` (DESIGN section 6), each taking a value.
DOCUMENTED_FLAGS = {
    "--inbox",
    "--outbox",
    "--state",
    "--listen",
    "--settle",
    "--scan-interval",
    "--max-active",
    "--drain-timeout",
    "--log-format",
    "--config",
    "--base-url",
    "--language",
    "--detection",
}


def parse_unit(text: str) -> dict[str, dict[str, list[str]]]:
    """systemd's unit syntax: [Section], Key=Value, '#'/';' comments, '\\' continuations,
    repeated keys accumulate."""
    sections: dict[str, dict[str, list[str]]] = {}
    current: dict[str, list[str]] | None = None
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if pending:
            line = pending + " " + line
            pending = ""
        if not line or line.startswith(("#", ";")):
            continue
        if line.endswith("\\"):
            pending = line[:-1].strip()
            continue
        if line.startswith("[") and line.endswith("]"):
            current = sections.setdefault(line[1:-1], {})
            continue
        assert current is not None, f"key outside a section: {line!r}"
        key, sep, value = line.partition("=")
        assert sep, f"not Key=Value: {line!r}"
        current.setdefault(key.strip(), []).append(value.strip())
    assert not pending, "unit ends inside a continuation"
    return sections


def seconds(value: str) -> float:
    match = re.fullmatch(r"(\d+(?:\.\d+)?)\s*(s|min|ms)?", value)
    assert match, value
    number, unit = float(match.group(1)), match.group(2) or "s"
    return number * {"s": 1.0, "min": 60.0, "ms": 0.001}[unit]


def test_unit_sections_and_service_keys() -> None:
    unit = parse_unit(UNIT.read_text())
    assert set(unit) == {"Unit", "Service", "Install"}
    service = unit["Service"]
    single = {key: values[-1] for key, values in service.items()}
    assert single["Type"] == "notify"
    assert single["NotifyAccess"] in ("main", "all")
    assert single["Restart"] == "on-failure"
    # Exit 2 (a bad flag or config value, a state begun on another service) is not cured by
    # starting again: restarted every RestartSec, the daemon logged the same refusal for ever.
    assert "2" in single.get("RestartPreventExitStatus", "").split()
    watchdog = seconds(single["WatchdogSec"])
    assert 0 < watchdog <= 120
    # SIGTERM drains within the drain timeout; systemd must wait at least that long.
    assert seconds(single["TimeoutStopSec"]) > DEFAULT_DRAIN_TIMEOUT
    assert single["KillSignal"] == "SIGTERM"
    assert unit["Install"]["WantedBy"] == ["multi-user.target"]
    assert "network-online.target" in unit["Unit"]["After"][0]


def test_unit_is_hardened() -> None:
    service = {k: v[-1] for k, v in parse_unit(UNIT.read_text())["Service"].items()}
    assert service["User"] and service["User"] != "root"
    for key in (
        "NoNewPrivileges",
        "ProtectHome",
        "PrivateTmp",
        "PrivateDevices",
        "ProtectKernelTunables",
        "ProtectKernelModules",
        "ProtectControlGroups",
        "RestrictSUIDSGID",
    ):
        assert service[key] == "yes", key
    assert service["ProtectSystem"] == "strict"
    assert service["CapabilityBoundingSet"] == ""
    # AF_UNIX is needed for NOTIFY_SOCKET; INET for the service and --listen.
    assert set(service["RestrictAddressFamilies"].split()) == {"AF_UNIX", "AF_INET", "AF_INET6"}
    # Keys come from a root-only environment file, never from the command line.
    assert service["EnvironmentFile"].lstrip("-").startswith("/etc/")


def test_exec_start_uses_the_documented_flags() -> None:
    service = parse_unit(UNIT.read_text())["Service"]
    [exec_start] = service["ExecStart"]
    argv = shlex.split(exec_start)
    assert argv[0].startswith("/") and argv[0].endswith("/fashiontag")
    assert argv[1] == "daemon"
    flags = argv[2::2]
    values = argv[3::2]
    assert len(flags) == len(values)
    assert set(flags) <= DOCUMENTED_FLAGS, set(flags) - DOCUMENTED_FLAGS
    assert {"--inbox", "--outbox"} <= set(flags)
    options = dict(zip(flags, values, strict=True))
    assert options["--log-format"] in ("json", "text")
    assert re.fullmatch(r"[\w.\-\[\]:]+:\d+", options["--listen"])
    assert not any("key" in arg.lower() for arg in argv), "keys belong in EnvironmentFile"
    # ReadWritePaths covers the folders the daemon writes (ProtectSystem=strict).
    writable = service["ReadWritePaths"][-1].split()
    for flag in ("--inbox", "--outbox"):
        assert any(options[flag].startswith(path) for path in writable), flag


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="needs systemd-analyze")
def test_systemd_itself_accepts_the_unit(tmp_path: Path) -> None:
    # Only the program path is swapped for one that exists here: verify checks it is executable.
    text = UNIT.read_text().replace("/opt/fashiontag/bin/fashiontag", sys.executable)
    unit = tmp_path / UNIT.name
    unit.write_text(text)
    done = subprocess.run(
        ["systemd-analyze", "verify", str(unit)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "fashiontag-daemon.service" not in done.stderr, done.stderr
