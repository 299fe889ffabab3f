"""The floor of one request cycle: CPU per bulk request of a bare client, and of the same client
with the hand-over and the spool commit that shipper's design rules add to every cycle.

One keep-alive session posts a gzip'd bulk body (`--lines` pino documents, one by default) to the
sink every `--interval-ms`, `-n` times, and reads the answer: what shipper's request cycle (read,
build, write, send, ack) is compared with. Prints CPU-us per request of this process (after
imports and the first request). Clients:

- `sleep`: no request at all, only the loop's sleep and wake-up: the floor of any asyncio
  program that wakes every `--interval-ms`
- `aiohttp`: aiohttp's ClientSession; `raw`: shipper's own HTTP/1.1 client (`shipper/ship/http1.py`)
- `thread`: `raw`, with the body gzip'd on a one-worker thread and handed back to the loop (the
  spool thread's hand-over, without SQLite)
- `spool`: `raw`, with the body committed on that thread by a real `Spool.commit_acking` (gzip,
  one SQLite transaction carrying the previous request's ack), then posted: the least a cycle
  costs with SQLite and gzip off the loop and a record durable before it is sent
- `sync-sleep`, `sync-raw`, `sync-spool`: the same three cycles (the wake-up alone; gzip and one
  POST; a real spool commit and one POST) without asyncio: one plain thread that sleeps in
  `time.sleep`, commits on itself and posts on a blocking socket (`syncproto.py`'s `Poster`: the
  request head as `shipper/ship/http1.py` writes it, the answer read by its `parse_head`). The floor of
  a design that ran each request cycle synchronously in one thread, the loop kept for signals
- `both` (default): aiohttp and raw; `all`: all eight in turn

    python bench/floor.py URL [-n 400] [--interval-ms 40] [--lines 1]
                          [--client sleep|aiohttp|raw|thread|spool|sync-sleep|sync-raw|sync-spool|both|all]
                          [--handover spoolthread|executor]
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import json
import os
import resource
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
from isal import igzip

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))   # cold.py, gen.py, syncproto.py

BODY = b'{"create":{"_index":"bench","_id":"x"}}\n{"level":30,"time":1,"msg":"hello"}\n'


def body_of(lines: int) -> bytes:
    """A bulk body of `lines` pino documents (cold.py's, 350 bytes each), or the one-line BODY."""
    if lines <= 1:
        return BODY
    from cold import bulk_body
    return bulk_body(lines)


def _cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


HEADERS = {"Content-Type": "application/x-ndjson", "Content-Encoding": "gzip"}
Post = Callable[[bytes], Awaitable[tuple[int, bytes]]]


def _check(status: int, answer: bytes) -> None:
    if status != 200 or b'"errors":false' not in answer:
        raise RuntimeError(f"bulk failed: {status} {answer[:100]!r}")


Prepare = Callable[[], Awaitable[bytes]]
SYNC = ("sync-sleep", "sync-raw", "sync-spool")


async def _measure(client: str, post: Post, n: int, interval_s: float,
                   prepare: Prepare | None = None, body: bytes = BODY) -> dict[str, float | str]:
    """One request first (connect, warm up), then n requests every interval_s: CPU per request.
    `prepare` makes each request's gzip'd body (default: isal on the loop, as before)."""
    async def gz() -> bytes:
        return igzip.compress(body, 1)
    make = prepare or gz
    _check(*await post(await make()))
    cpu0, t0 = _cpu(), time.monotonic()
    for _ in range(n):
        await asyncio.sleep(interval_s)
        _check(*await post(await make()))
    cpu1, t1 = _cpu(), time.monotonic()
    return {"client": client, "requests": n, "cpu_s": cpu1 - cpu0, "seconds": t1 - t0,
            "cpu_us_per_request": (cpu1 - cpu0) / n * 1e6}


async def run_raw(url: str, n: int, interval_s: float, body: bytes = BODY, lines: int = 1,
                  mode: str = "raw", handover: str = "spoolthread") -> dict[str, float | str]:
    """The same cycle on shipper's own HTTP/1.1 client (shipper/ship/http1.py); mode `thread`
    gzips each body on a one-worker thread, `spool` commits it there (see the module's doc). The
    thread is `handover`: the daemon's `SpoolThread` (shipper/spool/aio.py), or `executor`, a
    one-worker ThreadPoolExecutor under `run_in_executor` (the daemon's before issue 14's
    thirteenth round)."""
    import tempfile
    from urllib.parse import urlsplit

    from shipper.ship.http1 import Origin, Pool
    parts = urlsplit(url)
    origin = Origin(parts.scheme, parts.hostname or "", parts.port or 80)
    pool = Pool()

    async def post(body: bytes) -> tuple[int, bytes]:
        r = await pool.request(origin, "POST", "/_bulk?filter_path=errors", HEADERS, body)
        return r.status, r.body
    from shipper.spool.aio import SpoolThread
    loop = asyncio.get_running_loop()
    executor = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="floor")
    worker = SpoolThread("floor")

    def on_thread(fn: Callable[..., Any], *args: Any) -> Awaitable[Any]:
        if handover == "executor":
            return loop.run_in_executor(executor, fn, *args)
        return worker.call(fn, *args)
    tmp = tempfile.TemporaryDirectory(prefix="floor-")
    prepare: Prepare | None = None
    if mode == "thread":
        async def prepare() -> bytes:
            out: bytes = await on_thread(igzip.compress, body, 1)
            return out
    elif mode == "spool":
        from cold import spool_committer
        commit = await on_thread(spool_committer, tmp.name, body, lines)

        async def prepare() -> bytes:
            out: bytes = await on_thread(commit)
            return out
    try:
        out = await _measure(mode, post, n, interval_s, prepare, body)
        if mode in ("thread", "spool"):
            out["handover"] = handover
        return out
    finally:
        pool.close()
        executor.shutdown()
        worker.stop()
        tmp.cleanup()


async def run_sleep(n: int, interval_s: float) -> dict[str, float | str]:
    """Only the loop's sleep and wake-up, n times: what waking at all costs on this machine."""
    cpu0, t0 = _cpu(), time.monotonic()
    for _ in range(n):
        await asyncio.sleep(interval_s)
    cpu1, t1 = _cpu(), time.monotonic()
    return {"client": "sleep", "requests": 0, "wakeups": n, "cpu_s": cpu1 - cpu0, "seconds": t1 - t0,
            "cpu_us_per_request": (cpu1 - cpu0) / n * 1e6}


def run_sync(url: str, n: int, interval_s: float, body: bytes = BODY, lines: int = 1,
             mode: str = "sync-raw") -> dict[str, float | str]:
    """The cycle with no event loop (see the module's doc): one thread, blocking sleep, commit and
    socket (syncproto.py's `Poster`); `sync-sleep` only sleeps."""
    import tempfile

    from syncproto import Poster
    if not url.startswith("http://"):
        raise SystemExit("the sync clients speak plain http only")
    tmp = tempfile.TemporaryDirectory(prefix="floor-")
    if mode == "sync-spool":
        from cold import spool_committer
        make = spool_committer(tmp.name, body, lines)
    else:
        def make() -> bytes:
            return igzip.compress(body, 1)
    poster = Poster(url, "bench")
    try:
        if mode != "sync-sleep":
            poster.post(make())            # the first request (warm-up), as _measure does
        cpu0, t0 = _cpu(), time.monotonic()
        for _ in range(n):
            time.sleep(interval_s)
            if mode != "sync-sleep":
                poster.post(make())
        cpu1, t1 = _cpu(), time.monotonic()
    finally:
        poster.close()
        tmp.cleanup()
    return {"client": mode, "requests": 0 if mode == "sync-sleep" else n, "cpu_s": cpu1 - cpu0,
            "seconds": t1 - t0, "cpu_us_per_request": (cpu1 - cpu0) / n * 1e6}


async def run(url: str, n: int, interval_s: float, body: bytes = BODY) -> dict[str, float | str]:
    async with aiohttp.ClientSession() as session:
        async def post(body: bytes) -> tuple[int, bytes]:
            async with session.post(url + "/_bulk?filter_path=errors", data=body, headers=HEADERS) as r:
                return r.status, await r.read()
        return await _measure("aiohttp", post, n, interval_s, body=body)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="aiohttp's CPU per bulk request (the floor)")
    ap.add_argument("url")
    ap.add_argument("-n", type=int, default=400)
    ap.add_argument("--interval-ms", type=float, default=40.0)
    ap.add_argument("--lines", type=int, default=1, help="pino documents per request (default 1)")
    ap.add_argument("--client", choices=("sleep", "aiohttp", "raw", "thread", "spool", *SYNC, "both", "all"),
                    default="both",
                    help="no request (the wake-up alone), aiohttp's ClientSession, shipper's own HTTP/1.1 "
                         "client, that client with a thread hand-over or a spool commit per request; "
                         "sync-*: sleep, raw and spool with no event loop (one thread, blocking I/O); "
                         "both: aiohttp and raw; all: all eight")
    ap.add_argument("--handover", choices=("spoolthread", "executor"), default="spoolthread",
                    help="thread, spool: the daemon's SpoolThread (default) or a ThreadPoolExecutor")
    args = ap.parse_args(argv)
    clients = {"both": ("aiohttp", "raw"), "all": ("sleep", "aiohttp", "raw", "thread", "spool", *SYNC)}.get(
        args.client, (args.client,))
    body = body_of(args.lines)
    for client in clients:
        if client == "sleep":
            result = asyncio.run(run_sleep(args.n, args.interval_ms / 1000))
        elif client in SYNC:
            result = run_sync(args.url, args.n, args.interval_ms / 1000, body, args.lines, client)
        elif client == "aiohttp":
            result = asyncio.run(run(args.url, args.n, args.interval_ms / 1000, body))
        else:
            result = asyncio.run(run_raw(args.url, args.n, args.interval_ms / 1000, body, args.lines, client,
                                         args.handover))
        result["lines"] = args.lines
        print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
