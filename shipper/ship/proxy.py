"""Forward proxies for the output: which proxy a host is reached through (pure: `proxy_url`, the
environment as curl reads it, NO_PROXY) and the CONNECT tunnel (`Proxy.open`, the only I/O: a socket
at the tunnel's far end, on which the caller starts TLS to the destination, never to the proxy)."""

from __future__ import annotations

import asyncio
import base64
import ipaddress
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

from shipper.errors import ConfigError
from shipper.ship.http_head import ProtocolError, parse_head

_MAX_HEAD = 64 * 1024


class ProxyError(ConnectionError):
    """The proxy refused the tunnel (407, 403, 502 ...) or broke it: a connection error, retried."""


@dataclass(frozen=True, slots=True)
class Proxy:
    host: str
    port: int
    label: str                       # http://host:port, never the credentials
    authorization: str | None        # the Proxy-Authorization value, from the URL's user and password

    def headers(self) -> dict[str, str]:
        return {"Proxy-Authorization": self.authorization} if self.authorization else {}

    def connect_request(self, host: str, port: int) -> bytes:
        target = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        head = [f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n"]
        head.extend(f"{k}: {v}\r\n" for k, v in self.headers().items())
        head.append("\r\n")
        return "".join(head).encode("latin-1")

    async def open(self, host: str, port: int) -> socket.socket:
        """A non-blocking socket tunnelled to host:port (`CONNECT`), nothing sent through it yet.
        Raises ProxyError when the proxy refuses or breaks the tunnel, OSError when it is not
        reachable. The caller bounds the time."""
        loop = asyncio.get_running_loop()
        sock = await _connect(loop, self.host, self.port)
        try:
            await loop.sock_sendall(sock, self.connect_request(host, port))
            buf = b""
            while (end := buf.find(b"\r\n\r\n")) < 0:
                if len(buf) > _MAX_HEAD:
                    raise ProxyError(f"the proxy {self.label} sent a head over 64 KiB to CONNECT")
                chunk = await loop.sock_recv(sock, 16384)
                if not chunk:
                    raise ProxyError(f"the proxy {self.label} closed the connection before it answered CONNECT")
                buf += chunk
            try:
                status, _v11, _headers = parse_head(buf[:end])
            except ProtocolError as e:
                raise ProxyError(f"the proxy {self.label} answered CONNECT with no HTTP: {e}") from None
            if not 200 <= status < 300:
                reason = buf[:end].split(b"\r\n", 1)[0].decode("latin-1", "replace")[:120]
                hint = (" (check the user and password of the proxy URL)" if status in (401, 407) else "")
                raise ProxyError(f"the proxy {self.label} refused CONNECT to {host}:{port}: {reason}{hint}")
            if len(buf) > end + 4:
                raise ProxyError(f"the proxy {self.label} sent bytes after its answer to CONNECT")
            return sock
        except BaseException:
            sock.close()
            raise


async def _connect(loop: asyncio.AbstractEventLoop, host: str, port: int) -> socket.socket:
    """A connected non-blocking TCP socket to host:port, trying each address in turn."""
    infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    error: OSError | None = None
    for family, kind, proto, _name, addr in infos:
        sock = socket.socket(family, kind, proto)
        sock.setblocking(False)
        try:
            await loop.sock_connect(sock, addr)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            return sock
        except OSError as e:
            sock.close()
            error = e
        except BaseException:
            sock.close()
            raise
    raise error or OSError(f"no address for {host}")


def parse_proxy(url: str, key: str) -> Proxy:
    """`http://[user:pass@]host[:port]` (no scheme: http, as curl takes it) -> Proxy. ConfigError names `key`."""
    text = url.strip()
    if "://" not in text:
        text = "http://" + text
    parts = urlsplit(text)
    if parts.scheme.lower() != "http":
        raise ConfigError(key, f"only http:// proxies are supported (https destinations go through them with "
                               f"CONNECT, TLS end to end), got {parts.scheme}://")
    try:
        port = parts.port or 1080
    except ValueError:
        raise ConfigError(key, "has an invalid port") from None
    if not parts.hostname:
        raise ConfigError(key, "names no proxy host")
    if parts.path not in ("", "/") or parts.query:
        raise ConfigError(key, "must be http://[user:pass@]host:port, without a path")
    auth = None
    if parts.username is not None:
        cred = f"{unquote(parts.username)}:{unquote(parts.password or '')}"
        auth = "Basic " + base64.b64encode(cred.encode()).decode()
    host = parts.hostname
    shown = f"[{host}]" if ":" in host else host
    return Proxy(host, port, f"http://{shown}:{port}", auth)


def secrets_of(url: str) -> list[str]:
    """What to redact for a proxy URL: its password and the header value made of it."""
    text = url if "://" in url else "http://" + url
    parts = urlsplit(text)
    if parts.username is None:
        return []
    password = unquote(parts.password or "")
    cred = f"{unquote(parts.username)}:{password}"
    return [s for s in (password, parts.password, base64.b64encode(cred.encode()).decode()) if s]


def _env(env: Mapping[str, str], name: str) -> tuple[str, str] | None:
    """(variable, value) of `name` as curl reads it: the lower-case one wins; empty counts as unset."""
    for var in (name.lower(), name.upper()):
        value = env.get(var, "").strip()
        if value:
            return var, value
    return None


def chosen_proxy(scheme: str, host: str, proxy_url: str | None,
                 env: Mapping[str, str]) -> tuple[str, str] | None:
    """(where it came from, the proxy URL) for a destination, or None for a direct connection:
    `proxy_url` when set, else `https_proxy`/`http_proxy` by the destination's scheme; either
    way NO_PROXY can exempt the host."""
    if no_proxy_matches(host, (_env(env, "no_proxy") or ("", ""))[1]):
        return None
    if proxy_url:
        return "output.elasticsearch.proxy_url", proxy_url
    return _env(env, "https_proxy" if scheme == "https" else "http_proxy")


def no_proxy_matches(host: str, no_proxy: str) -> bool:
    """Whether NO_PROXY exempts `host`, as curl matches it: `*` alone exempts every host; a name
    matches itself and its subdomains, with or without a leading dot (`example.com` and
    `.example.com` both match `es.example.com`); an IP address matches itself, a CIDR range
    (`10.0.0.0/8`) its addresses. Case does not matter; a loopback host is exempt only if listed."""
    host = host.strip("[]").rstrip(".").lower()
    try:
        addr: ipaddress.IPv4Address | ipaddress.IPv6Address | None = ipaddress.ip_address(host)
    except ValueError:
        addr = None
    for raw in no_proxy.replace(" ", ",").split(","):
        entry = raw.strip().lower()
        if not entry:
            continue
        if entry == "*":
            return True
        entry = entry.strip("[]").rstrip(".")
        if addr is not None:
            try:
                if addr in ipaddress.ip_network(entry, strict=False):
                    return True
            except ValueError:
                pass
            continue
        entry = entry.lstrip(".")
        if entry and (host == entry or host.endswith("." + entry)):
            return True
    return False
