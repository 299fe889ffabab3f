"""A scriptable, fault-injecting HTTP proxy in front of osmem (or any Elasticsearch).

It runs an aiohttp low-level server and ClientSession on its own thread and event loop, so
sync tests, async tests and a daemon subprocess can all use it. Requests are forwarded
verbatim (compressed bodies stay compressed); faults are switched on and off while it runs.
It logs nothing: no headers, no credentials, no bodies.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import fnmatch
import gzip
import io
import json
import random
import socket
import ssl
import threading
import time
import urllib.parse
from collections import deque
from collections.abc import Callable, Hashable
from typing import Any, Union

import aiohttp
from aiohttp import web
from multidict import CIMultiDict, CIMultiDictProxy
from yarl import URL

from tests.support import promptness, sigv4
from tests.support.promptness import Timeline

# Headers that belong to one hop, or that aiohttp recomputes for the forwarded request.
_HOP = frozenset(
    h.lower()
    for h in (
        "Connection", "Keep-Alive", "Proxy-Authenticate", "Proxy-Authorization", "TE", "Trailers",
        "Transfer-Encoding", "Upgrade", "Host", "Content-Length",
    )
)
_AUTO = ("User-Agent", "Accept", "Accept-Encoding", "Content-Type")

_ERROR_TYPES = {
    400: ("illegal_argument_exception", "bad request"),
    401: ("security_exception", "missing authentication credentials for REST request [/_bulk]"),
    403: ("security_exception", "action [indices:data/write/bulk] is unauthorized"),
    404: ("index_not_found_exception", "no such index"),
    409: ("version_conflict_engine_exception", "version conflict, document already exists"),
    429: (
        "es_rejected_execution_exception",
        "rejected execution of coordinating operation [coordinating_and_primary_bytes=0, replica_bytes=0, "
        "all_bytes=0, coordinating_operation_bytes=1048576, max_coordinating_and_primary_bytes=1048576]",
    ),
    500: ("exception", "internal server error"),
    502: ("exception", "bad gateway"),
    503: ("unavailable_shards_exception", "primary shard is not active"),
    504: ("timeout_exception", "gateway timeout"),
}

ItemVerdict = Union[None, int, "tuple[int, str, str]", str]
FAILURE_STORE = "failure_store"   # an item verdict: taken into the failure store (see item_failures)


def error_body(status: int, error_type: str | None = None, reason: str | None = None) -> bytes:
    """An Elasticsearch-style JSON error document for `status`."""
    default_type, default_reason = _ERROR_TYPES.get(status, ("exception", f"HTTP {status}"))
    err = {"type": error_type or default_type, "reason": reason or default_reason}
    return json.dumps({"error": {"root_cause": [err], **err}, "status": status}).encode()


@dataclasses.dataclass(frozen=True)
class BulkItem:
    """One bulk action as the proxy saw it. `n` counts items across all bulk requests (from 0)."""

    n: int
    op: str
    index: str | None
    id: str | None
    source: bytes | None


@dataclasses.dataclass(frozen=True)
class Exchange:
    method: str
    path: str
    status: int
    body_bytes: int
    forwarded: bool


@dataclasses.dataclass
class _Fail:
    status: int
    times: int
    retry_after: int | float | str | None
    body: bytes | None


def _filter_path(value: Any, patterns: list[list[str]]) -> Any:
    """Elasticsearch's `filter_path` (inclusions with `*` inside a segment; no `**`, no `-`)."""
    missing = _filter_path
    if any(not p for p in patterns):
        return value
    if isinstance(value, list):
        out_l = [f for f in (_filter_path(v, patterns) for v in value) if f is not missing]
        return out_l if out_l else missing
    if isinstance(value, dict):
        out_d: dict[str, Any] = {}
        for k, v in value.items():
            sub = [p[1:] for p in patterns if fnmatch.fnmatchcase(k, p[0])]
            if sub:
                f = _filter_path(v, sub)
                if f is not missing:
                    out_d[k] = f
        return out_d if out_d else missing
    return missing


def apply_filter_path(doc: Any, filter_path: str) -> Any:
    specs = [s.strip() for s in filter_path.split(",") if s.strip()]
    if not specs or any(s.startswith("-") or "**" in s for s in specs):
        return doc  # unsupported forms: answer unfiltered rather than wrongly filtered
    out = _filter_path(doc, [s.split(".") for s in specs])
    return {} if out is _filter_path else out


class FaultProxy:
    """HTTP proxy on 127.0.0.1 to `upstream_url` with switchable faults; see the module doc.

    Checks per request, in order: latency, basic auth (401), max_body (413), fail_next,
    fail_ratio, then for `_bulk`: blocked (every item 403) and item_failures (failed items are
    removed from the forwarded body, so they really are not indexed). Otherwise it forwards.
    """

    def __init__(self, upstream_url: str, *, host: str = "127.0.0.1", port: int = 0,
                 ssl_context: ssl.SSLContext | None = None, reports_outages: bool = True) -> None:
        self.upstream_url = upstream_url.rstrip("/")
        self.reports_outages = reports_outages
        self.host = host
        self._port = port
        self._ssl_context = ssl_context       # set: it answers https (the test's certificates)
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._session: aiohttp.ClientSession | None = None
        self._server: web.Server | None = None
        self._runner: web.ServerRunner | None = None
        self._site: web.SockSite | None = None
        self._sock: socket.socket | None = None
        self._reset_faults()
        self._requests = 0
        self._forwarded = 0
        self._bodies_seen = 0
        self._by_status: dict[int, int] = {}
        self._last_headers: CIMultiDict[str] = CIMultiDict()
        self._history: list[Exchange] = []
        self._items_seen = 0
        self._items_failed = 0
        self._hanging = 0

    def _reset_faults(self) -> None:
        self._fail_queue: deque[_Fail] = deque()
        self._ratio: tuple[int, float, int | float | str | None] | None = None
        self._rng = random.Random(0)
        self._latency_s = 0.0
        self._max_body: int | None = None
        self._auth: str | None = None
        self._item_fn: Callable[[BulkItem], ItemVerdict] | None = None
        self._blocked = False
        self._is_down = False
        self._reset_left = 0
        self._hang_left = 0
        self._hang_forward = False
        self._sigv4: tuple[Callable[[str], Any], str, str] | None = None

    # ------------------------------------------------------------------ lifecycle

    @property
    def port(self) -> int:
        return self._port

    @property
    def url(self) -> str:
        return f"{'https' if self._ssl_context else 'http'}://{self.host}:{self._port}"

    def start(self) -> FaultProxy:
        if self._thread is not None:
            raise RuntimeError("proxy already started")
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._thread_main, name="fault-proxy", daemon=True)
        self._thread.start()
        self._call(self._astart())
        return self

    def stop(self) -> None:
        """Close connections, the listener and the upstream session; join the thread."""
        if self._thread is None or self._loop is None:
            return
        try:
            self._call(self._astop())
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)
            self._thread = None

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _thread_main(self) -> None:
        assert self._loop is not None
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_forever()
        finally:
            self._loop.run_until_complete(self._loop.shutdown_asyncgens())
            self._loop.close()

    def _call(self, coro: Any, timeout_s: float = 10.0) -> Any:
        assert self._loop is not None and self._thread is not None
        if threading.get_ident() == self._thread.ident:
            coro.close()
            raise RuntimeError("FaultProxy controls that touch sockets cannot run on the proxy's own thread")
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout_s)

    async def _astart(self) -> None:
        self._session = aiohttp.ClientSession(
            auto_decompress=False,
            timeout=aiohttp.ClientTimeout(total=300),
            connector=aiohttp.TCPConnector(limit=64),
        )
        self._server = web.Server(self._handle, handler_cancellation=True, access_log=None, auto_decompress=False)
        self._runner = web.ServerRunner(self._server, shutdown_timeout=2.0)
        await self._runner.setup()
        await self._listen()

    async def _listen(self) -> None:
        assert self._runner is not None
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((self.host, self._port))
        except OSError:
            sock.close()
            raise
        self._port = sock.getsockname()[1]
        self._sock = sock
        self._site = web.SockSite(self._runner, sock, ssl_context=self._ssl_context)
        await self._site.start()

    async def _unlisten(self) -> None:
        """Close the listener and drop every connection, also one accepted in this very loop turn.

        asyncio accepts a connection in one loop turn and makes its transport in the next. When the
        server is closed in between (a busy loop: the accept and `down()` land in the same turn),
        asyncio drops that socket without a word (Python 3.11: `Server._attach` asserts; CPython
        gh-109564): never read, never closed, so the client waits out its whole request timeout, after
        `up()` too. So accepting stops first, one turn lets accepted sockets get their transports,
        and only then the server closes.
        """
        loop = asyncio.get_running_loop()
        if self._site is not None:
            if self._sock is not None:
                loop.remove_reader(self._sock.fileno())   # asyncio's accept handler: no new accepts
            await asyncio.sleep(0)
            await self._site.stop()
            self._site = None
            self._sock = None
        # A dead server also drops established (keep-alive) connections, not only the listener; a
        # transport made in the last turn gets its connection_made in the next, hence a few passes.
        if self._server is not None:
            for _ in range(3):
                for conn in self._server.connections:
                    if conn.transport is not None and not conn.transport.is_closing():
                        conn.transport.abort()
                await asyncio.sleep(0)

    async def _astop(self) -> None:
        await self._unlisten()
        if self._runner is not None:
            await self._runner.cleanup()
        if self._session is not None:
            await self._session.close()
        current = asyncio.current_task()
        others = [t for t in asyncio.all_tasks() if t is not current]
        for t in others:
            t.cancel()
        await asyncio.gather(*others, return_exceptions=True)

    # ------------------------------------------------------------------ controls

    def _outage(self, what: str, begins: bool) -> None:
        # An outage SPEC allows lines to wait out: the promptness bound counts from its end. A
        # proxy that is one of several hosts says `reports_outages=False`: the others must serve.
        if self.reports_outages:
            promptness.note_outage(f"{what} ({self.url})", begins)

    def down(self) -> None:
        """Refuse connections: close the listener and drop open connections (until `up()`)."""
        with self._lock:
            self._is_down = True
        self._outage("destination down", True)
        self._call(self._unlisten())

    def up(self) -> None:
        """Listen again on the same port."""
        if self._site is None:
            self._call(self._listen())
        with self._lock:
            self._is_down = False
        self._outage("destination down", False)

    def stall(self, seconds: float) -> None:
        """Block the proxy's event loop for `seconds`, as a loaded machine does; returns once it is
        blocked. Connections made meanwhile wait in the kernel's backlog, and controls called
        meanwhile run when it ends, in the same loop turn as those accepts."""
        assert self._loop is not None
        blocked = threading.Event()

        def block() -> None:
            blocked.set()
            time.sleep(seconds)

        self._loop.call_soon_threadsafe(block)
        if not blocked.wait(10):
            raise RuntimeError("the proxy's loop did not run the stall")

    @property
    def is_down(self) -> bool:
        with self._lock:
            return self._is_down

    def fail_next(
        self, status: int, times: int = 1, retry_after: int | float | str | None = None, body: bytes | str | None = None
    ) -> None:
        """Answer the next `times` requests with `status` without forwarding them (queued in order)."""
        raw = body.encode() if isinstance(body, str) else body
        with self._lock:
            self._fail_queue.append(_Fail(status, times, retry_after, raw))

    def fail_ratio(self, status: int, ratio: float, retry_after: int | float | str | None = None, seed: int = 0) -> None:
        """Answer a `ratio` share of requests with `status`, drawn from random.Random(seed); 0 turns it off."""
        with self._lock:
            self._ratio = (status, ratio, retry_after) if ratio > 0 else None
            self._rng = random.Random(seed)

    def latency(self, seconds: float) -> None:
        """Delay every answer by `seconds` (0 turns it off)."""
        with self._lock:
            self._latency_s = max(0.0, seconds)

    def max_body(self, nbytes: int | None) -> None:
        """Answer 413 to a request whose body on the wire (compressed, if it is) exceeds `nbytes`."""
        with self._lock:
            self._max_body = nbytes

    def require_sigv4(self, lookup: Callable[[str], Any] | None, region: str = "", service: str = "es") -> None:
        """Answer 403 (as Amazon OpenSearch does) to a request whose AWS Signature Version 4 does not
        verify (tests/support/sigv4.py, with `lookup` finding credentials by access key id);
        x-amz-content-sha256 is required. None turns it off. `sigv4_refused`, `sigv4_keys` count."""
        with self._lock:
            self._sigv4 = (lookup, region, service) if lookup is not None else None
            self.sigv4_refused: list[str] = []
            self.sigv4_keys: list[str] = []

    def require_basic_auth(self, user: str | None, password: str | None = None) -> None:
        """Answer 401 (with WWW-Authenticate) unless these Basic credentials are sent; None turns it off."""
        with self._lock:
            if user is None:
                self._auth = None
            else:
                token = base64.b64encode(f"{user}:{password or ''}".encode()).decode()
                self._auth = f"Basic {token}"

    def item_failures(self, fn: Callable[[BulkItem], ItemVerdict] | None) -> None:
        """Per bulk item: `fn(item)` returns None (forward it), a status, (status, type, reason), or
        FAILURE_STORE.

        Failed items are stripped from the forwarded body and answered in place in the bulk
        answer. A FAILURE_STORE item is what Elasticsearch 8.19/9.x does with a document a data
        stream cannot index when its failure store is on: it is written to `.fs-<index>` (the
        store's stand-in) and answered 201 with `failure_store: used`, `errors` staying false.
        `fn` runs on the proxy thread under its lock: keep it quick, call no controls.
        """
        with self._lock:
            self._item_fn = fn

    def reject_items(self, status: int = 429, every_nth: int = 2, times: int | None = None) -> None:
        """Fail every `every_nth` bulk item (counted across requests, so a re-sent item can pass),
        at most `times` items; with 429 the error is es_rejected_execution_exception."""
        if every_nth < 1:
            raise ValueError("every_nth must be at least 1")
        rejected = [0]

        def fn(item: BulkItem) -> ItemVerdict:
            if (item.n + 1) % every_nth == 0 and (times is None or rejected[0] < times):
                rejected[0] += 1
                return status
            return None

        self.item_failures(fn)

    def reset_next(self, times: int = 1) -> None:
        """Read the next `times` requests, then drop their connections without an answer (the client
        sees the server disconnect: a transport failure, as a crashed node gives)."""
        with self._lock:
            self._reset_left += times

    def hang_next(self, times: int = 1, *, forward: bool = False) -> None:
        """Read the next `times` requests and never answer them until `down()` or `stop()` drops their
        connections (a dead peer, a load balancer that accepts and hangs). With `forward` the request
        reaches the upstream first (its documents are indexed) and only the answer is withheld."""
        with self._lock:
            self._hang_left += times
            self._hang_forward = forward

    @property
    def hanging(self) -> int:
        """Requests held unanswered by `hang_next` right now."""
        with self._lock:
            return self._hanging

    def blocked(self, flag: bool = True) -> None:
        """Answer every bulk item with 403 cluster_block_exception (a write-blocked index)."""
        with self._lock:
            self._blocked = flag
        self._outage("index blocked", flag)

    def reset(self) -> None:
        """Turn every fault off and listen again if down (counters are kept)."""
        self.up()
        self.blocked(False)
        with self._lock:
            self._reset_faults()

    # ------------------------------------------------------------------ counters

    @property
    def requests(self) -> int:
        with self._lock:
            return self._requests

    @property
    def forwarded(self) -> int:
        """Requests that reached the upstream."""
        with self._lock:
            return self._forwarded

    @property
    def by_status(self) -> dict[int, int]:
        with self._lock:
            return dict(self._by_status)

    @property
    def bodies_seen(self) -> int:
        """Request body bytes received, as on the wire."""
        with self._lock:
            return self._bodies_seen

    @property
    def last_headers(self) -> CIMultiDict[str]:
        with self._lock:
            return CIMultiDict(self._last_headers)

    @property
    def history(self) -> list[Exchange]:
        with self._lock:
            return list(self._history)

    @property
    def items_seen(self) -> int:
        with self._lock:
            return self._items_seen

    @property
    def items_failed(self) -> int:
        """Bulk items answered with an injected failure (item_failures, reject_items, blocked)."""
        with self._lock:
            return self._items_failed

    # ------------------------------------------------------------------ the handler

    def _answer(self, request: web.BaseRequest, body_len: int, status: int, forwarded: bool) -> None:
        with self._lock:
            self._by_status[status] = self._by_status.get(status, 0) + 1
            if forwarded:
                self._forwarded += 1
            self._history.append(Exchange(request.method, request.raw_path, status, body_len, forwarded))

    @staticmethod
    def _error(status: int, retry_after: int | float | str | None = None, body: bytes | None = None) -> web.Response:
        headers = {}
        if retry_after is not None:
            headers["Retry-After"] = str(retry_after)
        if body is None:
            body = b"" if status == 413 else error_body(status)
        if body[:1] in (b"{", b"["):
            headers["Content-Type"] = "application/json; charset=UTF-8"
        return web.Response(status=status, body=body, headers=headers)

    async def _handle(self, request: web.BaseRequest) -> web.StreamResponse:
        body = await request.content.read()
        with self._lock:
            self._requests += 1
            self._bodies_seen += len(body)
            self._last_headers = CIMultiDict(request.headers)
            latency_s = self._latency_s
            verdict = self._decide(request, body)
            is_bulk = request.method in ("POST", "PUT") and request.path.rstrip("/").endswith("/_bulk")
            item_fn = self._item_fn
            blocked = self._blocked
            reset = self._reset_left > 0 and verdict is None
            hang = not reset and self._hang_left > 0 and verdict is None
            if reset:
                self._reset_left -= 1
            if hang:
                self._hang_left -= 1
            hang_forward = self._hang_forward
        if reset:
            if request.transport is not None:
                request.transport.abort()
            await asyncio.Event().wait()      # cancelled with the connection (handler_cancellation)
        if hang:
            await self._hang(request, body, hang_forward)
        if latency_s:
            await asyncio.sleep(latency_s)
        if verdict is not None:
            self._answer(request, len(body), verdict.status, False)
            return verdict
        if is_bulk and (blocked or item_fn is not None):
            return await self._bulk_with_failures(request, body, blocked)
        status, resp, reached = await self._forward(request, body)
        self._answer(request, len(body), status, reached)
        return resp

    async def _hang(self, request: web.BaseRequest, body: bytes, forward: bool) -> None:
        """Never return: the handler is cancelled when down() or stop() drops the connection."""
        if forward:
            _status, _resp, reached = await self._forward(request, body)
            with self._lock:
                self._forwarded += int(reached)
        with self._lock:
            self._hanging += 1
        try:
            await asyncio.Event().wait()
        finally:
            with self._lock:
                self._hanging -= 1

    def _decide(self, request: web.BaseRequest, body: bytes) -> web.Response | None:
        """Under the lock: the injected answer for this request, or None to go on."""
        if self._sigv4 is not None:
            lookup, region, service = self._sigv4
            headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in request.raw_headers]
            problem = sigv4.verify(request.method, request.raw_path, headers, body, lookup, region, service)
            if problem is not None:
                self.sigv4_refused.append(problem)
                return web.Response(status=403, body=json.dumps({"message": problem}).encode(),
                                    headers={"Content-Type": "application/json"})
            auth = request.headers.get("Authorization", "")
            self.sigv4_keys.append(auth.split("Credential=", 1)[1].split("/", 1)[0])
        if self._auth is not None and request.headers.get("Authorization") != self._auth:
            resp = self._error(401, body=error_body(401, reason=f"missing authentication credentials for REST request [{request.path}]"))
            resp.headers["WWW-Authenticate"] = 'Basic realm="security" charset="UTF-8"'
            return resp
        if self._max_body is not None and len(body) > self._max_body:
            return self._error(413)
        if self._fail_queue:
            f = self._fail_queue[0]
            f.times -= 1
            if f.times <= 0:
                self._fail_queue.popleft()
            return self._error(f.status, f.retry_after, f.body)
        if self._ratio is not None and self._rng.random() < self._ratio[1]:
            return self._error(self._ratio[0], self._ratio[2])
        return None

    def _upstream_headers(self, request: web.BaseRequest, drop: tuple[str, ...] = ()) -> tuple[CIMultiDict[str], set[str]]:
        headers: CIMultiDict[str] = CIMultiDict()
        for k, v in request.headers.items():
            if k.lower() not in _HOP and k.lower() not in drop:
                headers.add(k, v)
        skip = {h for h in _AUTO if h not in headers}
        return headers, skip

    async def _send(
        self, method: str, path_qs: str, headers: CIMultiDict[str], skip: set[str], body: bytes
    ) -> tuple[int, CIMultiDictProxy[str] | None, bytes]:
        assert self._session is not None
        url = URL(self.upstream_url + path_qs, encoded=True)
        try:
            # aiohttp warns (an error under filterwarnings) on a raw body over 1 MiB: a stream it is
            data: bytes | io.BytesIO | None = (body if len(body) <= 1 << 20 else io.BytesIO(body)) if body else None
            async with self._session.request(
                method, url, headers=headers, data=data, skip_auto_headers=skip, allow_redirects=False
            ) as resp:
                return resp.status, resp.headers, await resp.read()
        except (TimeoutError, aiohttp.ClientError, OSError) as e:
            return 502, None, f"fault proxy: upstream unreachable: {type(e).__name__}".encode()

    async def _forward(self, request: web.BaseRequest, body: bytes) -> tuple[int, web.Response, bool]:
        """Forward verbatim; returns (status, answer, whether the upstream answered)."""
        headers, skip = self._upstream_headers(request)
        status, up_headers, data = await self._send(request.method, request.raw_path, headers, skip, body)
        if up_headers is None:
            return status, web.Response(status=status, body=data, headers={"X-Fault-Proxy": "upstream-error"}), False
        out: CIMultiDict[str] = CIMultiDict()
        for k, v in up_headers.items():
            if k.lower() not in _HOP:
                out.add(k, v)
        return status, web.Response(status=status, body=data, headers=out), True

    async def _bulk_with_failures(self, request: web.BaseRequest, body: bytes, blocked: bool) -> web.Response:
        is_gzip = request.headers.get("Content-Encoding", "").lower() == "gzip"
        try:
            raw = gzip.decompress(body) if is_gzip else body
            entries = _split_bulk(raw)
        except (OSError, ValueError, EOFError):
            status, resp, reached = await self._forward(request, body)  # not a bulk body we understand
            self._answer(request, len(body), status, reached)
            return resp
        default_index = _path_index(request.path)
        failures: dict[int, tuple[int, str, str]] = {}
        stored: set[int] = set()
        with self._lock:
            base = self._items_seen
            self._items_seen += len(entries)
            for i, (op, meta, _line, source) in enumerate(entries):
                item = BulkItem(base + i, op, meta.get("_index", default_index), meta.get("_id"), source)
                verdict = self._block_verdict(item) if blocked else (self._item_fn(item) if self._item_fn else None)
                if verdict == FAILURE_STORE:
                    stored.add(i)
                elif verdict is not None:
                    failures[i] = _expand_verdict(verdict)
            self._items_failed += len(failures)
        if not failures and not stored:
            status, resp, reached = await self._forward(request, body)
            self._answer(request, len(body), status, reached)
            return resp
        for i in stored:
            op, meta, _line, src = entries[i]
            meta = {**meta, "_index": ".fs-" + str(meta.get("_index", default_index))}
            entries[i] = (op, meta, json.dumps({op: meta}).encode(), src)

        kept = [e for i, e in enumerate(entries) if i not in failures]
        upstream_items: list[Any] = []
        took = 0
        forwarded = False
        if kept:
            new_raw = b"".join(line + b"\n" + (src + b"\n" if src is not None else b"") for _op, _m, line, src in kept)
            new_body = gzip.compress(new_raw) if is_gzip else new_raw
            query = [(k, v) for k, v in request.query.items() if k != "filter_path"]
            path_qs = urllib.parse.quote(request.path, safe="/,*") + ("?" + urllib.parse.urlencode(query) if query else "")
            headers, skip = self._upstream_headers(request, drop=("accept-encoding",))
            status, up_headers, data = await self._send(request.method, path_qs, headers, skip, new_body)
            forwarded = up_headers is not None
            answer = _json_or_none(data)
            items = answer.get("items") if isinstance(answer, dict) else None
            if status != 200 or not isinstance(items, list) or len(items) != len(kept):
                # A whole-request failure upstream: pass it on as it is.
                self._answer(request, len(body), status, forwarded)
                return web.Response(status=status, body=data, headers={"Content-Type": "application/json; charset=UTF-8"})
            upstream_items = items
            took = int(answer.get("took", 0))
        it = iter(upstream_items)
        merged: list[Any] = []
        for i, (op, meta, _line, _src) in enumerate(entries):
            if i in failures:
                st, etype, reason = failures[i]
                merged.append({op: {
                    "_index": meta.get("_index", default_index), "_id": meta.get("_id"), "status": st,
                    "error": {"type": etype, "reason": reason},
                }})
            else:
                upstream_item = next(it)
                if i in stored:
                    next(iter(upstream_item.values()))["failure_store"] = "used"
                merged.append(upstream_item)
        result: Any = {"took": took, "errors": bool(failures) or any(
            next(iter(m.values())).get("status", 0) >= 300 for m in merged), "items": merged}
        if "filter_path" in request.query:
            result = apply_filter_path(result, request.query["filter_path"])
        self._answer(request, len(body), 200, forwarded)
        return web.Response(status=200, body=json.dumps(result, separators=(",", ":")).encode(), headers={"Content-Type": "application/json; charset=UTF-8"})

    @staticmethod
    def _block_verdict(item: BulkItem) -> ItemVerdict:
        return (403, "cluster_block_exception", f"index [{item.index}] blocked by: [FORBIDDEN/8/index write (api)];")


def _expand_verdict(verdict: ItemVerdict) -> tuple[int, str, str]:
    if isinstance(verdict, tuple):
        return verdict
    assert isinstance(verdict, int), verdict
    etype, reason = _ERROR_TYPES.get(verdict, ("exception", f"HTTP {verdict}"))
    return verdict, etype, reason


def _json_or_none(data: bytes) -> Any:
    try:
        return json.loads(data)
    except ValueError:
        return None


def _path_index(path: str) -> str | None:
    parts = [p for p in path.split("/") if p]
    return urllib.parse.unquote(parts[0]) if len(parts) == 2 and parts[1] == "_bulk" else None


def _split_bulk(raw: bytes) -> list[tuple[str, dict[str, Any], bytes, bytes | None]]:
    """NDJSON bulk body -> (op, meta, action line, source line or None for delete)."""
    lines = [ln for ln in raw.split(b"\n") if ln.strip()]
    out: list[tuple[str, dict[str, Any], bytes, bytes | None]] = []
    i = 0
    while i < len(lines):
        action = json.loads(lines[i])
        if not isinstance(action, dict) or len(action) != 1:
            raise ValueError("bad bulk action line")
        op, meta = next(iter(action.items()))
        if op == "delete":
            out.append((op, meta, lines[i], None))
            i += 1
        else:
            if i + 1 >= len(lines):
                raise ValueError("bulk action without source")
            out.append((op, meta, lines[i], lines[i + 1]))
            i += 2
    return out


class RecordingProxy(FaultProxy):
    """A FaultProxy without faults that notes, for every bulk item Elasticsearch created, when its
    request came in and when the answer came back: the arrival the oracle measures. Answers are passed on as they
    came (shipper's own `filter_path` included), so items are matched to the request's by position."""

    def __init__(self, upstream_url: str, timeline: Timeline) -> None:
        super().__init__(upstream_url, reports_outages=False)
        self.timeline = timeline

    async def _forward(self, request: web.BaseRequest, body: bytes) -> tuple[int, web.Response, bool]:
        # shielded: a client that hangs up (a daemon killed mid-request) cancels the handler, but
        # the documents the upstream creates all the same must still be noted
        return await asyncio.shield(asyncio.ensure_future(self._forward_noted(request, body)))

    async def _forward_noted(self, request: web.BaseRequest, body: bytes) -> tuple[int, web.Response, bool]:
        bulk = request.method in ("POST", "PUT") and request.path.rstrip("/").endswith("/_bulk")
        if not bulk:
            return await super()._forward(request, body)
        tl = self.timeline
        sent = tl.bulk_sent()
        ids: list[Hashable] = []
        try:
            status, resp, reached = await super()._forward(request, body)
            if reached and status == 200:
                answer = resp.body if isinstance(resp.body, bytes) else b""
                ids = _created_ids(body, request.headers.get("Content-Encoding", ""), answer,
                                   resp.headers.get("Content-Encoding", ""))
        except BaseException:
            tl.acked([], sent, announced=True)
            raise
        tl.acked(ids, sent, announced=True)
        return status, resp, reached


def _created_ids(body: bytes, body_encoding: str, answer: bytes, answer_encoding: str) -> list[Hashable]:
    """The `_id` of each item the answer says was created; for an item sent without one
    (`document_id: none`) whose answer does not name it either, `("seq", N)` from its source."""
    try:
        raw = gzip.decompress(body) if body_encoding.lower() == "gzip" else body
        entries = _split_bulk(raw)
        text = gzip.decompress(answer) if answer_encoding.lower() == "gzip" else answer
        items = json.loads(text).get("items") or []
    except (OSError, ValueError, EOFError, AttributeError):
        return []
    out: list[Hashable] = []
    for (_op, meta, _line, src), item in zip(entries, items):
        result = next(iter(item.values())) if isinstance(item, dict) and item else {}
        status = result.get("status", 0) if isinstance(result, dict) else 0
        if not 200 <= status < 300:
            continue
        doc_id = meta.get("_id") or (result.get("_id") if isinstance(result, dict) else None)
        if doc_id:
            out.append(str(doc_id))
        elif src is not None:
            out.extend(("seq", n) for n in promptness.seqs_in(src)[:1])
    return out
