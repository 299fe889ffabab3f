"""ship/http1.Pool against real loopback servers that answer in scripted ways: keep-alive reuse,
a kept connection the server closed meanwhile, `Connection: close`, a server that never answers,
a request cancelled mid-answer, and what goes on the wire.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from shipper.ship.http1 import Origin, Pool

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter, int], Awaitable[None]]


class Server:
    """A TCP server on 127.0.0.1; `handler(reader, writer, connection_number)` per connection."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.connections = 0
        self.requests: list[bytes] = []
        self._server: asyncio.Server | None = None

    async def __aenter__(self) -> Server:
        self._server = await asyncio.start_server(self._conn, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        await self._server.wait_closed()

    @property
    def origin(self) -> Origin:
        assert self._server is not None
        return Origin("http", "127.0.0.1", self._server.sockets[0].getsockname()[1])

    async def _conn(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            await self.handler(reader, writer, self.connections)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    async def read_request(self, reader: asyncio.StreamReader) -> bytes:
        head = await reader.readuntil(b"\r\n\r\n")
        length = 0
        for line in head.split(b"\r\n"):
            if line.lower().startswith(b"content-length:"):
                length = int(line.split(b":", 1)[1])
        body = await reader.readexactly(length) if length else b""
        self.requests.append(head + body)
        return head + body

    async def answer_all(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Answer every request on the connection with ok(), until the client goes."""
        while True:
            await self.read_request(reader)
            writer.write(ok())
            await writer.drain()


def ok(body: bytes = b'{"errors":false}', extra: bytes = b"") -> bytes:
    return b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n%s\r\n" % (len(body), extra) + body


@pytest.fixture
async def pool() -> AsyncIterator[Pool]:
    p = Pool(connect_timeout_s=2.0)
    yield p
    p.close()


async def test_keep_alive_reuses_one_connection_and_the_request_is_well_formed(pool: Pool) -> None:
    srv: Server

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        await srv.answer_all(reader, writer)

    async with Server(handler) as srv:
        for i in range(5):
            r = await pool.request(srv.origin, "POST", "/_bulk?x=1", {"Content-Type": "application/x-ndjson"},
                                   b"body-%d" % i)
            assert r.status == 200 and r.body == b'{"errors":false}'
        assert srv.connections == 1
        first = srv.requests[0]
        assert first.startswith(b"POST /_bulk?x=1 HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n" % srv.origin.port)
        assert b"\r\nContent-Type: application/x-ndjson\r\n" in first
        assert b"\r\nContent-Length: 6\r\n" in first and first.endswith(b"\r\n\r\nbody-0")


async def test_a_kept_connection_the_server_closed_is_replaced_without_an_error(pool: Pool) -> None:
    srv: Server

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        await srv.read_request(reader)
        writer.write(ok())
        await writer.drain()
        if n == 1:
            # keeps the connection open, but drops it unanswered when the next request comes
            await reader.read(1)
            writer.transport.abort()
            return
        await srv.answer_all(reader, writer)

    async with Server(handler) as srv:
        assert (await pool.request(srv.origin, "POST", "/", {}, b"a")).status == 200
        assert (await pool.request(srv.origin, "POST", "/", {}, b"b")).status == 200
        assert srv.connections == 2


async def test_a_fresh_connection_dropped_unanswered_is_an_error_not_a_retry(pool: Pool) -> None:
    srv: Server

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        await srv.read_request(reader)
        writer.transport.abort()

    async with Server(handler) as srv:
        with pytest.raises(ConnectionError):
            await pool.request(srv.origin, "POST", "/", {}, b"a")
        assert srv.connections == 1


async def test_connection_close_is_honoured(pool: Pool) -> None:
    srv: Server

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        await srv.read_request(reader)
        writer.write(ok(extra=b"Connection: close\r\n"))
        await writer.drain()

    async with Server(handler) as srv:
        for _ in range(3):
            assert (await pool.request(srv.origin, "GET", "/", {})).status == 200
        assert srv.connections == 3


async def test_a_silent_server_times_out_and_its_connection_is_not_reused(pool: Pool) -> None:
    srv: Server
    answer = asyncio.Event()

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        while True:
            await srv.read_request(reader)
            if n == 1 and not answer.is_set():
                await asyncio.sleep(30)
            writer.write(ok())
            await writer.drain()

    async with Server(handler) as srv:
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.3):
                await pool.request(srv.origin, "POST", "/", {}, b"a")
        answer.set()
        assert (await pool.request(srv.origin, "POST", "/", {}, b"b")).status == 200
        assert srv.connections == 2


async def test_idle_connections_past_keepalive_are_closed_not_used() -> None:
    p = Pool(keepalive_s=0.0)
    srv: Server

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        await srv.answer_all(reader, writer)

    try:
        async with Server(handler) as srv:
            for _ in range(2):
                assert (await p.request(srv.origin, "POST", "/", {}, b"a")).status == 200
            assert srv.connections == 2
    finally:
        p.close()


async def test_refused_connection_is_an_oserror(pool: Pool) -> None:
    async with Server(lambda r, w, n: asyncio.sleep(0)) as srv:
        origin = srv.origin
    with pytest.raises(OSError):
        await pool.request(origin, "POST", "/", {}, b"a")


async def test_concurrent_requests_use_a_connection_each_and_all_are_kept(pool: Pool) -> None:
    srv: Server

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        while True:
            await srv.read_request(reader)
            await asyncio.sleep(0.05)
            writer.write(ok(b"%d" % n))
            await writer.drain()

    async with Server(handler) as srv:
        answers = await asyncio.gather(*(pool.request(srv.origin, "POST", "/", {}, b"x") for _ in range(3)))
        assert sorted(a.body for a in answers) == [b"1", b"2", b"3"]
        again = await asyncio.gather(*(pool.request(srv.origin, "POST", "/", {}, b"x") for _ in range(3)))
        assert sorted(a.body for a in again) == [b"1", b"2", b"3"]
        assert srv.connections == 3
