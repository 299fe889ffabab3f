"""The metrics server on an IPv6 listen address ([::1]:PORT), and `shipper status` asking it."""

from __future__ import annotations

import asyncio
import socket
import urllib.request

import orjson
import pytest

from shipper.commands.status import _ask_daemon
from shipper.metrics import Metrics, serve_metrics


def _free_v6_port() -> int:
    with socket.socket(socket.AF_INET6) as s:
        s.bind(("::1", 0))
        return int(s.getsockname()[1])


@pytest.mark.skipif(not socket.has_ipv6, reason="no IPv6 in this Python")
async def test_metrics_server_listens_on_ipv6_loopback() -> None:
    try:
        port = _free_v6_port()
    except OSError:
        pytest.skip("no IPv6 loopback on this machine")
    listen = f"[::1]:{port}"
    runner = await serve_metrics(listen, Metrics(), lambda: (True, "shipping"), lambda: {"state": "running"})
    try:
        def get(path: str) -> bytes:
            with urllib.request.urlopen(f"http://[::1]:{port}{path}", timeout=5) as resp:
                return bytes(resp.read())

        health = orjson.loads(await asyncio.to_thread(get, "/health"))
        assert health == {"status": "ok", "reason": "shipping"}
        assert b"shipper_" in await asyncio.to_thread(get, "/metrics")
        assert await asyncio.to_thread(_ask_daemon, listen) == {"state": "running"}
    finally:
        await runner.cleanup()


async def test_metrics_negotiates_openmetrics_on_the_accept_header() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    runner = await serve_metrics(f"127.0.0.1:{port}", Metrics(), lambda: (True, "ok"))
    try:
        def get(accept: str | None) -> tuple[str, bytes]:
            req = urllib.request.Request(f"http://127.0.0.1:{port}/metrics",
                                         headers={"Accept": accept} if accept else {})
            with urllib.request.urlopen(req, timeout=5) as resp:
                return str(resp.headers["Content-Type"]), bytes(resp.read())

        ctype, body = await asyncio.to_thread(get, None)
        assert ctype == "text/plain; version=0.0.4; charset=utf-8"
        assert b"# TYPE shipper_events_read_total counter\n" in body and b"process_open_fds " in body
        ctype, body = await asyncio.to_thread(get, "application/openmetrics-text;version=1.0.0,text/plain;q=0.5")
        assert ctype.startswith("application/openmetrics-text; version=1.0.0")
        assert b"# TYPE shipper_events_read counter\n" in body and body.endswith(b"# EOF\n")
    finally:
        await runner.cleanup()
