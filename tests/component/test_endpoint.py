"""shipper/endpoint.py, the /metrics, /health and /status server, over real loopback sockets:
routes, methods, keep-alive, bounded request heads, a client that sends nothing, a failing handler.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import orjson
import pytest

from shipper.endpoint import Endpoint, Route, json_route, split_listen
from shipper.metrics import Metrics, serve_metrics


def _boom(_accept: str | None) -> tuple[int, bytes, str]:
    raise RuntimeError("a handler bug")


@pytest.fixture
async def endpoint() -> AsyncIterator[Endpoint]:
    routes: dict[str, Route] = {
        "/health": json_route(lambda: (503, {"status": "unhealthy", "reason": "output down"})),
        "/echo": lambda accept: (200, (accept or "none").encode(), "text/plain"),
        "/boom": _boom,
    }
    ep = Endpoint(routes, head_timeout_s=0.5)
    await ep.start("127.0.0.1", 0)
    yield ep
    await ep.cleanup()


async def _exchange(port: int, *requests: bytes) -> list[bytes]:
    """Send the requests on one connection, one after the other; the answers, each whole."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    out = []
    try:
        for req in requests:
            writer.write(req)
            head = await reader.readuntil(b"\r\n\r\n")
            length = int(head.split(b"Content-Length: ")[1].split(b"\r\n")[0])
            body = await reader.readexactly(length) if b"HEAD " not in req[:5] else b""
            out.append(head + body)
    finally:
        writer.close()
    return out


async def test_routes_status_and_keep_alive(endpoint: Endpoint) -> None:
    a, b, c, d = await _exchange(
        endpoint.port,
        b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n",
        b"GET /echo?x=1 HTTP/1.1\r\nAccept: text/plain\r\n\r\n",
        b"GET /nope HTTP/1.1\r\n\r\n",
        b"POST /echo HTTP/1.1\r\n\r\n")
    assert a.startswith(b"HTTP/1.1 503 Service Unavailable\r\n") and b"Content-Type: application/json" in a
    assert orjson.loads(a.split(b"\r\n\r\n", 1)[1]) == {"status": "unhealthy", "reason": "output down"}
    assert b.startswith(b"HTTP/1.1 200 OK\r\n") and b.endswith(b"\r\n\r\ntext/plain")
    assert c.startswith(b"HTTP/1.1 404 ")
    assert d.startswith(b"HTTP/1.1 405 ") and b"Allow: GET, HEAD\r\n" in d


async def test_head_has_no_body_and_http10_closes(endpoint: Endpoint) -> None:
    (h,) = await _exchange(endpoint.port, b"HEAD /echo HTTP/1.1\r\n\r\n")
    assert h.startswith(b"HTTP/1.1 200 OK\r\n") and h.endswith(b"\r\n\r\n") and b"Content-Length: 4\r\n" in h
    reader, writer = await asyncio.open_connection("127.0.0.1", endpoint.port)
    writer.write(b"GET /echo HTTP/1.0\r\n\r\n")
    whole = await asyncio.wait_for(reader.read(), 5)        # EOF: the server closed after answering
    writer.close()
    assert whole.startswith(b"HTTP/1.1 200 OK\r\n") and b"Connection: close\r\n" in whole and whole.endswith(b"none")


async def test_a_handler_that_raises_is_a_500_and_the_endpoint_goes_on(endpoint: Endpoint) -> None:
    a, b = await _exchange(endpoint.port, b"GET /boom HTTP/1.1\r\n\r\n", b"GET /echo HTTP/1.1\r\n\r\n")
    assert a.startswith(b"HTTP/1.1 500 ") and b"a handler bug" not in a
    assert b.startswith(b"HTTP/1.1 200 ")


@pytest.mark.parametrize("request_bytes, status", [
    (b"GET /echo HTTP/1.1\r\nX-Pad: " + b"a" * 9000 + b"\r\n\r\n", b"400"),
    (b"NONSENSE\r\n\r\n", b"400"),
])
async def test_bad_or_oversized_requests_get_400_and_a_close(endpoint: Endpoint, request_bytes: bytes,
                                                            status: bytes) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", endpoint.port)
    writer.write(request_bytes)
    whole = await asyncio.wait_for(reader.read(), 5)
    writer.close()
    assert whole.startswith(b"HTTP/1.1 " + status)


async def test_a_client_that_sends_nothing_is_dropped_and_others_are_served(endpoint: Endpoint) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", endpoint.port)
    (ok,) = await _exchange(endpoint.port, b"GET /echo HTTP/1.1\r\n\r\n")     # served meanwhile
    assert ok.startswith(b"HTTP/1.1 200 ")
    assert await asyncio.wait_for(reader.read(), 5) == b""        # closed after head_timeout_s
    writer.close()


async def test_cleanup_closes_open_connections_and_the_port() -> None:
    ep = await serve_metrics("127.0.0.1:0", Metrics(), lambda: (True, "shipping"))
    port = ep.port
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    await ep.cleanup()
    assert await asyncio.wait_for(reader.read(), 5) == b""
    writer.close()
    with pytest.raises(OSError):
        await asyncio.open_connection("127.0.0.1", port)


def test_split_listen() -> None:
    assert split_listen("127.0.0.1:9607") == ("127.0.0.1", 9607)
    assert split_listen(":9607") == ("127.0.0.1", 9607)
    assert split_listen("[::1]:9607") == ("::1", 9607)
    assert split_listen("0.0.0.0:1") == ("0.0.0.0", 1)


# ---------------------------------------------------------------- bounds (SPEC, Trust boundaries)

async def _request(port: int, path: bytes = b"/echo") -> tuple[asyncio.StreamReader, asyncio.StreamWriter, bytes]:
    """A kept-alive connection that made one request: the streams and the answer's head."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET " + path + b" HTTP/1.1\r\n\r\n")
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    length = int(head.split(b"Content-Length: ")[1].split(b"\r\n")[0])
    await reader.readexactly(length)
    return reader, writer, head


async def test_at_most_max_connections_are_served_at_once_and_the_next_waits_its_turn() -> None:
    ep = Endpoint({"/echo": lambda accept: (200, b"ok", "text/plain")}, max_connections=4)
    await ep.start("127.0.0.1", 0)
    held = []
    try:
        for _ in range(4):
            held.append(await _request(ep.port))
        reader, writer = await asyncio.open_connection("127.0.0.1", ep.port)     # in the kernel's queue
        writer.write(b"GET /echo HTTP/1.1\r\n\r\n")
        waiting = asyncio.ensure_future(reader.readuntil(b"\r\n\r\n"))
        # every slot is taken, so the acceptor is parked before accept(): the fifth stays in the queue
        assert ep._slots.locked() and len(ep._conns) == 4 and not waiting.done()
        held[0][1].close()                              # one leaves: the waiting one is taken
        head = await asyncio.wait_for(waiting, 5)
        assert head.startswith(b"HTTP/1.1 200 ")
        writer.close()
    finally:
        for _r, w, _h in held:
            w.close()
        await ep.cleanup()


async def test_a_kept_alive_connection_idle_past_the_idle_timeout_is_closed() -> None:
    ep = Endpoint({"/echo": lambda accept: (200, b"ok", "text/plain")}, head_timeout_s=5.0, idle_timeout_s=0.3)
    await ep.start("127.0.0.1", 0)
    try:
        reader, writer, head = await _request(ep.port)
        assert b"Connection: keep-alive" in head
        assert await asyncio.wait_for(reader.read(), 5) == b""     # closed at the idle timeout, not at 5 s
        writer.close()
    finally:
        await ep.cleanup()


@pytest.mark.parametrize("listen, on_any, served", [
    ("127.0.0.1:0", False, True), ("[::1]:0", False, True), ("localhost:0", False, True),
    ("0.0.0.0:0", False, False), ("0.0.0.0:0", True, True),
])
async def test_status_is_served_on_loopback_only_unless_asked(listen: str, on_any: bool, served: bool) -> None:
    ep = await serve_metrics(listen, Metrics(), lambda: (True, "shipping"), lambda: {"files": ["/var/log/x.log"]},
                             status_on_any_address=on_any)
    host = "::1" if listen.startswith("[") else "127.0.0.1"
    try:
        reader, writer = await asyncio.open_connection(host, ep.port)
        writer.write(b"GET /status HTTP/1.1\r\n\r\nGET /health HTTP/1.1\r\n\r\n")
        status = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        length = int(status.split(b"Content-Length: ")[1].split(b"\r\n")[0])
        body = await reader.readexactly(length)
        health = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        writer.close()
    finally:
        await ep.cleanup()
    assert health.startswith(b"HTTP/1.1 200 ")
    if served:
        assert status.startswith(b"HTTP/1.1 200 ") and b"/var/log/x.log" in body
    else:
        assert status.startswith(b"HTTP/1.1 404 ") and b"/var/log" not in body


def test_is_loopback() -> None:
    from shipper.endpoint import is_loopback
    assert is_loopback("127.0.0.1") and is_loopback("127.3.4.5") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("::") and not is_loopback("10.0.0.1")
    assert not is_loopback("myhost")
