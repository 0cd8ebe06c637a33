"""A page's results JSONL lines, ``{"id", "taskId", "taggingResult"}`` each.

:func:`page_lines` gives the bytes msgspec gives for a line struct a row
(``encode_lines``). The usual page's are built around its ids and results instead: building
and encoding a struct a row cost ~1,000 instructions a result (the results path's largest
share of Python after the page's decode).
"""

from __future__ import annotations

import msgspec

from .pages import PageRow

__all__ = ["OutLine", "page_lines"]

_encoder = msgspec.json.Encoder()


class OutLine(msgspec.Struct, rename="camel", gc=False):
    id: str
    task_id: str | None  # None (JSON null): a result of the single endpoint
    tagging_result: msgspec.Raw


#: A line's JSON around its id and its result, as msgspec encodes :class:`OutLine` (field
#: order, no spaces): the head of the first line, and the end of a line with the next's head.
_HEAD = b'{"id":"'
_NEXT = b'}\n{"id":"'
_END = b"}\n"


def page_lines(task_id: str | None, rows: list[PageRow]) -> bytes:
    """The results lines of ``rows`` (of task ``task_id``), as ``encode_lines`` of their
    :class:`OutLine` structs gives them.

    Fast path: the page's ids are encoded by msgspec as one list (a lone surrogate raises
    there as the structs would); every escape msgspec writes starts with a backslash (a
    quote, a backslash, a control character), so with none in that encoding (one memchr
    pass) each id is written as its own UTF-8 bytes, the list holds no quote but its
    strings' own, and each ``","`` in it is a separator. A result is written as the bytes it
    came as, in either path. Otherwise (an id msgspec escapes, no row at all) the structs
    are encoded."""
    if rows:
        ids_json = _encoder.encode([r.id for r in rows])
        if b"\\" not in ids_json:
            # (id, result) between each line's head and its task's part: two lists spliced
            # into one template in C (no tuple, no struct a row).
            task = b'","taskId":' + _encoder.encode(task_id) + b',"taggingResult":'
            out = [_NEXT, b"", task, b""] * len(rows)
            out[0] = _HEAD
            out[1::4] = ids_json[2:-2].split(b'","')
            out[3::4] = [r.tagging_result for r in rows]
            out.append(_END)
            return b"".join(out)
    return _encoder.encode_lines([OutLine(r.id, task_id, r.tagging_result) for r in rows])
