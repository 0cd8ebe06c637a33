"""A config file read: TOML in UTF-8, its tables those some command reads; every failure a
:class:`ConfigError` naming the file (:mod:`._config` decodes the tables it holds)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ._exceptions import ConfigError

__all__ = ["CONFIG_TABLES", "read_toml"]

#: The tables a config file may hold (each read by the commands it concerns).
CONFIG_TABLES = frozenset({"client", "engine", "daemon", "service"})
#: The marks a UTF-16 file starts with (Notepad's "Unicode"), which is no UTF-8.
_UTF_16 = (b"\xff\xfe", b"\xfe\xff")
#: Who wrote a file that is not UTF-8, by whether it starts with a UTF-16 mark.
_WRITER = ("as a Latin-1 editor writes an accent", 'a UTF-16 file, as Notepad saves "Unicode"')


def read_toml(path: str | Path) -> dict[str, Any]:
    """Read a TOML file, turning every failure into a :class:`ConfigError` naming the file.

    ``tomllib`` is imported here: a run without ``--config`` never pays for it (~2 ms)."""
    import tomllib

    p = Path(path)
    try:
        # (a byte order mark, as Notepad saves UTF-8, is read past, as in manifests)
        data = tomllib.loads(p.read_bytes().decode("utf-8-sig"))
    except FileNotFoundError:
        raise ConfigError(f"config file not found: {p}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"config file {p} is not UTF-8 (byte 0x{exc.object[exc.start]:02x} at offset"
            f" {exc.start}, {_WRITER[exc.object.startswith(_UTF_16)]}): save it as UTF-8"
        ) from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {p} is not valid TOML: {exc}") from None
    except OSError as exc:
        raise ConfigError(f"cannot read config file {p}: {exc.strerror}") from None
    unknown = sorted(set(data) - CONFIG_TABLES)
    if unknown:  # a misspelt table would be ignored, and its settings with it
        tables = ", ".join(f"[{t}]" for t in sorted(CONFIG_TABLES))
        if not isinstance(data[unknown[0]], dict):  # (a key above the first table's line)
            raise ConfigError(
                f"config file {p} has the key {unknown[0]} outside any table (above the first"
                f" table's line): put it under its table, one of {tables}"
            )
        raise ConfigError(
            f"config file {p} has [{unknown[0]}], which no command reads: the tables are"
            f" {tables} (a misspelling?)"
        )
    return data
