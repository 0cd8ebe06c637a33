"""A trust store loaded when TLS is first used, not when aiohttp is imported.

aiohttp builds its two default SSL contexts at import time, and each loads the system's CA
bundle: ~35 ms of CPU in every process (a sixth of the engine's start-up), spent even when the
service is an ``http://`` URL and no TLS connection is ever made. While aiohttp is imported
under :func:`deferred_trust_store`, a context's "load the default trust store" calls
(``load_default_certs``, ``set_default_verify_paths``) are recorded on the context instead,
and replayed, under a lock, just before that context first wraps a connection or is asked
what it trusts. Verification is unchanged: the same certificates are trusted, with the same
verify mode and hostname checks, from the first handshake on.

:func:`certificate_problem` says what is wrong with a certificate refused, and what to do.
"""

from __future__ import annotations

import contextlib
import ssl
import threading
from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["certificate_problem", "deferred_trust_store", "trust_pending"]

#: The methods that load the default trust store (deferred), and those that need it loaded.
_LOADERS = ("load_default_certs", "set_default_verify_paths")
_USERS = ("wrap_bio", "wrap_socket", "cert_store_stats", "get_ca_certs")
_PENDING = "_fashiontag_deferred_trust"
_lock = threading.Lock()
#: Blocks of :func:`deferred_trust_store` open (only the outermost patches ``SSLContext``).
_depth = 0


def trust_pending(context: ssl.SSLContext) -> bool:
    """True while ``context`` holds a deferred trust store not loaded yet."""
    return bool(context.__dict__.get(_PENDING))


def _load(context: ssl.SSLContext) -> None:
    """Replay the deferred loads of ``context`` once and drop its first-use hooks."""
    with _lock:
        pending = context.__dict__.pop(_PENDING, None)
        for name in _USERS:
            context.__dict__.pop(name, None)
        for load in pending or ():
            load()


def _defer(context: ssl.SSLContext, load: Callable[[], None]) -> None:
    with _lock:
        pending = context.__dict__.setdefault(_PENDING, [])
        pending.append(load)
        if len(pending) > 1:
            return
        for name in _USERS:
            real = getattr(type(context), name)

            def first_use(*args: Any, _real: Any = real, **kwargs: Any) -> Any:
                _load(context)
                return _real(context, *args, **kwargs)

            # An instance attribute shadows the class's method for this context only.
            context.__dict__[name] = first_use


@contextlib.contextmanager
def deferred_trust_store() -> Iterator[None]:
    """Within the block, a new ``ssl.SSLContext`` (``ssl.create_default_context()`` too) loads
    its default trust store on first use. Meant for one import at start-up (aiohttp's).

    Inside another such block it changes nothing (the client's modules import aiohttp under
    one, and the package's finder, :mod:`._aiohttp_import`, defers that same import): a
    second layer would record the first layer's loader as the real one, and its replay, under
    the lock, would ask for the lock again."""
    global _depth
    if _depth:
        _depth += 1
        try:
            yield
        finally:
            _depth -= 1
        return
    cls = ssl.SSLContext
    own = {name: cls.__dict__.get(name) for name in _LOADERS}
    real = {name: getattr(cls, name) for name in _LOADERS}

    def load_default_certs(self: ssl.SSLContext, purpose: Any = ssl.Purpose.SERVER_AUTH) -> None:
        _defer(self, lambda: real["load_default_certs"](self, purpose))

    def set_default_verify_paths(self: ssl.SSLContext) -> None:
        _defer(self, lambda: real["set_default_verify_paths"](self))

    setattr(cls, "load_default_certs", load_default_certs)  # noqa: B010
    setattr(cls, "set_default_verify_paths", set_default_verify_paths)  # noqa: B010
    _depth = 1
    try:
        yield
    finally:
        _depth = 0
        for name, method in own.items():
            if method is None:
                delattr(cls, name)
            else:
                setattr(cls, name, method)


#: OpenSSL's verify codes of a certificate whose issuer is not in the trust store.
_UNTRUSTED_ISSUER = frozenset({2, 18, 19, 20, 21})
#: ... and of a certificate for another host name (62) or address (64).
_NAME_MISMATCH = frozenset({62, 64})


def certificate_problem(cert: BaseException, shown_url: str) -> str:
    """What is wrong with the service's certificate, and what to do about it."""
    code = getattr(cert, "verify_code", None)
    reason = getattr(cert, "verify_message", None) or getattr(cert, "reason", None) or str(cert)
    if code in _NAME_MISMATCH:
        return (
            f"the TLS certificate of {shown_url} is for another name ({reason}): give the base"
            " URL with a host name the certificate holds"
        )
    if code in _UNTRUSTED_ISSUER:
        return f"the TLS certificate of {shown_url} is not trusted ({reason}): {_ca_advice()}"
    return f"the TLS certificate of {shown_url} is refused ({reason})"


def _ca_advice() -> str:
    """What to do about a certificate whose issuer is not trusted, as ``SSL_CERT_FILE`` is
    set: OpenSSL loads nothing, and says nothing, from a file that is not there (a typo, a
    path relative to another directory than a cron job's) or holds no PEM certificate (a CA
    exported in DER form)."""
    import os

    path = os.environ.get("SSL_CERT_FILE")
    if not path:
        return (
            "if it comes from a private CA, give that CA's certificates in SSL_CERT_FILE"
            " (a PEM file)"
        )
    given = f"SSL_CERT_FILE={path!r}"
    try:
        with open(path, "rb") as file:
            head = file.read(1 << 20)
    except OSError as err:
        if not os.path.isfile(path):
            where = "" if os.path.isabs(path) else f" (a relative path, from {os.getcwd()})"
            return f"{given} names no file{where}: give the path of the CA's certificates (PEM)"
        return f"{given} cannot be read ({err.strerror or err})"
    if b"-----BEGIN CERTIFICATE-----" not in head:
        return (
            f"{given} holds no PEM certificate (a DER file? convert it: openssl x509 -inform"
            " der -in FILE -out ca.pem)"
        )
    return f"{given} holds no CA that signed it: add that CA's certificates to it (PEM)"
