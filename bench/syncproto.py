"""A measurement, not a shipper: shipper's request cycle run synchronously in one thread.

The question it answers (issue 14, ninth round): how much of the steady-rate cost is the work of
a cycle and how much is its shape (an asyncio loop woken by a timer, a hand-over to the spool
thread and back, the answer waking the loop again)? This program does the same work with
shipper's own parts and no event loop: every `--interval-ms` it reads what was appended to one
file (`os.pread`, bounded), splits and builds the lines with shipper's C path (`LineSplitter.
feed_built` into `DocBuilder.split_builder`: the documents `shipper run` builds, though the
incarnation in each `_id` is the file's device and inode here, not shipper's fingerprint identity),
commits the body gzip'd together with the file's checkpoint and the previous batch's ack in one
SQLite transaction (`Spool.commit_acking`, as the spool thread does), posts it on a blocking
socket and waits for the answer (the request as `shipper/ship/http1.py` writes it, the answer
read by its `parse_head`). So the design rules' durability holds (a batch is on disk with its
checkpoint before it is sent, acked only once answered); what it leaves out is everything a
daemon needs besides: discovery, rotation, retries and backoff, partial rejections, more than
one file, and an idle wait (it polls every interval, so it is not an idle-cost figure).

    python bench/syncproto.py FILE URL [--interval-ms 40] [--state DIR] [--index bench]

Runs until SIGTERM/SIGINT; `bench/latency.py --systems sync` runs it beside the others.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import sys
import tempfile
import time
import urllib.parse

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))   # shipper

from shipper.config import InputConfig  # noqa: E402
from shipper.model import Checkpoint  # noqa: E402
from shipper.parse.document import DocBuilder  # noqa: E402
from shipper.ship.http_head import parse_head  # noqa: E402
from shipper.spool.store import Spool  # noqa: E402
from shipper.tail.lines import LineSplitter  # noqa: E402

READ_BYTES = 512 * 1024         # at most this much a cycle (about 1,400 pino lines): one body
MAX_LINE = 1024 * 1024


class Poster:
    """One keep-alive HTTP/1.1 connection, blocking: `post(gz)` sends one gzip'd bulk body."""

    def __init__(self, url: str, index: str) -> None:
        u = urllib.parse.urlsplit(url)
        host, port = u.hostname or "127.0.0.1", u.port or 80
        self.sock = socket.create_connection((host, port), timeout=60)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.head = (f"POST /{index}/_bulk?filter_path=errors HTTP/1.1\r\nHost: {host}:{port}\r\n"
                     "Content-Type: application/x-ndjson\r\nContent-Encoding: gzip\r\n")

    def post(self, gz: bytes) -> None:
        self.sock.sendall(f"{self.head}Content-Length: {len(gz)}\r\n\r\n".encode("latin-1") + gz)
        buf = b""
        while b"\r\n\r\n" not in buf:
            buf += self._recv()
        head, _, answer = buf.partition(b"\r\n\r\n")
        status, _, headers = parse_head(head)
        while len(answer) < int(headers.get("content-length", "0")):
            answer += self._recv()
        if status != 200 or b'"errors":false' not in answer:
            raise RuntimeError(f"bulk failed: HTTP {status}: {answer[:200]!r}")

    def close(self) -> None:
        self.sock.close()

    def _recv(self) -> bytes:
        data = self.sock.recv(65536)
        if not data:
            raise ConnectionError("the sink closed the connection")
        return data


def follow(path: str, url: str, interval_s: float, state_dir: str, index: str) -> int:
    """Tail `path` from its start until SIGTERM/SIGINT, one synchronous cycle per interval."""
    stopping = False

    def stop(signum: int, frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    while not os.path.exists(path) and not stopping:
        time.sleep(interval_s)
    fd = os.open(path, os.O_RDONLY)
    st = os.fstat(fd)
    inc = f"{st.st_dev:x}{st.st_ino:x}"
    builder = DocBuilder(InputConfig(paths=(path,), index=index), index, socket.gethostname())
    splitter = LineSplitter(0, MAX_LINE)
    spool = Spool(state_dir, headroom=True)
    poster = Poster(url, index)
    acks: list[int] = []
    sent = 0
    while not stopping:
        time.sleep(interval_s)
        data = os.pread(fd, READ_BYTES, splitter.read_position)
        if not data:
            continue
        now = time.time()
        parts: list[bytes] = []
        counts: dict[int, int] = {}
        split = builder.split_builder(inc, path, now, parts, counts)
        assert split is not None, "the C path is not built"
        first = splitter.offset
        lines, built = splitter.feed_built(data, split)
        docs = built.pairs
        if lines:
            n0 = len(parts)
            builder.build(inc, path, lines, now, parts)
            docs += len(parts) - n0
        if not docs:
            continue
        cp = Checkpoint(inc, path, st.st_dev, st.st_ino, 0, "", splitter.offset, updated=now)
        out = spool.commit_acking([(b"".join(parts), docs)], {inc: (first, splitter.offset)}, [cp], True, acks)
        meta, gz = out[0]
        poster.post(gz)
        acks = [meta.seq]            # acked in the next cycle's transaction, as the spool does
        sent += docs
    if acks:
        spool.commit_acking([], {}, [], True, acks)
    spool.close()
    poster.close()
    os.close(fd)
    return sent


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="shipper's request cycle, synchronously in one thread")
    ap.add_argument("file")
    ap.add_argument("url", help="sink base URL, e.g. http://127.0.0.1:9200")
    ap.add_argument("--interval-ms", type=float, default=40.0, help="one cycle every this long (default 40)")
    ap.add_argument("--state", help="spool directory (default: a temporary one)")
    ap.add_argument("--index", default="bench")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="syncproto-") as tmp:
        follow(args.file, args.url, args.interval_ms / 1000, args.state or tmp, args.index)
    return 0


if __name__ == "__main__":
    sys.exit(main())
