"""A front for the reference service that speaks HTTP and JSON with habits of its own: a server
that follows the spec to the letter, written by someone else.

:class:`DialectFront` is a hand-written HTTP/1.x server on loopback (no aiohttp.web: it frames
its answers itself) that passes each request to the reference service and writes the answer
back in the :class:`Dialect` asked for: chunked at odd byte boundaries (inside a multibyte
character, inside a number), compressed, HTTP/1.0 with the body ended by the close,
``Connection: close`` on every answer (or a connection closed unannounced after some
answers), interim ``1xx`` answers first, idle connections closed after a second, a body over
its limit refused 413 unread, other status codes and ``Content-Type``, and its JSON rewritten
(keys in another order, unknown keys at every level, integers as ``1.0`` or ``1e3``,
pretty-printed, a BOM, trailing white space, keys given twice).
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import json
import random
import time
import zlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from email.utils import formatdate
from typing import Any

import aiohttp

__all__ = ["Dialect", "DialectFront", "dumps"]


@dataclass
class Dialect:
    #: "1.1" or "1.0" (an HTTP/1.0 answer: no chunking, the body ends with the connection
    #: unless it has a length).
    version: str = "1.1"
    #: "length" (Content-Length), "chunked", or "close" (no length: the body ends with the
    #: connection, which is closed after it).
    framing: str = "length"
    #: Chunk sizes for "chunked" (cycled): odd sizes cut characters and numbers in two.
    chunk_sizes: tuple[int, ...] = (1, 3, 7, 2, 5, 11, 13, 1021, 4093)
    #: None, "gzip", "deflate" (zlib), "raw-deflate" (deflate with no zlib wrapper, as IIS
    #: wrote it).
    encoding: str | None = None
    #: ``Connection: close`` on every answer, and the connection closed after it.
    close: bool = False
    #: The connection closed after every Nth answer on it, without ``Connection: close`` (a
    #: server whose per-connection request limit it does not announce); 0: never.
    silent_close_every: int = 0
    #: Writes whose Content-Length is over this are answered 413 as soon as their head has
    #: come, their body left unread, and the connection closed (a server with a body limit
    #: that does not drain what it refused: the kernel may reset the connection).
    early_413_over: int | None = None
    #: Interim answers sent before each final one, e.g. ``(100, "Continue")``.
    interim: tuple[tuple[int, str], ...] = ()
    #: Seconds after which an idle connection is closed by the server (None: never).
    idle: float | None = None
    #: The ``Date`` header: "http" (RFC 9110's), "rfc850", "asctime", "none", or "offset" (the
    #: http form, ``date_offset`` seconds off).
    date: str = "http"
    date_offset: float = 0.0
    #: How JSON answers are rewritten: (method, path, status, data) -> data (None: as they are).
    rewrite: Callable[[str, str, int, Any], Any] | None = None
    #: How JSON answers are written (see :func:`dumps`); None: the upstream's bytes when no
    #: rewrite, else ``json.dumps``.
    writer: Callable[[Any], bytes] | None = None
    #: The ``Content-Type`` of every answer (None: the upstream's; "" : none at all).
    content_type: str | None = None
    #: Status codes replaced: upstream status -> status sent (e.g. 202 -> 200).
    statuses: dict[int, int] = field(default_factory=dict)


def dumps(
    data: Any,
    *,
    reverse: bool = False,
    ints: str = "int",
    indent: int | None = None,
    twice: bool = False,
    extra: bool = False,
    ascii_only: bool = False,
) -> bytes:
    """JSON as another writer writes it: keys ``reverse``d, integers as ``"float"`` (``3.0``)
    or ``"exp"`` (``3e0``, ``1.2e3``), ``indent``-ed, each key given ``twice`` (the same value
    both times), an ``extra`` unknown key in every object, every non-ASCII character escaped
    (``ascii_only``)."""
    out: list[str] = []
    sep_item = ","
    nl = "" if indent is None else "\n"

    def number(n: int) -> str:
        if ints == "float":
            return f"{n}.0"
        if ints == "exp":
            if n == 0:
                return "0e0"
            digits = str(abs(n))
            sign = "-" if n < 0 else ""
            return f"{sign}{digits[0]}.{digits[1:] or '0'}e{len(digits) - 1}"
        return str(n)

    def emit(node: Any, depth: int) -> None:
        pad = "" if indent is None else " " * (indent * (depth + 1))
        end_pad = "" if indent is None else " " * (indent * depth)
        if isinstance(node, dict):
            items = list(node.items())
            if reverse:
                items.reverse()
            if extra and "v" not in node:
                items.insert(len(items) // 2, ("x-vendor-note", {"v": [1, "two", None]}))
            if twice:
                # (scalars only: a nested object given twice doubles at every level)
                items = [
                    item
                    for item in items
                    for _ in ((0,) if isinstance(item[1], (dict, list)) else (0, 1))
                ]
            if not items:
                out.append("{}")
                return
            out.append("{" + nl)
            for i, (key, value) in enumerate(items):
                out.append(pad + json.dumps(key, ensure_ascii=ascii_only) + ":")
                if indent is not None:
                    out.append(" ")
                emit(value, depth + 1)
                out.append((sep_item if i < len(items) - 1 else "") + nl)
            out.append(end_pad + "}")
        elif isinstance(node, list):
            if not node:
                out.append("[]")
                return
            out.append("[" + nl)
            for i, value in enumerate(node):
                out.append(pad)
                emit(value, depth + 1)
                out.append((sep_item if i < len(node) - 1 else "") + nl)
            out.append(end_pad + "]")
        elif isinstance(node, bool) or node is None:
            out.append(json.dumps(node))
        elif isinstance(node, int):
            out.append(number(node))
        else:
            out.append(json.dumps(node, ensure_ascii=ascii_only))

    emit(data, 0)
    return "".join(out).encode()


class DialectFront:
    """See the module docstring. ``requests`` records (method, path) of what was passed on."""

    def __init__(self, upstream: str, dialect: Dialect) -> None:
        self.upstream = upstream
        self.dialect = dialect
        self.url = ""
        self.requests: list[tuple[str, str]] = []
        self.answers = 0
        self.idle_closed = 0
        self.silent_closes = 0
        self.early_refusals = 0
        self._session: aiohttp.ClientSession | None = None
        self._random = random.Random(7)

    def _date(self) -> str | None:
        d = self.dialect
        now = time.time()
        if d.date == "none":
            return None
        if d.date == "rfc850":
            return time.strftime("%A, %d-%b-%y %H:%M:%S GMT", time.gmtime(now))
        if d.date == "asctime":
            return time.strftime("%a %b %e %H:%M:%S %Y", time.gmtime(now))
        if d.date == "offset":
            now += d.date_offset
        return formatdate(now, usegmt=True)

    async def _read_request(
        self, reader: asyncio.StreamReader
    ) -> tuple[str, str, dict[str, str], bytes | None] | None:
        """(method, target, headers, body) of the next request (body None: refused unread,
        ``early_413_over``); None when the connection ends or idles out."""
        d = self.dialect
        try:
            if d.idle is not None:
                head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), d.idle)
            else:
                head = await reader.readuntil(b"\r\n\r\n")
        except TimeoutError:
            self.idle_closed += 1
            return None
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError):
            return None
        lines = head.decode("latin-1").split("\r\n")
        method, target, _ = lines[0].split(" ", 2)
        headers: dict[str, str] = {}
        for line in lines[1:]:
            if ":" in line:
                name, value = line.split(":", 1)
                headers[name.strip().lower()] = value.strip()
        body = b""
        limit = d.early_413_over
        if limit is not None and int(headers.get("content-length", "0")) > limit:
            return method, target, headers, None
        if headers.get("transfer-encoding", "").lower() == "chunked":
            parts = []
            while True:
                size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
                if size == 0:
                    await reader.readuntil(b"\r\n")
                    break
                parts.append(await reader.readexactly(size))
                await reader.readexactly(2)
            body = b"".join(parts)
        elif "content-length" in headers:
            body = await reader.readexactly(int(headers["content-length"]))
        return method, target, headers, body

    def _encode(self, body: bytes) -> bytes:
        enc = self.dialect.encoding
        if enc == "gzip":
            return gzip.compress(body)
        if enc == "deflate":
            return zlib.compress(body)
        if enc == "raw-deflate":
            c = zlib.compressobj(wbits=-15)
            return c.compress(body) + c.flush()
        return body

    async def _answer(
        self, writer: asyncio.StreamWriter, status: int, reason: str, ctype: str, body: bytes
    ) -> bool:
        """Write one answer; True when the connection is to be closed after it."""
        d = self.dialect
        for code, text in d.interim:
            writer.write(f"HTTP/1.1 {code} {text}\r\n".encode())
            if code == 103:
                writer.write(b"Link: </style.css>; rel=preload; as=style\r\n")
            writer.write(b"\r\n")
        head = [f"HTTP/{d.version} {status} {reason}"]
        date = self._date()
        if date is not None:
            head.append(f"Date: {date}")
        head.append("Server: dialect/0.1")
        if ctype:
            head.append(f"Content-Type: {ctype}")
        if d.encoding is not None and body:
            body = self._encode(body)
            head.append(f"Content-Encoding: {d.encoding.replace('raw-', '')}")
            head.append("Vary: Accept-Encoding")
        framing = d.framing
        if d.version == "1.0" and framing == "chunked":
            framing = "close"
        close = d.close or framing == "close"
        if status in (204, 304) or 100 <= status < 200:
            body = b""
            framing = "none"
        if framing == "length":
            head.append(f"Content-Length: {len(body)}")
        elif framing == "chunked":
            head.append("Transfer-Encoding: chunked")
        if close:
            head.append("Connection: close")
        elif d.version == "1.0":
            head.append("Connection: keep-alive")
            if framing != "length":
                close = True
        writer.write(("\r\n".join(head) + "\r\n\r\n").encode("latin-1"))
        if framing == "chunked":
            sizes = d.chunk_sizes
            i = n = 0
            while i < len(body):
                size = sizes[n % len(sizes)]
                n += 1
                piece = body[i : i + size]
                i += size
                writer.write(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
                await writer.drain()
            writer.write(b"0\r\n\r\n")
        elif framing in ("length", "close"):
            writer.write(body)
        await writer.drain()
        return close

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        assert self._session is not None
        d = self.dialect
        served = 0
        try:
            while True:
                request = await self._read_request(reader)
                if request is None:
                    return
                method, target, headers, body = request
                if body is None:  # (early_413_over)
                    self.early_refusals += 1
                    await self._answer(
                        writer, 413, "Payload Too Large", "text/html", b"<html>413</html>"
                    )
                    return
                self.requests.append((method, target.split("?")[0]))
                sent = {k: v for k, v in headers.items() if k in ("x-api-key", "content-type")}
                if "accept-language" in headers:
                    sent["accept-language"] = headers["accept-language"]
                async with self._session.request(
                    method, self.upstream + target, data=body or None, headers=sent
                ) as up:
                    payload = await up.read()
                    status, reason = up.status, up.reason or "OK"
                    ctype = up.headers.get("Content-Type", "")
                if ctype.startswith("application/json") and (d.rewrite or d.writer):
                    data = json.loads(payload)
                    path = target.split("?")[0]
                    if d.rewrite is not None:
                        data = d.rewrite(method, path, status, data)
                    payload = (d.writer or (lambda v: json.dumps(v).encode()))(data)
                if d.content_type is not None:
                    ctype = d.content_type
                new_status = d.statuses.get(status)
                if new_status is not None:
                    status, reason = new_status, {200: "OK", 202: "Accepted"}.get(new_status, "X")
                self.answers += 1
                served += 1
                if await self._answer(writer, status, reason, ctype, payload):
                    return
                if d.silent_close_every and served % d.silent_close_every == 0:
                    self.silent_closes += 1
                    return
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            with contextlib.suppress(Exception):
                writer.close()

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[DialectFront]:
        server = await asyncio.start_server(self._serve, "127.0.0.1", 0, limit=1 << 20)
        port = server.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        self._session = aiohttp.ClientSession(auto_decompress=True)
        try:
            yield self
        finally:
            server.close()
            await self._session.close()
