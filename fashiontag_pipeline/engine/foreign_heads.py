"""What a manifest's first line shows it to be when it names no ``id`` and ``url`` columns: a
format a catalogue is often exported in (an archive, UTF-16 text, Excel's ``sep=`` line, a JSON
array, another separator, no header), with what to do; read only when a manifest is refused.
"""

from __future__ import annotations

import csv

__all__ = ["what_else"]

_SAVE_AS_CSV = "save it as CSV UTF-8 (comma delimited)"
#: The first bytes (as decoded with stray bytes kept) of archives a manifest may be sent as.
_ARCHIVES = (
    ("PK\x03\x04", "a ZIP archive (an .xlsx workbook, or a zipped export)"),
    ("BZh91AY&SY", "bzip2-compressed"),
    ("\udcfd7zXZ\x00", "xz-compressed"),
    ("(\udcb5/\udcfd", "zstd-compressed"),
)


def what_else(line: str) -> str:
    """What a first line naming no ``id`` and ``url`` columns shows the file to be, with what
    to do, when it is a format a catalogue is often exported in; "" otherwise. (Only when a
    manifest is refused.)"""
    text = line.strip()
    for magic, what in _ARCHIVES:
        if text.startswith(magic):
            return f"is {what}: gzip is the only compression read; unpack it, or {_SAVE_AS_CSV}"
    head = text[:64]
    if text.startswith(("\udcff\udcfe", "\udcfe\udcff")) or (
        len(head) > 1 and {"\x00"} in ({*head[1::2]}, {*head[::2]})
    ):
        return (
            "is UTF-16 text (Excel's Unicode Text): "
            f"{_SAVE_AS_CSV}, or convert it (iconv -f UTF-16 -t UTF-8)"
        )
    if text[:4].lower() == "sep=":
        return f"starts with Excel's {text} line (its separator): {_SAVE_AS_CSV}, without it"
    if text.startswith("["):
        return (
            "is a JSON array, not JSONL: give one object per line (jq -c '.[]' FILE > FILE.jsonl)"
        )
    for sep, what in ((";", "separated by semicolons"), ("\t", "tab-separated")):
        if {"id", "url"} <= {c.strip().strip('"').lower() for c in text.split(sep)}:
            return f"is {what}, not commas: {_SAVE_AS_CSV}"
    if any(_lower_head(f).startswith(("http://", "https://")) for f in next(csv.reader([text]))):
        return (
            "has no header: its first line is a row (a URL in it); add a first line naming"
            " the columns, id and url among them (id,url)"
        )
    return ""


def _lower_head(field: str) -> str:
    return field.strip()[:8].lower()
