"""aiohttp's own floor for one request cycle: CPU per bulk request of a bare aiohttp client.

One keep-alive session posts a gzip'd one-document bulk body to the sink every `--interval-ms`,
`-n` times, and reads the answer: what shipper's request cycle (read, build, write, send, ack)
is compared with. Prints CPU-us per request of this process (after imports and the first request).

    python bench/floor.py URL [-n 400] [--interval-ms 40] [--client aiohttp|raw|both]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import sys
import time
from collections.abc import Awaitable, Callable

import aiohttp
from isal import igzip

BODY = b'{"create":{"_index":"bench","_id":"x"}}\n{"level":30,"time":1,"msg":"hello"}\n'


def _cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


HEADERS = {"Content-Type": "application/x-ndjson", "Content-Encoding": "gzip"}
Post = Callable[[bytes], Awaitable[tuple[int, bytes]]]


def _check(status: int, answer: bytes) -> None:
    if status != 200 or b'"errors":false' not in answer:
        raise RuntimeError(f"bulk failed: {status} {answer[:100]!r}")


async def _measure(client: str, post: Post, n: int, interval_s: float) -> dict[str, float | str]:
    """One request first (connect, warm up), then n requests every interval_s: CPU per request."""
    _check(*await post(igzip.compress(BODY, 1)))
    cpu0, t0 = _cpu(), time.monotonic()
    for _ in range(n):
        await asyncio.sleep(interval_s)
        _check(*await post(igzip.compress(BODY, 1)))
    cpu1, t1 = _cpu(), time.monotonic()
    return {"client": client, "requests": n, "cpu_s": cpu1 - cpu0, "seconds": t1 - t0,
            "cpu_us_per_request": (cpu1 - cpu0) / n * 1e6}


async def run_raw(url: str, n: int, interval_s: float) -> dict[str, float | str]:
    """The same cycle on shipper's own HTTP/1.1 client (shipper/ship/http1.py)."""
    from urllib.parse import urlsplit

    from shipper.ship.http1 import Origin, Pool
    parts = urlsplit(url)
    origin = Origin(parts.scheme, parts.hostname or "", parts.port or 80)
    pool = Pool()

    async def post(body: bytes) -> tuple[int, bytes]:
        r = await pool.request(origin, "POST", "/_bulk?filter_path=errors", HEADERS, body)
        return r.status, r.body
    try:
        return await _measure("raw", post, n, interval_s)
    finally:
        pool.close()


async def run(url: str, n: int, interval_s: float) -> dict[str, float | str]:
    async with aiohttp.ClientSession() as session:
        async def post(body: bytes) -> tuple[int, bytes]:
            async with session.post(url + "/_bulk?filter_path=errors", data=body, headers=HEADERS) as r:
                return r.status, await r.read()
        return await _measure("aiohttp", post, n, interval_s)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="aiohttp's CPU per bulk request (the floor)")
    ap.add_argument("url")
    ap.add_argument("-n", type=int, default=400)
    ap.add_argument("--interval-ms", type=float, default=40.0)
    ap.add_argument("--client", choices=("aiohttp", "raw", "both"), default="both",
                    help="aiohttp's ClientSession, shipper's own HTTP/1.1 client, or both in turn")
    args = ap.parse_args(argv)
    for client in ("aiohttp", "raw") if args.client == "both" else (args.client,):
        fn = run if client == "aiohttp" else run_raw
        print(json.dumps(asyncio.run(fn(args.url, args.n, args.interval_ms / 1000))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
