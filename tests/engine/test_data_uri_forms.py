"""``data:`` images written the ways exporters write base64 (wrapped in lines, URL-safe, without
padding, percent-encoded as a URL), and at the size limit, against the reference service (which
decodes the pixels sent, strictly)."""

from __future__ import annotations

import base64
import json
import sys
from pathlib import Path
from urllib.parse import quote

import anyio
import msgspec

from fashiontag_pipeline.engine import run_pipeline
from fashiontag_pipeline.service import ServiceConfig, running_service

from .helpers import assert_exactly_once, client_config
from .test_resume_trickle import ENV
from .test_single_mode import FAST, colors_of, red_picture


def _forms(png: bytes) -> dict[str, str]:
    plain = base64.b64encode(png).decode()
    wrapped = "\n".join(plain[i : i + 76] for i in range(0, len(plain), 76))
    return {
        # `base64 FILE`, Python's base64.encodebytes, Java's MIME encoder: lines of 76.
        "wrapped": wrapped + "\n",
        "crlf": wrapped.replace("\n", "\r\n"),
        "spaced": " ".join(plain[i : i + 64] for i in range(0, len(plain), 64)),
        "urlsafe": base64.urlsafe_b64encode(png).decode(),
        "unpadded": plain.rstrip("="),
        "urlsafe-unpadded": base64.urlsafe_b64encode(png).decode().rstrip("="),
        # RFC 2397: a data: URI is a URL, its data may be percent-encoded (+ / =).
        "percent": quote(plain, safe=""),
    }


async def test_base64_of_a_good_image_in_the_forms_exporters_write_is_tagged(
    tmp_path: Path,
) -> None:
    """Base64 wrapped in lines (what ``base64 FILE`` and MIME encoders write), spaced,
    URL-safe, unpadded or percent-encoded holds the same image: each was a ``client`` reject,
    "base64 content does not decode", the image never tagged. Each is sent as the spec's
    base64 and tagged from its pixels."""
    png = red_picture(tmp_path / "red.png").read_bytes()
    png += b"\x00" * (len(png) % 3 == 0)  # (so that "unpadded" drops a "=": PNG ends at IEND)
    forms = _forms(png)
    jsonl = tmp_path / "m.jsonl"
    lines = [
        json.dumps(
            {"id": name, "image": {"type": "base64", "content": "data:image/png;base64," + p}}
        )
        for name, p in forms.items()
    ]
    lines.append(json.dumps({"id": "garbage", "url": "data:image/png;base64,!!not*base64!!"}))
    jsonl.write_text("\n".join(lines) + "\n")
    out, rej = tmp_path / "out.jsonl", tmp_path / "rej.jsonl"
    async with running_service(ServiceConfig()) as svc:
        summary = await run_pipeline(
            [jsonl], client=client_config(svc.url), out=out, rejects=rej, engine=FAST
        )
    o = assert_exactly_once(out, rej, {*forms, "garbage"})
    assert summary.complete and summary.single == len(forms) + 1
    assert [r["id"] for r in o.rejects] == ["garbage"], o.rejects
    assert "does not decode" in o.rejects[0]["reason"]
    for r in o.results:
        assert r["taggingResult"]["status"] == "success", r
        assert colors_of(r)[:1] == ["red"], r


async def test_a_data_image_one_byte_over_the_limit_is_refused_naming_it(tmp_path: Path) -> None:
    """``single_max_bytes`` holds for a ``data:`` image as for a file: one of exactly the limit
    is tagged, one a byte over it is a ``client`` reject naming the limit (it was sent: the
    length check let up to 4 bytes more through), and base64 wrapped in lines is measured by
    the image it holds, not by its line breaks."""
    png = red_picture(tmp_path / "red.png").read_bytes()
    plain = base64.b64encode(png).decode()
    wrapped = "\n".join(plain[i : i + 4] for i in range(0, len(plain), 4))
    rows = {"at": plain, "wrapped-at": wrapped}
    jsonl = tmp_path / "m.jsonl"
    lines = [json.dumps({"id": i, "url": "data:image/png;base64," + p}) for i, p in rows.items()]
    jsonl.write_text("\n".join(lines) + "\n")
    over = tmp_path / "over.jsonl"
    over.write_text(json.dumps({"id": "over", "url": "data:image/png;base64," + plain}) + "\n")
    out, rej = tmp_path / "out.jsonl", tmp_path / "rej.jsonl"
    out2, rej2 = tmp_path / "out2.jsonl", tmp_path / "rej2.jsonl"
    async with running_service(ServiceConfig()) as svc:
        at = msgspec.structs.replace(FAST, single_max_bytes=len(png))
        summary = await run_pipeline(
            [jsonl], client=client_config(svc.url), out=out, rejects=rej, engine=at
        )
        assert summary.complete and summary.rejected == 0
        o = assert_exactly_once(out, rej, set(rows))
        assert all(colors_of(r)[:1] == ["red"] for r in o.results)
        below = msgspec.structs.replace(FAST, single_max_bytes=len(png) - 1)
        summary = await run_pipeline(
            [over], client=client_config(svc.url), out=out2, rejects=rej2, engine=below
        )
    o = assert_exactly_once(out2, rej2, {"over"})
    assert summary.complete and not o.results
    assert o.rejects[0]["stage"] == "client"
    assert f"larger than {len(png) - 1} bytes" in o.rejects[0]["reason"], o.rejects


async def test_fashiontag_tag_takes_a_data_uri_wrapped_in_lines(tmp_path: Path) -> None:
    """``fashiontag tag "data:image/png;base64,$(base64 red.png)"``: the shell's base64 wraps
    at 76 columns. It was sent as given and the service refused it (802, exit 1)."""
    png = red_picture(tmp_path / "red.png").read_bytes()
    uri = "data:image/png;base64," + _forms(png)["wrapped"].rstrip("\n")
    async with running_service(ServiceConfig()) as svc:
        result = await anyio.run_process(
            [sys.executable, "-m", "fashiontag_pipeline", "tag", uri, "--base-url", svc.url],
            check=False,
            env=ENV,
        )
    assert result.returncode == 0, result.stderr
    body = msgspec.json.decode(result.stdout)
    assert body["status"] == "success"
