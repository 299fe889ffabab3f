"""A destination that answers with a gzip bomb (1 MB on the wire, 1 GiB inflated), from a real
loopback server: `shipper check`'s GET / and the bulk POST treat it as an error of that request
(retried, for the bulk), and memory stays bounded (SPEC, Trust boundaries: answers are inflated
to 64 MiB at most). On b19ade4 `shipper check` inflated it whole (~1.1 GB of RSS)."""

from __future__ import annotations

import os
import socket
import struct
import subprocess
import sys
import threading
import tracemalloc
import zlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from shipper.config import ElasticsearchConfig
from shipper.errors import TransportError
from shipper.ship.backoff import Backoff
from shipper.ship.client import BulkClient
from tests.support.daemon import REPO_ROOT, write_config

GIB = 1 << 30


def gzip_bomb(size: int = GIB) -> bytes:
    """A valid gzip stream of `size` zero bytes, ~1/1000 of that long: one MiB of zeros compressed
    once after a full flush repeats byte for byte, so it is built in a fraction of a second."""
    mib = bytes(1 << 20)
    c = zlib.compressobj(9, zlib.DEFLATED, 31)
    head = c.compress(mib) + c.flush(zlib.Z_FULL_FLUSH)
    again = c.compress(mib) + c.flush(zlib.Z_FULL_FLUSH)
    tail = c.flush()[:-8]                                        # the trailer is rewritten below
    crc = 0
    for _ in range(size >> 20):
        crc = zlib.crc32(mib, crc)
    return head + again * ((size >> 20) - 1) + tail + struct.pack("<II", crc, size & 0xFFFFFFFF)


class BombServer:
    """Answers every request on loopback with 200 and the bomb as a gzip body."""

    def __init__(self, bomb: bytes) -> None:
        self.bomb = bomb
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.requests = 0
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                data = b""
                while b"\r\n\r\n" not in data:
                    got = conn.recv(65536)
                    if not got:
                        break
                    data += got
                length = 0
                for line in data.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":")[1])
                body = data.split(b"\r\n\r\n", 1)[1] if b"\r\n\r\n" in data else b""
                while len(body) < length:
                    got = conn.recv(65536)
                    if not got:
                        break
                    body += got
                self.requests += 1
                head = (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Encoding: gzip\r\n"
                        b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(self.bomb))
                try:
                    conn.sendall(head + self.bomb)
                except OSError:
                    pass

    def close(self) -> None:
        self.sock.close()


@pytest.fixture(scope="module")
def bomb() -> bytes:
    return gzip_bomb()


@pytest.fixture
def server(bomb: bytes) -> Iterator[BombServer]:
    s = BombServer(bomb)
    yield s
    s.close()


def test_shipper_check_reports_the_bomb_as_a_failed_host_with_bounded_memory(tmp_path: Path,
                                                                           server: BombServer) -> None:
    cfg = write_config(tmp_path, es_url=f"http://127.0.0.1:{server.port}", paths=str(tmp_path / "*.log"),
                       extra_yaml={"metrics": {"listen": None}})
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    proc = subprocess.Popen([sys.executable, "-m", "shipper", "check", "-c", str(cfg)], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, env=env)
    assert proc.stdout is not None
    out = proc.stdout.read().decode()
    _pid, status, usage = os.wait4(proc.pid, 0)
    proc.stdout.close()
    proc.returncode = os.waitstatus_to_exitcode(status)
    peak_mb = usage.ru_maxrss / 1024
    assert server.requests >= 1
    assert "FAILED" in out and "inflates to over 67,108,864 bytes" in out, out
    assert proc.returncode == 1, out
    assert peak_mb < 300, f"shipper check peaked at {peak_mb:.0f} MB on a 1 GiB gzip bomb"


async def test_a_bulk_answer_that_is_a_bomb_is_a_retryable_error_of_that_request(server: BombServer) -> None:
    client = BulkClient(ElasticsearchConfig(hosts=(f"http://127.0.0.1:{server.port}",), index_template="off"),
                        Backoff(0.1, 1.0))
    tracemalloc.start()
    try:
        with pytest.raises(TransportError) as e:
            await client.post_bulk(b'{"create":{"_index":"i","_id":"1"}}\n{"a":1}\n', False)
        _now, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
        await client.close()
    assert e.value.retryable and "inflates to over 67,108,864 bytes" in str(e.value)
    assert peak < 100 * (1 << 20), f"{peak >> 20} MiB allocated for a 1 GiB gzip bomb"
