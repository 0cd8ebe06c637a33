"""What a manifest's first line shows it to be when it names no ``id`` and ``url`` columns: a
format a catalogue is often exported in (an archive, a gzip of a gzip, a workbook or a warehouse
unload, UTF-16 text, Excel's ``sep=`` line, a JSON array, another separator, no header), with
what to do; read only when a manifest is refused.
"""

from __future__ import annotations

import collections
import csv
import os
import re

__all__ = ["empty_manifest", "folder_files", "missing_columns", "urls_under_header", "what_else"]

_SAVE_AS_CSV = "save it as CSV UTF-8 (comma delimited)"
#: What to do with a file separated by semicolons: Excel writes its region's list separator
#: (``;`` where numbers take a decimal comma) in a "CSV UTF-8 (Comma delimited)" file, so
#: saving it so again gives the same file. A command that converts it, quoted cells and all.
_SEMICOLONS = (
    "Excel writes the list separator of its region's settings (; where numbers take a decimal"
    " comma) whatever the format's name; convert it, python3 -c \"import csv;"
    " csv.writer(open(1, 'w', encoding='utf-8', newline='')).writerows(csv.reader(open(0,"
    " encoding='utf-8-sig', newline=''), delimiter=';'))\" < IN.csv > OUT.csv"
)
#: The first bytes (as decoded with stray bytes kept) of archives a manifest may be sent as.
_ARCHIVES = (
    (re.compile("PK\x03\x04"), "a ZIP archive (an .xlsx workbook, or a zipped export)"),
    (re.compile("BZh[1-9]1AY&SY"), "bzip2-compressed"),  # (the digit: its block size, -1 to -9)
    (re.compile("\udcfd7zXZ\x00"), "xz-compressed"),
    (re.compile("\\(\udcb5/\udcfd"), "zstd-compressed"),
)
#: Files a warehouse unload or a spreadsheet is saved as, which no unpacking makes a manifest.
_OTHER_FILES = (
    (bytes.fromhex("d0cf11e0a1b11ae1"), "an Excel 97-2003 workbook (.xls)"),
    (b"PAR1", "a Parquet file (a warehouse unload)"),
    (b"Obj\x01", "an Avro file (a warehouse unload)"),
)

#: The first bytes of images (``fashiontag run photo.jpg``: one image where a manifest goes).
_IMAGES = (
    (re.compile(b"\xff\xd8\xff"), "a JPEG"),
    (re.compile(b"\x89PNG"), "a PNG"),
    (re.compile(b"GIF8[79]a"), "a GIF"),
    (re.compile(b"RIFF.{4}WEBP", re.DOTALL), "a WebP"),
    (re.compile(b".{4}ftyp(?:hei[cxms]|mif1|msf1)", re.DOTALL), "a HEIF"),
    (re.compile(b".{4}ftypavi[fs]", re.DOTALL), "an AVIF"),
    (re.compile(rb"II\*\x00|MM\x00\*"), "a TIFF"),
)


def what_else(line: str) -> str:
    """What a first line naming no ``id`` and ``url`` columns shows the file to be, with what
    to do, when it is a format a catalogue is often exported in; "" otherwise. (Only when a
    manifest is refused.)"""
    if line.startswith("\x1f\udc8b"):  # (its first byte is whitespace to str.strip)
        return "is gzipped twice (a .gz of a .gz): gunzip it once, and give that .gz"
    if line[257:262] == "ustar":  # (a tar header's magic; the first line is its whole block)
        return (
            "is a tar archive (tar cf, tar czf): give the manifest inside it (tar xzf, or"
            " tar xzOf ARCHIVE | fashiontag run -)"
        )
    text = line.strip()
    for magic, what in _ARCHIVES:
        if magic.match(text):
            return f"is {what}: gzip is the only compression read; unpack it, or {_SAVE_AS_CSV}"
    head_bytes = line[:16].encode("utf-8", "surrogateescape")
    for image, format_name in _IMAGES:
        if image.match(head_bytes):
            return (
                f"is {format_name} image, not a manifest (a CSV or JSONL file listing images):"
                " to tag one image, give it to fashiontag tag FILE"
            )
    for kind, what in _OTHER_FILES:
        if head_bytes.startswith(kind):
            return f"is {what}: export it as CSV (with a header naming id and url) or as JSONL"
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
            return f"is {what}, not commas: {_SEMICOLONS if sep == ';' else _SAVE_AS_CSV}"
    if any(_lower_head(f).startswith(("http://", "https://")) for f in next(csv.reader([text]))):
        return (
            "has no header: its first line is a row (a URL in it); add a first line naming"
            " the columns, id and url among them (id,url)"
        )
    for sep, what in (("\t", "tab-separated"), (";", "separated by semicolons")):
        if any(_lower_head(f).startswith(("http://", "https://")) for f in text.split(sep)):
            # (a database dump: MySQL's INTO OUTFILE, PostgreSQL's COPY in its text format)
            fix = _SEMICOLONS + ", and add" if sep == ";" else _SAVE_AS_CSV + ","
            return f"is {what}, with no header: {fix} a first line naming the columns (id,url)"
    return ""


def _lower_head(field: str) -> str:
    return field.strip()[:8].lower()


def urls_under_header(header: list[str], after: list[str]) -> str:
    """What a one-column CSV whose rows are URLs is (a URL list exported with a header line),
    with what to do; "" for any other header. ``after``: the line after the header, if any."""
    first = after[0].strip().strip('"').lower() if after else ""
    if len(header) != 1 or not first.startswith(("http://", "https://")):
        return ""
    return (
        f"is a list of URLs under a header line ({header[0].strip()}): remove that line to tag"
        " it as a URL list (each URL its own id), or add an id column (id,url)"
    )


def missing_columns(missing: list[str], header: list[str], after: list[str]) -> str:
    """Why a CSV whose header names no ``id`` or ``url`` (``missing``) is refused, naming the
    columns whose first row holds URLs when ``url`` is missing: a product export given as it
    is (Shopify's ``Image Src``, a PIM's ``image_src``) has its URLs under another name.
    ``after``: the lines after the header (its first row may span several: a quoted cell of
    HTML with line breaks)."""
    why = "is neither JSONL nor a CSV with a header naming id and url"
    why += f" (missing column: {', '.join(missing)}"
    cells = next(csv.reader(after[:50]), [])
    named = [
        name.strip()
        for name, cell in zip(header, cells, strict=False)
        if _lower_head(cell).startswith(("http://", "https://")) and name.strip()
    ]
    if "url" not in missing or not named:
        return why + ")"
    if len(named) == 1:
        return f"{why}; the column {named[0]} holds URLs: name it url)"
    return f"{why}; the columns {', '.join(named)} hold URLs: name the one of the images url)"


def folder_files(folder: str) -> str:
    """The pattern naming the manifests in ``folder`` (a Spark, Snowflake or BigQuery output:
    its part files, ``part-*.csv.gz``, ``data_0_0_0.csv.gz``), by their most common suffix
    (``.csv`` when it holds none): not its hidden files (``.crc``) or markers (``_SUCCESS``)."""
    suffixes: collections.Counter[str] = collections.Counter()
    try:
        with os.scandir(folder) as entries:
            for entry in entries:
                name = entry.name
                if name.startswith((".", "_")) or not entry.is_file():
                    continue
                stem, dot, ext = name.rpartition(".")
                if dot and ext.lower() == "gz":
                    stem, dot, ext = stem.rpartition(".")
                    ext += ".gz"
                if dot and stem and len(ext) <= 12:
                    suffixes[ext] += 1
    except OSError:
        pass
    common = suffixes.most_common(1)
    return f"{folder.rstrip('/')}/*.{common[0][0] if common else 'csv'}"


def empty_manifest(name: str) -> str:
    """Why the manifest ``name``, empty, is refused: a Spark (Hadoop) job's ``_SUCCESS``
    marker (``fashiontag run out.csv/*``) is named as one, with the part files to give."""
    if os.path.basename(name) != "_SUCCESS":
        return f"manifest {name} is empty"
    folder = os.path.dirname(name) or "."
    return (
        f"manifest {name} is empty: a Spark (Hadoop) job's _SUCCESS marker, no manifest;"
        f" give the part files ({folder_files(folder)} ...)"
    )
