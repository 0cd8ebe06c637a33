"""The forward proxy the environment names for the service, decided once per client.

``HTTPS_PROXY`` (for an ``https://`` service) and ``HTTP_PROXY`` (for ``http://``), either case,
the lower-case spelling first, as curl, pip and Python's ``urllib`` read them; ``NO_PROXY``
(comma-separated host names or domain suffixes, ``*`` for every host) names services reached
directly. A service on this machine's loopback (``localhost``, ``127.0.0.0/8``, ``::1``) is always
reached directly: a proxy elsewhere cannot reach this machine's loopback, and a cron or CI
environment that sets a proxy for the internet must not turn a run against the embedded
reference service into a failure.

The decision is made once (the base URL's host never changes), not per request: aiohttp's own
``trust_env`` reads the environment in a worker thread for every request, and reads ``~/.netrc``
too, which would send a password found there to the service.
"""

from __future__ import annotations

import base64
import ipaddress
import os
from collections.abc import Mapping

import msgspec

from ._config import shown_url
from ._exceptions import ConfigError
from ._urls import NAME_RULES, no_ipv4_as_written, not_a_host_name

__all__ = ["ProxyRoute", "proxy_for", "proxy_wants_credentials"]


class ProxyRoute(msgspec.Struct, frozen=True):
    """A proxy to send the service's requests through (a Struct: created in C, where a
    dataclass exec()s its generated methods at every start-up)."""

    #: ``http://host:port`` (its credentials are in ``headers``, never in the URL).
    url: str
    #: The variable it came from (``HTTPS_PROXY``, ``https_proxy``, ...).
    source: str
    #: ``Proxy-Authorization`` when the variable held ``user:password@`` (not in the repr).
    headers: dict[str, str] = msgspec.field(default_factory=dict)

    def __repr__(self) -> str:
        return f"ProxyRoute(url={self.url!r}, source={self.source!r})"

    @property
    def shown(self) -> str:
        """As messages show it: ``http://proxy:3128 (from HTTPS_PROXY)``."""
        return f"{self.url} (from {self.source})"


def _loopback(host: str) -> bool:
    host = host.strip("[]").lower()
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _bypassed(host: str, port: int | None, no_proxy: str) -> bool:
    """Whether ``NO_PROXY`` names the host: ``*``, the host itself or a domain it is under
    (``example.com``, ``.example.com`` and ``*.example.com`` all cover ``api.example.com``),
    either with the service's port (``host:8443``; ``port``: the scheme's default when the
    URL names none), or a network holding its address (``10.0.0.0/8``)."""
    host = host.strip("[]").lower().rstrip(".")
    try:
        address: ipaddress.IPv4Address | ipaddress.IPv6Address | None = ipaddress.ip_address(host)
    except ValueError:
        address = None
    for entry in no_proxy.lower().split(","):
        entry = entry.strip()
        if entry == "*":
            return True
        if not entry:
            continue
        if "/" in entry and address is not None:
            try:
                if address in ipaddress.ip_network(entry, strict=False):
                    return True
            except ValueError:
                pass
            continue
        name, _, entry_port = entry.rpartition(":") if entry.count(":") == 1 else (entry, "", "")
        if entry_port and (port is None or entry_port != str(port)):
            continue
        name = name.strip("[]").lstrip("*.").rstrip(".")  # (``*.example.com``: as Go reads it)
        if host == name or host.endswith("." + name):
            return True
    return False


def _variable(environ: Mapping[str, str], name: str) -> tuple[str, str] | None:
    """(variable, value) of ``name``, the lower-case spelling first; None when unset or empty."""
    for var in (name.lower(), name.upper()):
        value = environ.get(var, "").strip()
        if value:
            return var, value
    return None


def proxy_for(
    scheme: str, host: str, port: int | None, environ: Mapping[str, str] | None = None
) -> ProxyRoute | None:
    """The proxy for a service at ``scheme://host:port`` (None: reach it directly).

    Raises :class:`ConfigError` for a proxy this client cannot use (not an ``http://`` URL)."""
    env = os.environ if environ is None else environ
    if _loopback(host):
        return None
    found = _variable(env, f"{scheme}_proxy")
    if found is None:
        return None
    var, value = found
    no_proxy = _variable(env, "no_proxy")
    default_port = {"https": 443, "http": 80}.get(scheme)  # (``host:443`` covers https://host)
    if no_proxy is not None and _bypassed(host, port or default_port, no_proxy[1]):
        return None
    if "://" not in value:
        value = "http://" + value  # ``proxy.corp:3128``, as curl takes it
    scheme_of_proxy, _, rest = value.partition("://")
    if scheme_of_proxy.lower() != "http":
        raise ConfigError(
            f"{var}={shown_url(value)!r}: only http:// proxies are supported (the service's"
            " TLS goes through them: CONNECT); or name the service's host in NO_PROXY"
        )
    authority, _, path = rest.partition("/")
    if "@" in path:
        # A token or password holding an unencoded ``/``: its head would be read as the
        # proxy's host (looked up, tried, named in every message). Shown masked whole.
        raise ConfigError(
            f"{var}={shown_url(value)!r}: the user or password in it holds an unencoded '/':"
            " write it as %2F (percent-encode the password)"
        )
    userinfo, at, hostport = authority.rpartition("@")
    headers: dict[str, str] = {}
    if at:
        from urllib.parse import unquote

        user, _, password = userinfo.partition(":")
        token = f"{unquote(user)}:{unquote(password)}".encode()
        headers["Proxy-Authorization"] = "Basic " + base64.b64encode(token).decode("ascii")
    if not hostport:
        raise ConfigError(f"{var}={shown_url(value)!r} names no proxy host")
    from yarl import URL

    try:  # (as aiohttp reads it at each request: "InvalidURL", taken for an outage)
        host = URL(f"http://{hostport}").raw_host or ""
        if no_ipv4_as_written(host):
            raise ValueError(f"{host} is no IPv4 address as written: four numbers 0-255")
        if not_a_host_name(host):
            raise ValueError(f"{host} is no valid name: {NAME_RULES}")
    except ValueError as err:
        raise ConfigError(
            f"{var}={shown_url(value)!r} is no proxy address ({err}): give it as http://HOST:PORT"
        ) from None
    return ProxyRoute(url=f"http://{hostport}", source=var, headers=headers)


def proxy_wants_credentials(method: str, path: str, proxy: ProxyRoute) -> ConfigError:
    """The error of a proxy's 407: to the CONNECT of an ``https://`` service, or as the
    answer to a request for an ``http://`` one (the proxy answers it itself). Nothing reached
    the service; says whether credentials were given (never them)."""
    if "Proxy-Authorization" in proxy.headers:
        return ConfigError(
            f"{method} {path}: the proxy {proxy.shown} refused the credentials of"
            f" {proxy.source} (HTTP 407): give the right ones there"
        )
    return ConfigError(
        f"{method} {path}: the proxy {proxy.shown} wants credentials (HTTP 407):"
        f" give them in {proxy.source}=http://USER:PASSWORD@HOST:PORT"
    )
