"""aiohttp's default SSL contexts load their trust store on first use, not at import.

Each check runs in a fresh interpreter: in the test process aiohttp may have been imported
before the package, and the deferral only applies to the import that the package makes.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest


def _run(code: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_trust_store_is_deferred_and_complete() -> None:
    """Nothing is loaded at import; the first use loads exactly what a default context
    trusts, with verification settings untouched; ssl.SSLContext itself is left as it was."""
    out = _run(
        """
        import ssl
        import fashiontag_pipeline
        import aiohttp.connector as c
        from fashiontag_pipeline._tls import trust_pending

        v, u = c._SSL_CONTEXT_VERIFIED, c._SSL_CONTEXT_UNVERIFIED
        assert trust_pending(v) and trust_pending(u)
        assert ssl.SSLContext.cert_store_stats(v)["x509_ca"] == 0
        assert v.verify_mode == ssl.CERT_REQUIRED and v.check_hostname
        assert u.verify_mode == ssl.CERT_NONE and not u.check_hostname
        assert v.cert_store_stats() == ssl.create_default_context().cert_store_stats()
        assert not trust_pending(v) and trust_pending(u)
        assert "set_default_verify_paths" not in ssl.SSLContext.__dict__
        assert ssl.SSLContext.load_default_certs.__module__ == "ssl"
        fresh = ssl.create_default_context()
        assert fresh.__dict__ == {} or not trust_pending(fresh)
        print("ok")
        """
    )
    assert out.strip() == "ok"


@pytest.mark.parametrize(
    "first", ["fashiontag_pipeline.service", "fashiontag_pipeline.daemon", "fashiontag_pipeline"]
)
def test_trust_store_is_deferred_whoever_imports_aiohttp_first(first: str) -> None:
    """The package's root loads its names on first use, so aiohttp's first import may come
    from the reference service, the daemon or the program itself: each is deferred."""
    out = _run(
        f"""
        import {first}
        import aiohttp
        import aiohttp.connector as c
        from fashiontag_pipeline._tls import trust_pending

        assert trust_pending(c._SSL_CONTEXT_VERIFIED) and trust_pending(c._SSL_CONTEXT_UNVERIFIED)
        assert type(aiohttp.__spec__.loader).exec_module is not None
        import sys
        assert not any(type(f).__name__ == "_DeferredTrustFinder" for f in sys.meta_path)
        print("ok")
        """
    )
    assert out.strip() == "ok"


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")
@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_first_handshake_loads_the_trust_store_and_verifies(tmp_path: Path, loop: str) -> None:
    """A TLS server on loopback with a self-signed certificate: the client's first handshake
    goes through the deferred context, loads the trust store, and refuses the certificate."""
    if loop == "uvloop":
        pytest.importorskip("uvloop")
    runner = "asyncio.run(main())" if loop == "asyncio" else "import uvloop; uvloop.run(main())"
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        [
            *("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"),
            *("-subj", "/CN=127.0.0.1", "-keyout", str(key), "-out", str(cert)),
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )
    out = _run(
        f"""
        import asyncio, ssl
        import fashiontag_pipeline
        import aiohttp, aiohttp.connector as c
        from fashiontag_pipeline._tls import trust_pending

        async def main():
            server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            server_ctx.load_cert_chain({str(cert)!r}, {str(key)!r})

            async def serve(reader, writer):
                writer.close()

            server = await asyncio.start_server(serve, "127.0.0.1", 0, ssl=server_ctx)
            port = server.sockets[0].getsockname()[1]
            assert trust_pending(c._SSL_CONTEXT_VERIFIED)
            try:
                async with aiohttp.ClientSession() as session:
                    async with session.get(f"https://127.0.0.1:{{port}}/"):
                        raise AssertionError("a self-signed certificate was accepted")
            except aiohttp.ClientConnectorCertificateError:
                pass
            assert not trust_pending(c._SSL_CONTEXT_VERIFIED)
            server.close()
            await server.wait_closed()
            print("refused")

        {runner}
        """
    )
    assert out.strip() == "refused"


def test_a_deferral_inside_another_loads_once_at_first_use() -> None:
    """aiohttp imported under the deferral by a module that is itself inside one (the client
    module's own ``with`` around the import the package's finder defers too): the first use
    loads the trust store once. Nested, the inner deferral recorded the outer one's loader,
    which took the lock the replay held: the first TLS handshake hung for ever."""
    out = _run(
        """
        import ssl
        import threading
        from fashiontag_pipeline._tls import deferred_trust_store, trust_pending

        with deferred_trust_store():
            with deferred_trust_store():
                ctx = ssl.create_default_context()
        assert trust_pending(ctx)
        done = []
        worker = threading.Thread(target=lambda: done.append(ctx.cert_store_stats()), daemon=True)
        worker.start()
        worker.join(10)
        assert done, "the first use of the context hung"
        assert done[0] == ssl.create_default_context().cert_store_stats()
        assert ssl.SSLContext.load_default_certs.__module__ == "ssl"
        print("ok")
        """
    )
    assert out.strip() == "ok"
