"""Configuration: TOML decoding with field-naming errors, environment overrides, secrets."""

from __future__ import annotations

import pickle
from pathlib import Path

import anyio
import msgspec
import pytest

from fashiontag_pipeline import (
    AuthenticationError,
    ClientConfig,
    ConfigError,
    RetryPolicy,
    Secret,
    TaggerClient,
    load_client_config,
)
from fashiontag_pipeline._config import to_builtins

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "config.toml"
    path.write_text(text)
    return path


def test_defaults_without_file_or_environment() -> None:
    config = load_client_config(environ={})
    assert config.base_url == "http://127.0.0.1:8080"
    assert config.api_key is None and config.language == "en"
    assert config.retry == RetryPolicy()


def test_file_then_environment_then_flags(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
[client]
base_url = "http://file:1"
api_key = "file-key"
language = "ko"
[client.retry]
max_attempts = 9
[client.timeout]
read = 5.5
""",
    )
    config = load_client_config(path, environ={})
    assert config.base_url == "http://file:1" and config.language == "ko"
    assert config.retry.max_attempts == 9 and config.timeout.read == 5.5
    assert config.api_key == Secret("file-key")
    env = {"FASHIONTAG_BASE_URL": "http://env:2", "FASHIONTAG_BULK_API_KEY": "env-bulk"}
    config = load_client_config(path, environ=env)
    assert config.base_url == "http://env:2" and config.bulk_api_key == Secret("env-bulk")
    config = load_client_config(
        path, environ=env, overrides={"base_url": "http://flag:3", "language": None}
    )
    assert config.base_url == "http://flag:3" and config.language == "ko"


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("[client]\nretry = { max_attempts = 'many' }", "client.retry.max_attempts"),
        ("[client]\ntimeout = { conect = 1.0 }", "conect"),
        ("[client]\nlanguage = 'fr'", "language must be one of"),
        ("[client]\nbase_url = 'ftp://x'", "base_url must start with http"),
        ("[client]\nretry = { max_attempts = 0 }", "max_attempts must be at least 1"),
        ("[client]\napi_key = 42", "client.api_key"),
        ("client = 3", "[client]"),
        ("[client\n", "not valid TOML"),
    ],
)
def test_bad_files_give_a_clear_error_naming_the_field(
    tmp_path: Path, text: str, fragment: str
) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_client_config(path, environ={})
    assert fragment in str(info.value)


def test_a_key_above_every_table_is_named_as_a_key_not_a_table(tmp_path: Path) -> None:
    """``base_url = ...`` above ``[client]`` (a key outside every table) was refused as
    "has [base_url], which no command reads", as if the file had a table of that name: the
    user looked for a ``[base_url]`` line the file does not have."""
    path = write(tmp_path, "base_url = 'http://x:1'\n[client]\nlanguage = 'en'\n")
    with pytest.raises(ConfigError) as info:
        load_client_config(path, environ={})
    text = str(info.value)
    assert "[base_url]" not in text and "the key base_url outside any table" in text, text
    assert "[client]" in text


def test_missing_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not found"):
        load_client_config(tmp_path / "absent.toml", environ={})


def test_secrets_are_masked_everywhere(tmp_path: Path) -> None:
    path = write(tmp_path, '[client]\napi_key = "hunter2-key"\nbulk_api_key = "bulk-hunter2"\n')
    config = load_client_config(path, environ={})
    client = TaggerClient(config=config)
    shown = " ".join(
        [repr(config), str(config), repr(client), msgspec.json.encode(to_builtins(config)).decode()]
    )
    assert "hunter2" not in shown
    assert "********" in shown
    assert config.api_key is not None and config.api_key.reveal() == "hunter2-key"
    with pytest.raises(TypeError):
        pickle.dumps(config.api_key)


def test_shipped_example_configs_decode_in_every_section() -> None:
    from fashiontag_pipeline._config import load_section, read_toml
    from fashiontag_pipeline.daemon.config import DaemonConfig
    from fashiontag_pipeline.engine import EngineConfig
    from fashiontag_pipeline.service.cli import ServiceConfigFile

    files = sorted(CONFIGS.glob("*.toml"))
    assert files, "configs/ ships example files"
    sections = {"engine": EngineConfig, "service": ServiceConfigFile, "daemon": DaemonConfig}
    for path in files:
        load_client_config(path, environ={})
        for name in read_toml(path):
            assert name in {"client", *sections}, f"{path.name}: unknown section [{name}]"
            if name in sections:
                load_section(path, name, sections[name])


def test_example_engine_config_states_the_defaults() -> None:
    """configs/engine.toml documents the defaults: it must not drift from the code."""
    from fashiontag_pipeline._config import load_section
    from fashiontag_pipeline.engine import EngineConfig

    assert load_section(CONFIGS / "engine.toml", "engine", EngineConfig) == EngineConfig()


def test_a_plain_str_key_is_wrapped_and_masked() -> None:
    from fashiontag_pipeline import ClientConfig

    config = ClientConfig(api_key="plain-single-key", bulk_api_key="plain-bulk-key")
    assert isinstance(config.api_key, Secret) and isinstance(config.bulk_api_key, Secret)
    assert config.bulk_api_key.reveal() == "plain-bulk-key"
    assert "plain-" not in repr(config) and "plain-" not in str(to_builtins(config))
    with pytest.raises(TypeError):
        ClientConfig(api_key=42)  # type: ignore[arg-type]


def test_every_key_knows_where_it_came_from(tmp_path: Path) -> None:
    path = write(tmp_path, '[client]\napi_key = "file-key"\nbulk_api_key = "file-bulk"\n')
    config = load_client_config(
        path, environ={"FASHIONTAG_API_KEY": "env-key"}, overrides={"bulk_api_key": "flag"}
    )
    assert config.api_key is not None and config.api_key.source == "FASHIONTAG_API_KEY"
    assert config.bulk_api_key is not None and config.bulk_api_key.source == "--bulk-api-key"
    config = load_client_config(path, environ={})
    assert config.api_key is not None and config.api_key.source == f"api_key in [client] of {path}"


async def test_library_clients_send_the_development_keys_when_none_is_configured(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from fashiontag_pipeline import ClientConfig
    from fashiontag_pipeline.service import ServiceConfig, running_service

    monkeypatch.delenv("FASHIONTAG_API_KEY", raising=False)  # (set, they would be sent)
    monkeypatch.delenv("FASHIONTAG_BULK_API_KEY", raising=False)

    async with running_service(ServiceConfig()) as svc:
        async with TaggerClient(config=ClientConfig(base_url=svc.url)) as client:
            assert await client.list_tasks() == []
        async with TaggerClient(svc.url, bulk_api_key="dev-bulk-api-key") as client:
            assert await client.list_tasks() == []


async def test_library_clients_send_the_keys_of_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A program that exported FASHIONTAG_API_KEY / FASHIONTAG_BULK_API_KEY and ran the
    README's example (``ClientConfig(base_url=...)``, no key given) sent the development keys:
    its run was refused, "the bulk key from the development default (no key configured) was
    refused: set FASHIONTAG_BULK_API_KEY", the variable it had set. With no key given, the
    library takes the variables, as the CLI does; the development keys only without them."""
    from fashiontag_pipeline.engine import EngineConfig, run_pipeline
    from fashiontag_pipeline.service import ServiceConfig, running_service

    monkeypatch.setenv("FASHIONTAG_API_KEY", "my-key")
    monkeypatch.setenv("FASHIONTAG_BULK_API_KEY", "my-bulk")
    manifest = tmp_path / "catalogue.csv"
    manifest.write_text("id,url\nsku-1,https://img.example/1.jpg\n")
    service = ServiceConfig(api_keys=("my-key",), bulk_api_keys=("my-bulk",))
    async with running_service(service) as svc:
        async with TaggerClient(config=ClientConfig(base_url=svc.url)) as client:
            assert await client.list_tasks() == []
        summary = await run_pipeline(
            [manifest],
            client=ClientConfig(base_url=svc.url),
            out=tmp_path / "results.jsonl",
            rejects=tmp_path / "rejects.jsonl",
            engine=EngineConfig(give_up_after=2.0, poll_min=0.02, linger_seconds=0.05),
        )
        assert summary.complete and summary.tagged == 1
        # A variable's key refused: the error names the variable, never the key.
        monkeypatch.setenv("FASHIONTAG_BULK_API_KEY", "stale-bulk")
        async with TaggerClient(config=ClientConfig(base_url=svc.url)) as client:
            with pytest.raises(AuthenticationError) as refused:
                await client.list_tasks()
        assert "the bulk key from FASHIONTAG_BULK_API_KEY was refused" in str(refused.value)
        assert "stale-bulk" not in str(refused.value)
        # An empty variable is none (``FASHIONTAG_API_KEY= cmd``): the development keys.
        monkeypatch.setenv("FASHIONTAG_API_KEY", "")
        monkeypatch.setenv("FASHIONTAG_BULK_API_KEY", "")
        async with TaggerClient(config=ClientConfig(base_url=svc.url)) as client:
            with pytest.raises(AuthenticationError, match="development default"):
                await client.list_tasks()


@pytest.mark.parametrize(
    "url",
    [
        "https://tagger.example/?api_key=hunter2-in-query",
        "https://tagger.example/base?key=hunter2-in-query&x=1",
        "https://tagger.example/#hunter2-in-query",
    ],
)
def test_a_base_url_with_a_query_or_fragment_is_refused_without_showing_it(url: str) -> None:
    """Request URLs are the base URL and a path: a query there would put the path after it
    (``/?api_key=K/tagger/...``, every request a 404), and a key placed in it would show in
    every retry line. Refused at once, the query not echoed (it may be a key)."""
    with pytest.raises(ValueError, match="base_url must not hold a query") as info:
        ClientConfig(base_url=url)
    assert "hunter2" not in str(info.value)
    env = {"FASHIONTAG_BASE_URL": url}
    with pytest.raises(ConfigError, match="base_url must not hold a query") as err:
        load_client_config(None, environ=env)
    assert "hunter2" not in str(err.value)


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1: 8080",  # a space typed after the colon
        "http://127.0.0.1:8080 /tagging",  # a space before the gateway's prefix
        "http://127.0.0.1:+8080",
    ],
)
def test_a_base_url_whose_port_is_not_digits_is_named_with_its_source(
    tmp_path: Path, url: str
) -> None:
    """A port with a space or a sign in it: yarl's check took it (``int(" 8080")``), and the
    proxy look-up then failed on it, so ``run``, ``tag``, ``tasks`` and the daemon said only
    ``fashiontag: Port could not be cast to integer value as ' 8080'`` (``tag``: after a
    traceback): no base_url, no file or variable, unlike every other bad base URL (docs: one
    line naming where the value came from)."""
    import os
    import subprocess
    import sys

    config = write(tmp_path, f'[client]\nbase_url = "{url}"\n')
    env = {k: v for k, v in os.environ.items() if not k.startswith("FASHIONTAG_")}
    for command in (["tag", "https://img.example/a.jpg"], ["tasks", "list"]):
        done = subprocess.run(
            [sys.executable, "-m", "fashiontag_pipeline", *command, "--config", str(config)],
            capture_output=True,
            text=True,
            timeout=60,
            env=env,
        )
        assert done.returncode == 2, (command, done.stderr)
        assert "Traceback" not in done.stderr, done.stderr
        assert "base_url" in done.stderr and str(config) in done.stderr, done.stderr
    with pytest.raises(ValueError, match="base_url"):
        ClientConfig(base_url=url)


@pytest.mark.parametrize(
    "host",
    ["127.1", "192.168.1.300", "192.168.001.010", "127.0.0.1.", "2130706433"],
)
def test_a_base_url_whose_host_is_no_ipv4_address_as_written_is_refused_at_once(
    tmp_path: Path, host: str
) -> None:
    """A host of digits and dots that is no dotted quad (a shorthand ``127.1``, an octet past
    255, zero-padded octets, a trailing dot): aiohttp refuses to connect to it, and the client
    took that for an outage, retried it for the whole ``--give-up-after`` (120 s for ``run``,
    its creates said to be of unknown fate), then stopped with ``service unreachable ...
    failed: InvalidUrlClientError``, the reason never said. Exit 2 at once, one line naming
    base_url and where it came from."""
    import os
    import subprocess
    import sys

    url = f"http://{host}:8080"
    config = write(tmp_path, f'[client]\nbase_url = "{url}"\n')
    env = {k: v for k, v in os.environ.items() if not k.startswith("FASHIONTAG_")}
    done = subprocess.run(
        [
            *(sys.executable, "-m", "fashiontag_pipeline", "tag", "https://img.example/a.jpg"),
            *("--config", str(config), "--give-up-after", "2"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert done.returncode == 2, done.stderr
    assert "base_url" in done.stderr and str(config) in done.stderr, done.stderr
    assert "InvalidUrlClientError" not in done.stderr
    with pytest.raises(ValueError, match="base_url"):
        ClientConfig(base_url=url)
    ClientConfig(base_url="http://10.0.0.1:8080")  # (a dotted quad is one)


@pytest.mark.parametrize("where", ["flag", "file"])
async def test_an_empty_key_is_refused_naming_where_it_came_from(
    tmp_path: Path, where: str
) -> None:
    """``--bulk-api-key "$BULK_KEY"`` in a crontab where the variable is unset (or
    ``bulk_api_key = ""`` left in a file): the empty key won over the good one in
    ``FASHIONTAG_BULK_API_KEY`` (the file's over the development key), was sent, and the
    service's 401 was reported as the key from --bulk-api-key being *refused*, as if its
    value were wrong. Exit 2 before any request, saying it is empty and where it came from."""
    import os
    import sys

    from fashiontag_pipeline._config import DEV_API_KEY, DEV_BULK_API_KEY
    from fashiontag_pipeline.service import ServiceConfig, running_service

    env = {k: v for k, v in os.environ.items() if not k.startswith("FASHIONTAG_")}
    env |= {"FASHIONTAG_API_KEY": DEV_API_KEY, "FASHIONTAG_BULK_API_KEY": DEV_BULK_API_KEY}
    extra = ["--bulk-api-key", ""]
    named = "--bulk-api-key"
    if where == "file":
        config = write(tmp_path, '[client]\nbulk_api_key = ""\n')
        extra, named = ["--config", str(config)], f"bulk_api_key in [client] of {config}"
        del env["FASHIONTAG_BULK_API_KEY"]  # (which would win over the file's)
    async with running_service(ServiceConfig()) as svc:
        argv = [sys.executable, "-m", "fashiontag_pipeline", "tasks", "list"]
        done = await anyio.run_process([*argv, "--base-url", svc.url, *extra], check=False, env=env)
    err = done.stderr.decode()
    assert done.returncode == 2, err
    assert "empty" in err and named in err, err


@pytest.mark.parametrize(
    "host",
    ["tagger..example.com", "a" * 64 + ".example.com", "xn--zz.example.com"],
    ids=["empty-label", "long-label", "bad-punycode"],
)
def test_a_base_url_whose_host_is_no_valid_name_is_refused_at_once(
    tmp_path: Path, host: str
) -> None:
    """A host name no resolver takes (a double dot typed, a label longer than 63 characters,
    ``xn--`` that is no punycode): the client met Python's IDNA codec at its first request,
    and ``run``, ``tag`` and ``tasks`` ended in a 100-line traceback (``UnicodeError: encoding
    with 'idna' codec failed``), the URL never named. Exit 2 at once, one line naming base_url
    and where it came from (its password masked)."""
    import os
    import subprocess
    import sys

    url = f"https://team:pw-secret@{host}/v1"
    config = write(tmp_path, f'[client]\nbase_url = "{url}"\n')
    env = {k: v for k, v in os.environ.items() if not k.startswith("FASHIONTAG_")}
    manifest = tmp_path / "m.csv"
    manifest.write_text("id,url\np1,https://img.example/1.jpg\n")
    for command in (
        ("tag", "https://img.example/a.jpg"),
        ("tasks", "list"),
        ("run", str(manifest), "--out", str(tmp_path / "o.jsonl")),
    ):
        done = subprocess.run(
            [
                *(sys.executable, "-m", "fashiontag_pipeline", *command),
                *("--config", str(config), "--give-up-after", "2"),
            ],
            capture_output=True,
            text=True,
            timeout=60,
            env=env,
            cwd=tmp_path,
        )
        assert done.returncode == 2, (command, done.stderr[-1500:])
        assert "Traceback" not in done.stderr, done.stderr[-1500:]
        assert "base_url" in done.stderr and str(config) in done.stderr, done.stderr
        assert "pw-secret" not in done.stderr, done.stderr
    with pytest.raises(ValueError, match="base_url"):
        ClientConfig(base_url=url)
