"""A fast stand-in for Elasticsearch's bulk API, for benchmarks: counts docs, acks them all.

Owns nothing of shipper; it only receives. Clients (naive.py, `shipper run`) POST bulk bodies
here; run.py and latency.py read the counters over HTTP (`GET /_bench/stats`). When measuring,
run it as its own process (`python bench/sink.py --port 0`, or `SinkProcess`) so its CPU is not
charged to the system under test and does not compete with the harness's own loop.

    python bench/sink.py [--host 127.0.0.1] [--port 0] [--latency-ms MS] [--verify] [--record-latency]

prints `{"url": ...}` as one JSON line once listening; prints its stats as one JSON line and exits
on SIGTERM/SIGINT or when stdin closes.
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import ctypes.util
import json
import os
import re
import signal
import stat
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import web

try:
    from isal import igzip as _gzip
except ImportError:  # pragma: no cover - isal is a shipper dependency
    import gzip as _gzip  # type: ignore[no-redef]

ES_VERSION = {
    "name": "bench-sink",
    "cluster_name": "bench",
    "cluster_uuid": "bench-sink-0000",
    "version": {
        "number": "8.13.0",
        "build_flavor": "default",
        "build_type": "docker",
        "lucene_version": "9.10.0",
        "minimum_wire_compatibility_version": "7.17.0",
        "minimum_index_compatibility_version": "7.0.0",
    },
    "tagline": "You Know, for Search",
}
_HEADERS = {"X-Elastic-Product": "Elasticsearch"}
_WT_RE = re.compile(rb'"wt":(\d+)')
_OPS = (b"create", b"index", b"update", b"delete")


@dataclass
class SinkStats:
    docs: int = 0
    requests: int = 0
    bytes_received: int = 0  # on the wire (compressed when gzip)
    bytes_decoded: int = 0
    gzip_requests: int = 0
    first_request_at: float | None = None  # time.time() when the first bulk body was fully read
    last_request_at: float | None = None
    other_requests: dict[str, int] = field(default_factory=dict)
    # --verify
    distinct_ids: set[bytes] = field(default_factory=set)
    duplicate_ids: int = 0
    docs_without_id: int = 0
    seqs: set[int] = field(default_factory=set)
    duplicate_seqs: int = 0
    bad_lines: int = 0
    # --record-latency: (arrival - wt) in ns, one per doc that carries "wt"
    latencies_ns: list[int] = field(default_factory=list)
    # --record-latency: per bulk request (arrival ns, docs, oldest doc's latency ns, newest doc's latency ns)
    requests_log: list[tuple[int, int, int, int]] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "docs": self.docs,
            "requests": self.requests,
            "bytes_received": self.bytes_received,
            "bytes_decoded": self.bytes_decoded,
            "gzip_requests": self.gzip_requests,
            "first_request_at": self.first_request_at,
            "last_request_at": self.last_request_at,
            "other_requests": dict(self.other_requests),
        }
        if self.distinct_ids or self.duplicate_ids or self.docs_without_id or self.seqs:
            out["verify"] = {
                "distinct_ids": len(self.distinct_ids),
                "duplicate_ids": self.duplicate_ids,
                "docs_without_id": self.docs_without_id,
                "distinct_seqs": len(self.seqs),
                "min_seq": min(self.seqs) if self.seqs else None,
                "max_seq": max(self.seqs) if self.seqs else None,
                "duplicate_seqs": self.duplicate_seqs,
                "bad_lines": self.bad_lines,
            }
        if self.latencies_ns:
            out["latency_ms"] = latency_summary(self.latencies_ns)
        if self.requests_log:
            out["slowest_requests"] = slowest_requests(self.requests_log)
        return out


def slowest_requests(log: list[tuple[int, int, int, int]], top: int = 8) -> list[dict[str, float | int]]:
    """The requests that carried the oldest docs: when they arrived (s after the first request),
    their doc count, oldest and newest doc latency (ms), and the gap since the previous request (ms)."""
    t0 = log[0][0]
    rows = []
    for i, (at, n, oldest, newest) in enumerate(log):
        gap = (at - log[i - 1][0]) / 1e6 if i else 0.0
        rows.append({"at_s": round((at - t0) / 1e9, 3), "at_unix": at / 1e9, "docs": n, "oldest_ms": round(oldest / 1e6, 1),
                     "newest_ms": round(newest / 1e6, 1), "gap_ms": round(gap, 1)})
    rows.sort(key=lambda r: -r["oldest_ms"])
    return rows[:top]


def latency_summary(values_ns: list[int]) -> dict[str, float | int]:
    """Nearest-rank percentiles of `values_ns`, in milliseconds."""
    v = sorted(values_ns)
    n = len(v)

    def pct(p: float) -> float:
        return v[min(n - 1, max(0, int(-(-p * n // 100)) - 1))] / 1e6

    return {"count": n, "p50": pct(50), "p90": pct(90), "p99": pct(99), "p999": pct(99.9),
            "max": v[-1] / 1e6, "min": v[0] / 1e6}


# ------------------------------------------------------------------ filter_path, like ES's

def _filter(value: Any, patterns: list[list[str]]) -> Any:
    """Keep the parts of `value` that match ES `filter_path` patterns (`*` one level, `**` any)."""
    if not patterns:
        return value
    if any(not p for p in patterns):
        return value
    if isinstance(value, list):
        kept = [_filter(v, patterns) for v in value]
        return [k for k in kept if k is not _MISSING]
    if not isinstance(value, dict):
        return _MISSING
    out: dict[str, Any] = {}
    for key, sub in value.items():
        rest: list[list[str]] = []
        for p in patterns:
            head = p[0]
            if head == "**":
                rest.append(p)          # ** may swallow this key
                if len(p) > 1 and _matches(p[1], key):
                    rest.append(p[2:])
            elif _matches(head, key):
                rest.append(p[1:])
        if not rest:
            continue
        kept = _filter(sub, rest)
        if kept is _MISSING or kept == {} or kept == []:
            if any(not r for r in rest):
                out[key] = sub
            continue
        out[key] = kept
    return out if out else _MISSING


def _matches(pattern: str, key: str) -> bool:
    if pattern == "*":
        return True
    if "*" in pattern:
        return re.fullmatch(re.escape(pattern).replace(r"\*", ".*"), key) is not None
    return pattern == key


class _Missing:
    pass


_MISSING: Any = _Missing()


class Sink:
    """The bulk sink as an aiohttp app on this loop. `await start()` -> url; `await stop()`."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0, latency_ms: float = 0.0,
                 verify: bool = False, record_latency: bool = False) -> None:
        self.host = host
        self.port = port
        self.latency_s = latency_ms / 1000.0
        self.verify = verify
        self.record_latency = record_latency
        self.stats = SinkStats()
        self.url = ""
        self._runner: web.AppRunner | None = None
        self._answers: dict[tuple[str | None, int, bytes, str], bytes] = {}
        self._waiters: list[tuple[int, asyncio.Future[None]]] = []

    async def start(self) -> str:
        app = web.Application(client_max_size=1024**3)
        app.router.add_get("/", self._root)
        app.router.add_get("/_bench/stats", self._stats)
        app.router.add_post("/_bench/reset", self._reset)
        app.router.add_get("/_bench/wait", self._wait)
        app.router.add_post("/_bulk", self._bulk)
        app.router.add_put("/_bulk", self._bulk)
        app.router.add_post("/{index}/_bulk", self._bulk)
        app.router.add_put("/{index}/_bulk", self._bulk)
        app.router.add_route("*", "/{tail:.*}", self._other)
        # GET / also answers HEAD / (aiohttp adds HEAD for GET routes)
        # auto_decompress=False: count bytes as sent on the wire and decompress with isal ourselves
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False, auto_decompress=False)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port, backlog=128)
        await site.start()
        server = site._server
        assert isinstance(server, asyncio.base_events.Server) and server.sockets
        port = server.sockets[0].getsockname()[1]
        self.port = port
        self.url = f"http://{self.host}:{port}"
        return self.url

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    def reset(self) -> None:
        self.stats = SinkStats()

    # ------------------------------------------------------------------ handlers

    async def _root(self, request: web.Request) -> web.Response:
        return web.json_response(ES_VERSION, headers=_HEADERS)

    async def _stats(self, request: web.Request) -> web.Response:
        return web.Response(body=orjson.dumps(self.stats.summary()), content_type="application/json")

    async def _reset(self, request: web.Request) -> web.Response:
        self.reset()
        return web.Response(body=b'{"reset":true}', content_type="application/json")

    async def _wait(self, request: web.Request) -> web.Response:
        """Long poll: answer as soon as `docs` docs have arrived, or after `timeout` seconds."""
        want = int(request.query.get("docs", "0"))
        timeout_s = float(request.query.get("timeout", "1"))
        if self.stats.docs < want:
            fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            entry = (want, fut)
            self._waiters.append(entry)
            try:
                await asyncio.wait_for(fut, timeout_s)
            except TimeoutError:
                pass
            finally:
                if entry in self._waiters:
                    self._waiters.remove(entry)
        return web.Response(body=orjson.dumps(self.stats.summary()), content_type="application/json")

    async def _other(self, request: web.Request) -> web.Response:
        key = f"{request.method} {request.path}"
        other = self.stats.other_requests
        other[key] = other.get(key, 0) + 1
        await request.read()
        if request.method == "HEAD":
            return web.Response(status=200, headers=_HEADERS)
        return web.Response(body=b"{}", content_type="application/json", headers=_HEADERS)

    async def _bulk(self, request: web.Request) -> web.Response:
        raw = await request.read()
        arrived_ns = time.time_ns()
        stats = self.stats
        stats.bytes_received += len(raw)
        if request.headers.get("Content-Encoding", "").lower() == "gzip":
            body = _gzip.decompress(raw)  # type: ignore[no-untyped-call]   # isal's igzip.decompress has no annotations
            stats.gzip_requests += 1
        else:
            body = raw
        stats.bytes_decoded += len(body)
        lines = body.count(b"\n") + (1 if body and not body.endswith(b"\n") else 0)
        n = lines // 2
        stats.docs += n
        stats.requests += 1
        now = arrived_ns / 1e9
        if stats.first_request_at is None:
            stats.first_request_at = now
        stats.last_request_at = now
        if self.record_latency:
            lat = [arrived_ns - int(m) for m in _WT_RE.findall(body)]
            if lat:
                stats.latencies_ns.extend(lat)
                stats.requests_log.append((arrived_ns, len(lat), max(lat), min(lat)))
        ids: list[tuple[bytes | None, bool]] | None = None
        if self.verify:
            ids = self._check(body)
        self._wake()
        if self.latency_s:
            await asyncio.sleep(self.latency_s)
        index = request.match_info.get("index", "")
        answer = self._answer(request.query.get("filter_path"), n, body, index, ids)
        return web.Response(body=answer, content_type="application/json", headers=_HEADERS)

    def _wake(self) -> None:
        docs = self.stats.docs
        for want, fut in self._waiters:
            if docs >= want and not fut.done():
                fut.set_result(None)

    def _check(self, body: bytes) -> list[tuple[bytes | None, bool]]:
        """--verify: parse every action and doc, count distinct _id and `seq`, note duplicates.

        Returns (id, is_duplicate) per item, so that a repeated `create` is answered 409 like ES.
        """
        stats = self.stats
        ids: list[tuple[bytes | None, bool]] = []
        parts = body.split(b"\n")
        if parts and parts[-1] == b"":
            parts.pop()
        for i in range(0, len(parts) - 1, 2):
            try:
                action = orjson.loads(parts[i])
                doc = orjson.loads(parts[i + 1])
            except orjson.JSONDecodeError:
                stats.bad_lines += 1
                ids.append((None, False))
                continue
            meta = next(iter(action.values())) if isinstance(action, dict) and action else {}
            doc_id = meta.get("_id") if isinstance(meta, dict) else None
            if doc_id is None:
                stats.docs_without_id += 1
                ids.append((None, False))
            else:
                key = str(doc_id).encode()
                is_dup = key in stats.distinct_ids
                if is_dup:
                    stats.duplicate_ids += 1
                else:
                    stats.distinct_ids.add(key)
                ids.append((key, is_dup))
            seq = doc.get("seq") if isinstance(doc, dict) else None
            if isinstance(seq, int):
                if seq in stats.seqs:
                    stats.duplicate_seqs += 1
                else:
                    stats.seqs.add(seq)
        return ids

    def _answer(self, filter_path: str | None, n: int, body: bytes, index: str,
                ids: list[tuple[bytes | None, bool]] | None) -> bytes:
        # The op of the first action stands for all (clients send one kind); --verify gives exact ids.
        end = body.find(b"\n")
        first = body[:end if end >= 0 else len(body)]
        op = next((o for o in _OPS if b'"' + o + b'"' in first), b"index")
        key = (filter_path, n, op, index)
        if ids is None:
            cached = self._answers.get(key)
            if cached is not None:
                return cached
        op_s = op.decode()
        status = 201 if op in (b"create", b"index") else 200
        result = "created" if status == 201 else "updated" if op == b"update" else "deleted"
        items = []
        has_errors = False
        for i in range(n):
            item: dict[str, Any] = {"_index": index or "bench", "_version": 1, "result": result,
                                    "_shards": {"total": 1, "successful": 1, "failed": 0},
                                    "_seq_no": i, "_primary_term": 1, "status": status}
            if ids is not None and i < len(ids):
                doc_id, is_dup = ids[i]
                if doc_id is not None:
                    item["_id"] = doc_id.decode()
                if is_dup and op == b"create":
                    has_errors = True
                    item = {"_index": item["_index"], "_id": item.get("_id"), "status": 409,
                            "error": {"type": "version_conflict_engine_exception",
                                      "reason": "version conflict, document already exists"}}
            items.append({op_s: item})
        response: dict[str, Any] = {"took": 1, "errors": has_errors, "items": items}
        if filter_path:
            patterns = [p.strip().split(".") for p in filter_path.split(",") if p.strip()]
            filtered = _filter(response, patterns)
            response = {} if filtered is _MISSING else filtered
        answer = orjson.dumps(response)
        if ids is None:
            if len(self._answers) > 256:
                self._answers.clear()
            self._answers[key] = answer
        return answer


class ThreadedSink:
    """`Sink` on its own event loop in a daemon thread, for in-process use (tests, quick checks)."""

    def __init__(self, **kwargs: Any) -> None:
        self._kwargs = kwargs
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="bench-sink", daemon=True)
        self.sink: Sink | None = None

    def start(self) -> str:
        self._thread.start()
        self.sink = Sink(**self._kwargs)
        return asyncio.run_coroutine_threadsafe(self.sink.start(), self._loop).result(10)

    def stats(self) -> dict[str, Any]:
        assert self.sink is not None
        return asyncio.run_coroutine_threadsafe(self._summary(), self._loop).result(10)

    async def _summary(self) -> dict[str, Any]:
        assert self.sink is not None
        return self.sink.stats.summary()

    def stop(self) -> None:
        if self.sink is not None:
            asyncio.run_coroutine_threadsafe(self.sink.stop(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)


class SinkProcess:
    """`python bench/sink.py` as a child process; talks to it over HTTP (stats, reset, wait)."""

    def __init__(self, latency_ms: float = 0.0, verify: bool = False, record_latency: bool = False,
                 python: str = sys.executable) -> None:
        cmd = [python, os.path.abspath(__file__), "--port", "0", "--latency-ms", str(latency_ms)]
        if verify:
            cmd.append("--verify")
        if record_latency:
            cmd.append("--record-latency")
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"sink exited before listening (code {self.proc.wait()})")
        self.url: str = json.loads(line)["url"]
        self.final_stats: dict[str, Any] | None = None

    def _call(self, method: str, path: str, timeout_s: float = 10.0) -> dict[str, Any]:
        req = urllib.request.Request(self.url + path, method=method, data=b"" if method == "POST" else None)
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            result: dict[str, Any] = json.loads(resp.read())
            return result

    def stats(self) -> dict[str, Any]:
        return self._call("GET", "/_bench/stats")

    def reset(self) -> None:
        self._call("POST", "/_bench/reset")

    def wait_docs(self, docs: int, timeout_s: float) -> dict[str, Any]:
        """Block until `docs` docs arrived or `timeout_s` passed; returns the stats either way."""
        return self._call("GET", f"/_bench/wait?docs={docs}&timeout={timeout_s}", timeout_s + 10)

    def stop(self) -> dict[str, Any] | None:
        if self.proc.poll() is None:
            assert self.proc.stdin is not None and self.proc.stdout is not None
            self.proc.stdin.close()
            out = self.proc.stdout.read()
            self.proc.stdout.close()
            self.proc.wait(10)
            lines = [ln for ln in out.splitlines() if ln.strip()]
            if lines:
                self.final_stats = json.loads(lines[-1])
        return self.final_stats


async def _serve(args: argparse.Namespace) -> None:
    sink = Sink(args.host, args.port, args.latency_ms, args.verify, args.record_latency)
    url = await sink.start()
    print(json.dumps({"url": url, "pid": os.getpid()}), flush=True)
    loop = asyncio.get_running_loop()
    done = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, done.set)

    def on_stdin() -> None:
        if not os.read(sys.stdin.fileno(), 65536):
            loop.remove_reader(sys.stdin.fileno())
            done.set()

    # Only a pipe (a parent holding our stdin) or a terminal can "close"; /dev/null would read
    # EOF at once, so then only signals stop us.
    try:
        mode = os.fstat(sys.stdin.fileno()).st_mode
    except (OSError, ValueError):
        mode = 0
    if stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode) or sys.stdin.isatty():
        loop.add_reader(sys.stdin.fileno(), on_stdin)
    await done.wait()
    summary = sink.stats.summary()
    await sink.stop()
    try:
        print(json.dumps(summary), flush=True)
    except BrokenPipeError:
        pass  # whoever started us is gone


# glibc serves an allocation over 128 KiB with a fresh mmap and unmaps it when freed, so every
# large request body (and its decompressed copy) faults its pages in anew: ~0.7 CPU-s per 1M docs
# in 200 KB gzip bodies (~900 KB decoded) on a VM, against nothing for bodies under 128 KiB. That
# cost is the sink's own and a real Elasticsearch pays it on its own machine; here it shares the
# cores with the system under test, so it would be charged to whichever system sends large
# bodies. The sink keeps such buffers in its heap instead (the same thing for every system).
_HEAP_BUFFERS_UP_TO = 64 * 1024 * 1024
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3     # glibc's mallopt parameters (malloc.h)


def keep_buffers_in_heap() -> bool:
    """mallopt: allocations up to 64 MiB from the heap, and freed heap kept for the next body."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):      # not glibc: nothing to tune
        return False
    ok: bool = mallopt(_M_MMAP_THRESHOLD, _HEAP_BUFFERS_UP_TO) == 1
    trimmed: bool = mallopt(_M_TRIM_THRESHOLD, 2 * _HEAP_BUFFERS_UP_TO) == 1
    return ok and trimmed


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="a fast Elasticsearch bulk sink for benchmarks")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--latency-ms", type=float, default=0.0, help="delay before each bulk answer")
    ap.add_argument("--verify", action="store_true", help="parse actions: count distinct _id and seq")
    ap.add_argument("--record-latency", action="store_true",
                    help="record arrival - wt (ns) for each doc carrying a \"wt\" field")
    args = ap.parse_args(argv)
    keep_buffers_in_heap()
    asyncio.run(_serve(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
