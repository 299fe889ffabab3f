"""The naive baseline: read a file, wrap each line in `{"index":{}}`, POST 1000-line batches.

No parsing, no queue, no gzip, no retries: one keep-alive HTTP/1.1 connection, one request at a
time. It is the floor shipper is compared with in every run.py table (same machine, same run).

    python bench/naive.py FILE URL [--batch 1000] [--index bench] [--follow]

`--follow` keeps reading what is appended (polling every `--poll-ms`, 10, at EOF) until SIGTERM: the
latency baseline.
"""

from __future__ import annotations

import argparse
import http.client
import signal
import sys
import time
import urllib.parse
from itertools import islice

ACTION = b'{"index":{}}\n'


class BulkPoster:
    """One keep-alive connection to the sink; `post(lines)` sends one bulk request, raises on errors."""

    def __init__(self, url: str, index: str) -> None:
        u = urllib.parse.urlsplit(url)
        self._conn = http.client.HTTPConnection(u.hostname or "127.0.0.1", u.port or 80, timeout=60)
        self._path = f"/{index}/_bulk"
        self._headers = {"Content-Type": "application/x-ndjson"}
        self.requests = 0

    def post(self, lines: list[bytes]) -> None:
        if not lines[-1].endswith(b"\n"):
            lines[-1] += b"\n"
        body = ACTION + ACTION.join(lines)
        self._conn.request("POST", self._path, body, self._headers)
        resp = self._conn.getresponse()
        answer = resp.read()
        self.requests += 1
        if resp.status != 200 or b'"errors":false' not in answer[:64]:
            raise RuntimeError(f"bulk failed: HTTP {resp.status}: {answer[:200]!r}")

    def close(self) -> None:
        self._conn.close()


def ship_file(path: str, url: str, batch: int = 1000, index: str = "bench") -> int:
    """Send every line of `path` once; returns the number of lines sent."""
    poster = BulkPoster(url, index)
    sent = 0
    with open(path, "rb", buffering=1024 * 1024) as f:
        while True:
            lines = list(islice(f, batch))
            if not lines:
                break
            poster.post(lines)
            sent += len(lines)
    poster.close()
    return sent


def follow_file(path: str, url: str, batch: int = 1000, index: str = "bench", poll_s: float = 0.010) -> int:
    """Tail `path` from its start until SIGTERM/SIGINT: send complete lines as they appear."""
    stopping = False

    def stop(signum: int, frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    poster = BulkPoster(url, index)
    sent = 0
    carry = b""
    with open(path, "rb", buffering=0) as f:
        while not stopping:
            chunk = f.read(4 * 1024 * 1024)
            if not chunk:
                time.sleep(poll_s)
                continue
            data = carry + chunk
            cut = data.rfind(b"\n") + 1
            carry = data[cut:]
            lines = data[:cut].splitlines(keepends=True)
            for i in range(0, len(lines), batch):
                poster.post(lines[i:i + batch])
            sent += len(lines)
    poster.close()
    return sent


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="naive bulk baseline: read, wrap, POST")
    ap.add_argument("file")
    ap.add_argument("url", help="sink base URL, e.g. http://127.0.0.1:9200")
    ap.add_argument("--batch", type=int, default=1000, help="lines per bulk request (default 1000)")
    ap.add_argument("--index", default="bench")
    ap.add_argument("--follow", action="store_true", help="tail the file until SIGTERM")
    ap.add_argument("--poll-ms", type=float, default=10.0, help="--follow: sleep at EOF (default 10 ms)")
    args = ap.parse_args(argv)
    if args.follow:
        follow_file(args.file, args.url, args.batch, args.index, args.poll_ms / 1000)
    else:
        ship_file(args.file, args.url, args.batch, args.index)
    return 0


if __name__ == "__main__":
    sys.exit(main())
