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
