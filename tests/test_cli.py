"""The client-only commands (`tag`, `tasks`) as a user runs them, against the reference service."""

from __future__ import annotations

import base64
import os
import sys
from pathlib import Path

import anyio
import anyio.abc
import msgspec
import pytest
from PIL import Image as PILImage

from fashiontag_pipeline import BulkContext, Image, ImageType, TaggerClient, TaggingRequest
from fashiontag_pipeline._config import DEV_API_KEY, DEV_BULK_API_KEY
from fashiontag_pipeline.engine.reuse import open_store
from fashiontag_pipeline.service import ServiceConfig, running_service

from .engine.helpers import dead_port

ENV = {
    k: v for k, v in os.environ.items() if not k.startswith("FASHIONTAG_")
}  # the development keys, as a new user has them


async def fashiontag(*args: str) -> tuple[int, bytes, bytes]:
    result = await anyio.run_process(
        [sys.executable, "-m", "fashiontag_pipeline", *args], check=False, env=ENV
    )
    return result.returncode, result.stdout, result.stderr


async def test_tag_a_url_and_a_local_file(tmp_path: Path) -> None:
    picture = tmp_path / "red-dress.png"
    canvas = PILImage.new("RGB", (240, 320), (250, 250, 250))
    canvas.paste((200, 20, 30), (60, 60, 180, 280))
    canvas.save(picture)
    async with running_service(ServiceConfig()) as svc:
        code, out, err = await fashiontag(
            "tag", "https://img.example/look.jpg", "--base-url", svc.url, "--detection", "SHOES"
        )
        assert code == 0, err
        assert msgspec.json.decode(out)["status"] == "success"
        code, out, err = await fashiontag("tag", str(picture), "--base-url", svc.url)
        assert code == 0, err
        body = msgspec.json.decode(out)
        colors = [
            c["name"]
            for obj in body["data"]["objects"]
            for tag in obj["tags"]
            for c in tag.get("colors", [])
        ]
        assert colors and colors[0] == "red"  # measured from the pixels sent as base64


async def test_tag_takes_a_url_whatever_the_case_of_its_scheme_and_a_file_url(
    tmp_path: Path,
) -> None:
    """IMAGE_PATH_OR_URL (DESIGN 4.1): ``HTTPS://...`` (a scheme is case-insensitive) and
    ``file:///absolute/path`` (as ``run`` takes them) were read as local file names: exit 2,
    "cannot read image 'HTTPS://...': No such file or directory"."""
    picture = tmp_path / "a picture.png"
    canvas = PILImage.new("RGB", (240, 320), (250, 250, 250))
    canvas.paste((200, 20, 30), (60, 60, 180, 280))
    canvas.save(picture)
    async with running_service(ServiceConfig()) as svc:
        upper = "DATA:IMAGE/PNG;BASE64," + base64.b64encode(picture.read_bytes()).decode()
        for image in ("HTTPS://img.example/look.jpg", picture.as_uri(), upper):
            code, out, err = await fashiontag("tag", image, "--base-url", svc.url)
            assert code == 0, err
            assert msgspec.json.decode(out)["status"] == "success"
        code, _, err = await fashiontag("tag", "file://elsewhere/a.png", "--base-url", svc.url)
        assert code == 2 and b"absolute local path" in err


async def test_tag_errors_are_one_clear_line(tmp_path: Path) -> None:
    async with running_service(ServiceConfig(api_keys=("other",), bulk_api_keys=("b",))) as svc:
        code, _, err = await fashiontag("tag", str(tmp_path / "absent.png"), "--base-url", svc.url)
        assert code == 2 and b"cannot read image" in err
        code, _, err = await fashiontag("tag", "https://img.example/a.jpg", "--base-url", svc.url)
        assert code == 1 and b"HTTP 401" in err and len(err.strip().splitlines()) == 1
        assert DEV_API_KEY.encode() not in err
    code, _, err = await fashiontag("tag", "https://x/a.jpg", "--detection", "SOCKS")
    assert code == 2 and b"unknown detection value 'SOCKS'" in err


#: ``fashiontag tag`` under an address-space limit: an image read without a bound (/dev/zero)
#: ends in MemoryError here, not in the machine's memory.
_LIMITED = (
    "import resource, runpy, sys; resource.setrlimit(resource.RLIMIT_AS, (1 << 31, 1 << 31));"
    " sys.argv[0] = 'fashiontag'; runpy.run_module('fashiontag_pipeline', run_name='__main__')"
)


@pytest.mark.parametrize("kind", ["fifo", "dev-zero", "over-20MiB", "data-text"])
async def test_tag_refuses_what_is_no_image_file_at_once(tmp_path: Path, kind: str) -> None:
    """``tag`` read its file whole, whatever it was: a FIFO blocked for ever, /dev/zero read
    until memory ran out (a MemoryError traceback), a 2 GB video by mistake was read and sent
    whole; a ``data:`` URI of another type was 'No such file or directory'. Each is exit 2 at
    once, saying why, as ``run`` rejects such rows."""
    image, expected = {
        "fifo": (str(tmp_path / "pipe.png"), b"not a regular file"),
        "dev-zero": ("/dev/zero", b"not a regular file"),
        "over-20MiB": (str(tmp_path / "huge.png"), b"larger than 20971520 bytes"),
        "data-text": ("data:text/plain;base64,AAAA", b"data:image/<ext>;base64,<content>"),
    }[kind]
    if kind == "fifo":
        os.mkfifo(image)
    elif kind == "over-20MiB":
        with open(image, "wb") as fh:  # sparse: no disk used
            fh.truncate((20 << 20) + 1)
    with anyio.fail_after(20):
        result = await anyio.run_process(
            [
                sys.executable,
                "-c",
                _LIMITED,
                "tag",
                image,
                "--base-url",
                f"http://127.0.0.1:{dead_port()}",
            ],
            check=False,
            env=ENV,
        )
    assert result.returncode == 2, result.stderr
    assert expected in result.stderr and result.stderr.count(b"\n") == 1, result.stderr


async def test_tag_an_image_the_service_cannot_tag_says_why_on_stderr(tmp_path: Path) -> None:
    """The answer (status failure) is printed as it came; exit 1 came with nothing on stderr,
    so a script's log showed no reason."""
    junk = tmp_path / "junk.png"
    junk.write_bytes(bytes(range(256)) * 8)
    async with running_service(ServiceConfig()) as svc:
        code, out, err = await fashiontag("tag", str(junk), "--base-url", svc.url)
    assert code == 1 and msgspec.json.decode(out)["status"] == "failure"
    assert err.count(b"\n") == 1
    assert b"could not tag" in err and b"805" in err and b"could not be decoded" in err


async def test_tasks_list_status_and_results() -> None:
    async with running_service(ServiceConfig()) as svc:
        async with TaggerClient(svc.url, api_key=DEV_API_KEY, bulk_api_key=DEV_BULK_API_KEY) as c:
            created = await c.create_task(
                [
                    TaggingRequest(
                        image=Image(type=ImageType.URL, content=f"https://img.example/{i}.jpg"),
                        context=BulkContext(id=f"sku-{i}"),
                    )
                    for i in range(7)
                ],
                description="cli test",
            )
            with anyio.fail_after(10):
                while not (await c.task_status(created.task_id)).done:
                    await anyio.sleep(0.02)
        code, out, err = await fashiontag("tasks", "list", "--base-url", svc.url, "--json")
        assert code == 0, err
        assert [t["description"] for t in msgspec.json.decode(out)] == ["cli test"]
        code, out, _ = await fashiontag("tasks", "status", created.task_id, "--base-url", svc.url)
        assert msgspec.json.decode(out)["count"]["total"] == 7
        code, out, _ = await fashiontag(
            "tasks",
            "results",
            created.task_id,
            "--offset",
            "5",
            "--size",
            "5",
            "--base-url",
            svc.url,
        )
        page = msgspec.json.decode(out)
        assert [r["id"] for r in page["results"]] == ["sku-5", "sku-6"]
        code, _, err = await fashiontag("tasks", "status", "no-such-task", "--base-url", svc.url)
        assert code == 1 and b"HTTP 404" in err


async def test_tasks_list_is_a_table_newest_first_with_a_limit() -> None:
    async with running_service(ServiceConfig()) as svc:
        async with TaggerClient(svc.url) as c:  # no key: the development keys, as the CLI
            for n in range(3):
                await c.create_task(
                    [
                        TaggingRequest(
                            image=Image(type=ImageType.URL, content=f"https://img.example/{n}.jpg"),
                            context=BulkContext(id=f"sku-{n}"),
                        )
                    ],
                    description=f"night {n}",
                )
                await anyio.sleep(0.002)  # distinct createDate milliseconds
        code, out, err = await fashiontag("tasks", "list", "--base-url", svc.url)
        assert code == 0, err
        lines = out.decode().splitlines()
        assert lines[0].split() == [
            "TASK",
            "STATUS",
            "TOTAL",
            "DONE",
            "FAILED",
            "CREATED",
            "DESCRIPTION",
        ]
        assert [line.split()[-1] for line in lines[1:]] == ["2", "1", "0"]  # newest first
        assert b"{" not in out  # not JSON
        code, out, _ = await fashiontag("tasks", "list", "--limit", "1", "--base-url", svc.url)
        lines = out.decode().splitlines()
        assert len(lines) == 3 and lines[1].endswith("night 2") and "2 older tasks" in lines[2]
        code, out, _ = await fashiontag(
            "tasks", "list", "--json", "--limit", "2", "--base-url", svc.url
        )
        assert [t["description"] for t in msgspec.json.decode(out)] == ["night 2", "night 1"]


async def test_a_refused_key_names_where_it_came_from_and_what_to_set() -> None:
    async with running_service(ServiceConfig(api_keys=("s",), bulk_api_keys=("b",))) as svc:
        env = {**ENV, "FASHIONTAG_BULK_API_KEY": "wrong-bulk-secret"}
        result = await anyio.run_process(
            [sys.executable, "-m", "fashiontag_pipeline", "tasks", "list", "--base-url", svc.url],
            check=False,
            env=env,
        )
        err = result.stderr.decode()
        assert result.returncode == 1 and "HTTP 401" in err
        assert "bulk key from FASHIONTAG_BULK_API_KEY was refused" in err
        assert "wrong-bulk-secret" not in err
        code, _, raw = await fashiontag(
            "tag", "https://img.example/a.jpg", "--api-key", "wrong-single", "--base-url", svc.url
        )
        err = raw.decode()
        assert code == 1 and "single-mode key from --api-key was refused" in err
        assert "visible to other users" in err and "wrong-single" not in err
        # No key anywhere: the development key was sent, and the error says so.
        code, _, raw = await fashiontag("tasks", "list", "--base-url", svc.url)
        assert code == 1 and "development default" in raw.decode()
        assert "set FASHIONTAG_BULK_API_KEY" in raw.decode()
        # A key given by flag is used: these are the keys the service accepts.
        code, _, raw = await fashiontag(
            "tasks", "list", "--bulk-api-key", "b", "--base-url", svc.url
        )
        assert code == 0, raw


async def test_a_refused_key_in_quotes_says_so_without_showing_it() -> None:
    # `FASHIONTAG_BULK_API_KEY="b"` in a Docker --env-file or a systemd EnvironmentFile keeps
    # the quotes: the service refuses "b" with them, and the error says what is odd.
    async with running_service(ServiceConfig(api_keys=("s",), bulk_api_keys=("b3x",))) as svc:
        env = {**ENV, "FASHIONTAG_BULK_API_KEY": '"b3x"'}
        result = await anyio.run_process(
            [sys.executable, "-m", "fashiontag_pipeline", "tasks", "list", "--base-url", svc.url],
            check=False,
            env=env,
        )
        err = result.stderr.decode()
        assert result.returncode == 1 and "HTTP 401" in err
        assert "starts and ends with a quote" in err and "b3x" not in err
        code, _, raw = await fashiontag(
            "tag", "https://img.example/a.jpg", "--api-key", "'s' ", "--base-url", svc.url
        )
        err = raw.decode()
        assert code == 1 and "HTTP 401" in err and "starts and ends with a quote" in err
        # Spaces at a key's ends are not sent as the key's (a header's value is read without).
        code, _, raw = await fashiontag(
            "tag", "https://img.example/a.jpg", "--api-key", " s ", "--base-url", svc.url
        )
        assert code == 0, raw
        # A plain wrong key has no such note.
        code, _, raw = await fashiontag(
            "tag", "https://img.example/a.jpg", "--api-key", "t", "--base-url", svc.url
        )
        assert code == 1 and "quote" not in raw.decode()


async def test_help_shows_defaults_key_flags_and_exit_codes() -> None:
    code, out, _ = await fashiontag("run", "--help")
    text = " ".join(out.decode().split())
    assert code == 0
    for fragment in (
        "default: results.jsonl",
        "default: OUT's name with .rejects.jsonl",
        "default: OUT.state",
        "--progress, --no-progress progress on stderr (default: on)",
        "--progress-interval S",
        "--api-key KEY",
        "--bulk-api-key KEY",
        "visible to other users",
        "exit codes:",
        "130 interrupted",
        "(default 120)",
    ):
        assert fragment in text, fragment
    for command in (["tag"], ["tasks", "list"], ["tasks", "status"], ["tasks", "results"]):
        code, out, _ = await fashiontag(*command, "--help")
        assert code == 0 and b"--api-key" in out and b"--bulk-api-key" in out, command
    code, out, _ = await fashiontag("--help")
    assert b"exit codes:" in out
    # (serve --rate and demo --images showed no default, though README says every option does)
    code, out, _ = await fashiontag("serve", "--help")
    assert code == 0 and "0 = none (default 0)" in " ".join(out.decode().split())
    code, out, _ = await fashiontag("demo", "--help")
    text = " ".join(out.decode().split())
    assert code == 0 and "catalogue size, at most 10,000 (default 200)" in text, text


async def test_an_undecodable_image_error_is_plain_text(tmp_path: Path) -> None:
    garbage = tmp_path / "photo.png"
    garbage.write_bytes(b"not an image at all, just text")
    async with running_service(ServiceConfig()) as svc:
        code, out, _ = await fashiontag("tag", str(garbage), "--base-url", svc.url)
    error = msgspec.json.decode(out)["error"]
    assert code == 1 and error["code"] == 805
    assert "object at 0x" not in error["message"] and "decoded" in error["message"]


async def test_verbose_is_taken_after_the_command_too(tmp_path: Path) -> None:
    """README: "`-v` logs every retry". `fashiontag run m.csv -v` (where a user types it)
    was exit 2, "unrecognized arguments: -v": only `fashiontag -v run ...` was taken."""
    manifest = tmp_path / "m.csv"
    manifest.write_text("id,url\na,https://img.example/a.jpg\n")
    async with running_service(ServiceConfig()) as svc:
        for verbose in (["-v"], ["-vv"], ["--verbose"]):
            code, _, err = await fashiontag(
                "run",
                str(manifest),
                "--out",
                str(tmp_path / "o.jsonl"),
                "--restart",
                "--base-url",
                svc.url,
                "--no-progress",
                *verbose,
            )
            assert code == 0, err
        code, _, err = await fashiontag("tasks", "list", "-vv", "--base-url", svc.url)
        assert code == 0 and b"DEBUG" in err, err


async def test_tag_starts_no_retry_past_give_up_after_on_a_service_that_never_answers(
    tmp_path: Path,
) -> None:
    """``--give-up-after``: "no retry starts ... past ``seconds`` after a call began failing".
    A request that hung to its deadline past that point was sent once more all the same, to
    its deadline again: ``tag`` against a service that takes connections and never answers took
    142 s at the defaults (30 s; a 70 s deadline, twice)."""
    connections = []

    async def hang(stream: anyio.abc.SocketStream) -> None:
        connections.append(stream)
        async with stream:
            await anyio.sleep_forever()

    config = tmp_path / "c.toml"
    config.write_text("[client.timeout]\nconnect = 0.5\nread = 0.5\n")
    listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
    port = listener.extra(anyio.abc.SocketAttribute.local_port)
    async with listener, anyio.create_task_group() as tg:
        tg.start_soon(listener.serve, hang)
        for command in (["tag", "https://img.example/1.jpg"], ["tasks", "list"]):
            connections.clear()
            code, _, err = await fashiontag(
                *command,
                "--base-url",
                f"http://127.0.0.1:{port}",
                "--config",
                str(config),
                "--give-up-after",
                "0.5",
            )
            assert code == 1 and b"timed out" in err, err
            assert len(connections) == 1, (command, len(connections), err)
        tg.cancel_scope.cancel()


async def test_an_answer_to_a_full_disk_is_one_line_not_a_traceback(tmp_path: Path) -> None:
    """``fashiontag tasks results ID > page.json`` (or ``tag``, ``tasks list``, ``reuse
    stats``, ``reuse prune``) on a full disk (``/dev/full`` here): a traceback ending in
    ``OSError: [Errno 28]``. One line naming stdout and the reason now, exit 1."""
    store = tmp_path / "store.db"
    open_store(store).close()
    async with running_service(ServiceConfig()) as svc:
        async with TaggerClient(svc.url, api_key=DEV_API_KEY, bulk_api_key=DEV_BULK_API_KEY) as c:
            created = await c.create_task(
                [
                    TaggingRequest(
                        image=Image(type=ImageType.URL, content=f"https://img.example/{i}.jpg"),
                        context=BulkContext(id=f"sku-{i}"),
                    )
                    for i in range(3)
                ],
                description="cli test",
            )
        for command in (
            ["tag", "https://img.example/look.jpg"],
            ["tasks", "list"],
            ["tasks", "list", "--json"],
            ["tasks", "status", created.task_id],
            ["tasks", "results", created.task_id],
            ["reuse", "stats", str(store)],
            ["reuse", "stats", str(store), "--json"],
            # (a traceback still: the store pruned, its line unwritten)
            ["reuse", "prune", "--older-than", "1d", str(store)],
        ):
            url = [] if command[0] == "reuse" else ["--base-url", svc.url]
            with open("/dev/full", "wb") as full:
                result = await anyio.run_process(
                    [sys.executable, "-m", "fashiontag_pipeline", *command, *url],
                    check=False,
                    env=ENV,
                    stdout=full,
                )
            err = result.stderr.decode()
            assert result.returncode == 1, (command, err[-600:])
            assert "Traceback" not in err and len(err.strip().splitlines()) == 1, (command, err)
            assert "cannot write to stdout: No space left on device" in err, (command, err)


async def test_a_password_given_in_a_url_flag_is_warned_of_as_a_key_flag_is(
    tmp_path: Path,
) -> None:
    """A key given as ``--api-key`` is warned of (every user of the machine reads it in
    ``ps``), but a password in a URL flag was not: ``--base-url https://tagger:PW@gw/``,
    ``--state`` / ``--reuse postgresql://u:PW@db/...`` (in a crontab line, every night) and
    ``reuse stats postgresql://u:PW@...``. Each is warned of, with what to use instead
    (``FASHIONTAG_BASE_URL`` or a config file; ``PGPASSWORD`` or ``~/.pgpass``, which libpq
    reads), the password never shown; a URL without one is not."""
    manifest = tmp_path / "m.csv"
    manifest.write_text("id,url\np1,https://img.example/1.jpg\n")
    dead = dead_port()
    pg = f"postgresql://tagger:pgLEAK-31337@127.0.0.1:{dead}/fashiontag"
    code, _, raw = await fashiontag(
        *("run", str(manifest), "--out", str(tmp_path / "o.jsonl")),
        *("--base-url", f"http://tagger:webLEAK-4242@127.0.0.1:{dead}"),
        *("--state", pg, "--reuse", pg, "--give-up-after", "1"),
    )
    err = raw.decode()
    assert code != 0 and "LEAK" not in err, err
    for flag, instead in (
        ("--base-url", "FASHIONTAG_BASE_URL"),
        ("--state", "PGPASSWORD"),
        ("--reuse", "PGPASSWORD"),
    ):
        assert f"{flag} is visible to other users" in err and instead in err, (flag, err)
    code, _, raw = await fashiontag("reuse", "stats", pg)
    err = raw.decode()
    assert code != 0 and "LEAK" not in err, err
    assert "is visible to other users" in err and "PGPASSWORD" in err, err
    code, _, raw = await fashiontag(
        "tasks", "list", "--base-url", f"http://127.0.0.1:{dead}", "--give-up-after", "1"
    )
    assert code == 1 and "visible" not in raw.decode(), raw.decode()


@pytest.mark.parametrize(
    "query",
    [
        "application_name=nightly%20tags",
        "options=-c%20statement_timeout%3D5000",
        "passfile=%2Fsecrets%2Fpgpass",
    ],
    ids=["app-name", "options", "passfile"],
)
async def test_a_postgresql_url_without_a_password_is_not_warned_of(query: str) -> None:
    """A ``--state``/``--reuse``/``reuse stats`` URL with no password but an encoded query
    (``application_name=nightly%20tags``, libpq's ``options=-c%20...``, the ``passfile``
    holding the password): it was warned of as holding a password ("the password in its URL
    with it"), since the check compared the URL with its masked form, which re-encodes the
    query."""
    dead = dead_port()
    for url in (
        f"postgresql://tagger@127.0.0.1:{dead}/fashiontag?{query}",
        f"postgresql:///fashiontag?host=%2Ftmp&port={dead}&{query}",
    ):
        code, _, raw = await fashiontag("reuse", "stats", url)
        err = raw.decode()
        assert code != 0 and "visible to other users" not in err, (url, err)
