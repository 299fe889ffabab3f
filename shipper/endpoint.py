"""The daemon's own HTTP endpoint: GET /metrics, /health and /status on `metrics.listen`.

By hand on asyncio streams rather than aiohttp.web (measured, issue 14): importing aiohttp.web
cost 100-200 ms of CPU at every start and 10.5 MiB of RSS, for three GET routes scraped every
few seconds. What is here: HTTP/1.0 and 1.1 GET and HEAD, keep-alive, a request head bounded to
8 KiB and 10 s (a slow or hostile client cannot hold memory or a task for long), 404/405/400
answers, and `cleanup()` to stop. The handlers are the callables the service hands in.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any

import orjson

MAX_HEAD = 8 * 1024
HEAD_TIMEOUT_S = 10.0
REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed",
           500: "Internal Server Error", 503: "Service Unavailable"}

# (status, body, content type) for a request's path and Accept header
Route = Callable[[str | None], tuple[int, bytes, str]]


class Endpoint:
    """A running endpoint; `await cleanup()` closes the listening socket and open connections."""

    def __init__(self, routes: dict[str, Route], head_timeout_s: float = HEAD_TIMEOUT_S) -> None:
        self._routes = routes
        self._head_timeout_s = head_timeout_s
        self._server: asyncio.Server | None = None
        self._conns: set[asyncio.StreamWriter] = set()

    async def start(self, host: str, port: int) -> None:
        self._server = await asyncio.start_server(self._serve, host, port, reuse_address=True, limit=MAX_HEAD)

    @property
    def port(self) -> int:
        assert self._server is not None
        return int(self._server.sockets[0].getsockname()[1])

    async def cleanup(self) -> None:
        if self._server is not None:
            self._server.close()
            for w in list(self._conns):
                w.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 2.0)
            self._server = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._conns.add(writer)
        try:
            while True:
                try:
                    async with asyncio.timeout(self._head_timeout_s):
                        head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.LimitOverrunError, ValueError):
                    await self._answer(writer, 400, b"request head over 8 KiB\n", "text/plain", False, False)
                    return
                except (asyncio.IncompleteReadError, TimeoutError, ConnectionError):
                    return
                keep = await self._one(writer, head)
                if not keep:
                    return
        finally:
            self._conns.discard(writer)
            writer.close()

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


def split_listen(listen: str) -> tuple[str, int]:
    """HOST:PORT or [IPv6]:PORT; an empty host is 127.0.0.1 (loopback unless asked otherwise)."""
    host, _, port = listen.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]                      # [::1]:9607
    return host or "127.0.0.1", int(port)
