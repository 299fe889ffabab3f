"""The daemon's own HTTP endpoint, by hand on asyncio sockets (docs/development.md says why): GET
and HEAD of /metrics, /health and /status on `metrics.listen`, HTTP/1.0 and 1.1 keep-alive, bounded
so a slow or hostile client cannot hold what the shipping needs (SPEC, Trust boundaries)."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import ipaddress
import logging
import socket
from collections.abc import Callable
from typing import Any

import orjson

from shipper.clock import Clock, SystemClock

log = logging.getLogger(__name__)

MAX_HEAD = 8 * 1024
HEAD_TIMEOUT_S = 10.0
IDLE_TIMEOUT_S = 30.0            # a kept-alive connection with no request for this long is closed
MAX_CONNECTIONS = 64
ACCEPT_PAUSE_S = 1.0             # out of descriptors: how long accepting pauses before trying again
SHORT_LOG_EVERY_S = 60.0         # ... and how often that is logged at most
BACKLOG = 128
_SHORT_OF = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)
REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed",
           500: "Internal Server Error", 503: "Service Unavailable"}

# (status, body, content type) for a request's path and Accept header
Route = Callable[[str | None], tuple[int, bytes, str]]


class Endpoint:
    """A running endpoint; `await cleanup()` closes the listening sockets and open connections.

    The bounds: a request head of 8 KiB within 10 s (the first within 10 s of the connection), a
    kept-alive connection idle for 30 s closed, at most 64 connections at once (more wait in the
    kernel's accept queue, holding no descriptor of ours), and when descriptors run out (EMFILE)
    accepting pauses for a second, logged at most once a minute. The handlers are the callables
    the service hands in.
    """

    def __init__(self, routes: dict[str, Route], head_timeout_s: float = HEAD_TIMEOUT_S,
                 idle_timeout_s: float = IDLE_TIMEOUT_S, max_connections: int = MAX_CONNECTIONS,
                 clock: Clock | None = None) -> None:
        self._clock = clock or SystemClock()
        self._routes = routes
        self._head_timeout_s = head_timeout_s
        self._idle_timeout_s = idle_timeout_s
        self._slots = asyncio.Semaphore(max_connections)
        self._socks: list[socket.socket] = []
        self._acceptors: list[asyncio.Task[None]] = []
        self._conns: set[asyncio.StreamWriter] = set()
        self._accepted: set[socket.socket] = set()     # accepted, not yet behind a stream
        self._tasks: set[asyncio.Task[None]] = set()
        self._short_logged_at: float | None = None
        self.short_of_descriptors = 0          # accepts that failed for want of descriptors (tests, status)

    async def start(self, host: str, port: int) -> None:
        """Listen on every address `host` resolves to (as asyncio.start_server does)."""
        loop = asyncio.get_running_loop()
        infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        seen = set()
        try:
            for family, kind, proto, _name, addr in infos:
                if (family, addr) in seen:
                    continue
                seen.add((family, addr))
                sock = socket.socket(family, kind, proto)
                self._socks.append(sock)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                if family == socket.AF_INET6:
                    sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
                sock.bind(addr)
                sock.listen(BACKLOG)
                sock.setblocking(False)
        except OSError:
            for sock in self._socks:
                sock.close()
            self._socks = []
            raise
        self._acceptors = [asyncio.create_task(self._accept(sock), name="metrics accept") for sock in self._socks]

    @property
    def port(self) -> int:
        return int(self._socks[0].getsockname()[1])

    async def cleanup(self) -> None:
        if not self._socks:
            return
        for t in self._acceptors:
            t.cancel()
        for sock in self._socks:
            sock.close()
        for w in list(self._conns):
            w.close()
        for conn in list(self._accepted):
            conn.close()
        for t in list(self._tasks):
            t.cancel()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(asyncio.gather(*self._acceptors, *self._tasks, return_exceptions=True), 2.0)
        self._socks = []
        self._acceptors = []

    async def _accept(self, sock: socket.socket) -> None:
        """One listening socket's loop: a connection slot first, then the next connection."""
        loop = asyncio.get_running_loop()
        while True:
            await self._slots.acquire()
            try:
                conn, _addr = await loop.sock_accept(sock)
            except OSError as e:
                self._slots.release()
                if e.errno not in _SHORT_OF:
                    if sock.fileno() < 0:
                        return              # closed by cleanup()
                    log.debug("metrics listener: accept failed", extra={"error": str(e)})
                    await self._clock.sleep(ACCEPT_PAUSE_S / 10)      # a refused handshake; never a busy loop
                    continue
                self._short_of_descriptors(e)
                await self._clock.sleep(ACCEPT_PAUSE_S)
                continue
            except BaseException:
                self._slots.release()
                raise
            self._accepted.add(conn)
            task = asyncio.create_task(self._connection(conn), name="metrics connection")
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    def _short_of_descriptors(self, e: OSError) -> None:
        """Out of descriptors (or buffers): the connection waits in the kernel's queue; the files
        and the output keep what they hold. Logged once a minute at most, never a traceback."""
        self.short_of_descriptors += 1
        now = self._clock.monotonic()
        if self._short_logged_at is None or now - self._short_logged_at >= SHORT_LOG_EVERY_S:
            self._short_logged_at = now
            log.warning("metrics listener out of file descriptors: accepting paused", extra={
                "error": e.strerror, "failed_accepts": self.short_of_descriptors, "pause_s": ACCEPT_PAUSE_S})

    async def _connection(self, conn: socket.socket) -> None:
        try:
            try:
                reader, writer = await asyncio.open_connection(sock=conn, limit=MAX_HEAD)
            except OSError:
                conn.close()
                return
            finally:
                self._accepted.discard(conn)
            await self._serve(reader, writer)
        finally:
            self._slots.release()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._conns.add(writer)
        try:
            first = True
            while True:
                try:
                    head = await self._next_head(reader, first)
                except (asyncio.LimitOverrunError, ValueError):
                    await self._answer(writer, 400, b"request head over 8 KiB\n", "text/plain", False, False)
                    return
                except (asyncio.IncompleteReadError, TimeoutError, ConnectionError):
                    return
                first = False
                keep = await self._one(writer, head)
                if not keep:
                    return
        finally:
            self._conns.discard(writer)
            writer.close()

    async def _next_head(self, reader: asyncio.StreamReader, first: bool) -> bytes:
        """The next request head: on a new connection within the head timeout; on a kept-alive one
        its first byte within the idle timeout, the rest within the head timeout."""
        lead = b""
        if not first:
            async with asyncio.timeout(self._idle_timeout_s):
                lead = await reader.readexactly(1)
        async with asyncio.timeout(self._head_timeout_s):
            return lead + await reader.readuntil(b"\r\n\r\n")

    async def _one(self, writer: asyncio.StreamWriter, head: bytes) -> bool:
        lines = head[:-4].split(b"\r\n")
        parts = lines[0].split(b" ")
        if len(parts) != 3 or not parts[2].startswith(b"HTTP/1."):
            await self._answer(writer, 400, b"bad request line\n", "text/plain", False, False)
            return False
        method, target, version = parts
        headers: dict[bytes, bytes] = {}
        for line in lines[1:]:
            name, sep, value = line.partition(b":")
            if sep:
                headers[name.strip().lower()] = value.strip()
        conn = headers.get(b"connection", b"").lower()
        keep = (b"close" not in conn) if version == b"HTTP/1.1" else (b"keep-alive" in conn)
        if b"content-length" in headers or b"transfer-encoding" in headers:
            keep = False        # a GET with a body: not read, so the connection cannot go on
        path = target.split(b"?", 1)[0].decode("latin-1")
        route = self._routes.get(path)
        if route is None:
            await self._answer(writer, 404, b"not found\n", "text/plain", method == b"HEAD", keep)
            return keep
        if method not in (b"GET", b"HEAD"):
            await self._answer(writer, 405, b"GET only\n", "text/plain", False, keep, extra="Allow: GET, HEAD\r\n")
            return keep
        accept = headers.get(b"accept")
        try:
            status, body, ctype = route(accept.decode("latin-1") if accept is not None else None)
        except Exception:     # a handler's bug must not kill the endpoint: answer 500, log nothing secret
            status, body, ctype = 500, b"internal error\n", "text/plain"
        await self._answer(writer, status, body, ctype, method == b"HEAD", keep)
        return keep

    @staticmethod
    async def _answer(writer: asyncio.StreamWriter, status: int, body: bytes, ctype: str, head_only: bool,
                      keep: bool, extra: str = "") -> None:
        text = (f"HTTP/1.1 {status} {REASONS.get(status, 'OK')}\r\nContent-Type: {ctype}\r\n"
                f"Content-Length: {len(body)}\r\nX-Content-Type-Options: nosniff\r\n{extra}"
                f"Connection: {'keep-alive' if keep else 'close'}\r\n\r\n")
        writer.write(text.encode("latin-1") + (b"" if head_only else body))
        with contextlib.suppress(ConnectionError):
            await writer.drain()


def json_route(fn: Callable[[], tuple[int, Any]]) -> Route:
    def route(_accept: str | None) -> tuple[int, bytes, str]:
        status, doc = fn()
        return status, orjson.dumps(doc), "application/json"
    return route


def is_loopback(host: str) -> bool:
    """A listen host only this machine can reach: a loopback address, or `localhost`."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def split_listen(listen: str) -> tuple[str, int]:
    """HOST:PORT or [IPv6]:PORT; an empty host is 127.0.0.1 (loopback unless asked otherwise)."""
    host, _, port = listen.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]                      # [::1]:9607
    return host or "127.0.0.1", int(port)
