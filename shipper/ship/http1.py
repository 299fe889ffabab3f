"""HTTP/1.1 for the output, by hand (docs/development.md says why): keep-alive connections on
asyncio protocols, one request at a time each; Content-Length, chunked and read-to-EOF answers,
gzip/deflate inflated to 64 MiB at most, TLS, a forward proxy per origin; no redirects or cookies.
Every failure is an OSError (ProtocolError: not HTTP), TimeoutError or ssl.SSLError."""
from __future__ import annotations

import asyncio
import ssl
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from shipper.ship.http_head import ProtocolError, parse_head

if TYPE_CHECKING:
    from shipper.ship.proxy import Proxy

_MAX_HEAD = 64 * 1024          # status line + headers
_MAX_BODY = 256 * 1024 * 1024  # an answer larger than this is not an Elasticsearch answer
MAX_DECODED = 64 * 1024 * 1024  # a gzip/deflate answer inflates to this at most (SPEC, Trust boundaries)
_INFLATE_STEP = 1024 * 1024


@dataclass(slots=True)
class Response:
    status: int
    headers: dict[str, str]          # names lower-cased; a repeated header keeps the last value
    body: bytes
    keep_alive: bool = True


@dataclass(frozen=True, slots=True)
class Origin:
    scheme: str       # "http" | "https"
    host: str
    port: int

    @property
    def host_header(self) -> str:
        default = 443 if self.scheme == "https" else 80
        host = f"[{self.host}]" if ":" in self.host else self.host
        return host if self.port == default else f"{host}:{self.port}"


def inflate(body: bytes, enc: str, limit: int = MAX_DECODED) -> bytes:
    """A gzip or deflate answer's body, inflated to `limit` bytes at most, a MiB at a time: a
    larger one (a "gzip bomb": 1 MB that inflates to 1 GB) is a ProtocolError of its request,
    having cost `limit` bytes of memory at most, never a spike. Raises ProtocolError."""
    d = zlib.decompressobj(47 if enc != "deflate" else 15)      # 47: gzip or zlib header; 15: zlib
    parts: list[bytes] = []
    total = 0
    data = body
    try:
        while not d.eof:
            out = d.decompress(data, _INFLATE_STEP)
            data = d.unconsumed_tail
            if not out and not data:
                break                                  # every byte taken, the stream not ended
            total += len(out)
            if total > limit:
                raise ProtocolError(f"the answer's {enc} body inflates to over {limit:,} bytes")
            parts.append(out)
    except zlib.error as e:
        raise ProtocolError(f"the answer's {enc} body does not decompress: {e}") from None
    if not d.eof:
        raise ProtocolError(f"the answer's {enc} body does not decompress: it is cut short")
    return parts[0] if len(parts) == 1 else b"".join(parts)


class _Conn(asyncio.Protocol):
    """One connection. `begin` arms it for an answer; the answer's bytes are parsed as they come."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.idle_since = 0.0
        self.used = False               # has answered a request before (a reused connection)
        self._buf = bytearray()
        self._waiter: asyncio.Future[Response] | None = None
        self._head_only = False
        self._got_bytes = False
        # the answer being read
        self._status = 0
        self._headers: dict[str, str] | None = None
        self._keep_alive = True
        self._length: int | None = None     # Content-Length
        self._chunked = False
        self._to_eof = False
        self._chunks: list[bytes] = []
        self._pos = 0                        # chunked: where the next chunk's size line starts
        self._trailers = False

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        if self._waiter is None or self._waiter.done():
            # bytes nobody asked for: the connection is out of step, never reuse it
            self.close()
            return
        self._got_bytes = True
        self._buf += data
        try:
            self._advance(eof=False)
        except ProtocolError as e:
            self._fail(e)

    def eof_received(self) -> bool:
        self._at_eof(None)
        self.closed = True
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._at_eof(exc)

    def _at_eof(self, exc: Exception | None) -> None:
        """The server closed (or the connection broke): an answer read to EOF is whole now; any
        other answer still awaited fails, saying whether any of it had come."""
        waiter = self._waiter
        if waiter is None or waiter.done():
            return
        if exc is None:
            try:
                self._advance(eof=True)
            except ProtocolError as e:
                self._fail(e)
        if not waiter.done():
            self._fail(exc if exc is not None else ConnectionResetError(
                "the server closed the connection before it answered" if not self._got_bytes
                else "the server closed the connection in the middle of its answer"))

    # the request
    @property
    def got_bytes(self) -> bool:
        return self._got_bytes

    def begin(self, data: bytes, head_only: bool) -> asyncio.Future[Response]:
        assert self.transport is not None
        self._waiter = self._loop.create_future()
        self._head_only = head_only
        self._got_bytes = False
        self._headers = None
        self._buf.clear()
        self._chunks = []
        self._pos = 0
        self._trailers = False
        self.transport.write(data)
        return self._waiter

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.abort()

    def _fail(self, exc: BaseException) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_exception(exc)
        self.close()

    def _done(self, body: bytes) -> None:
        assert self._headers is not None and self._waiter is not None
        enc = self._headers.get("content-encoding", "").lower()
        if body and enc in ("gzip", "x-gzip", "deflate"):
            body = inflate(body, enc)
        self._waiter.set_result(Response(self._status, self._headers, body, self._keep_alive))
        self._waiter = None

    def _advance(self, eof: bool) -> None:
        buf = self._buf
        while self._headers is None:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                if len(buf) > _MAX_HEAD:
                    raise ProtocolError("the answer's head is over 64 KiB")
                if eof and buf:
                    raise ProtocolError("the server closed the connection in the middle of the answer's head")
                return
            status, v11, headers = parse_head(bytes(buf[:end]))
            del buf[:end + 4]
            if 100 <= status < 200:
                continue                         # 100 Continue and friends: the real answer follows
            self._status, self._headers = status, headers
            conn = headers.get("connection", "").lower()
            self._keep_alive = ("close" not in conn) if v11 else ("keep-alive" in conn)
            te = headers.get("transfer-encoding", "").lower()
            self._chunked = self._to_eof = False
            self._length = None
            if self._head_only or status in (204, 304):
                self._length = 0
            elif te:
                if not te.endswith("chunked"):
                    raise ProtocolError(f"unsupported Transfer-Encoding: {te}")
                self._chunked = True
            elif "content-length" in headers:
                try:
                    self._length = int(headers["content-length"])
                except ValueError:
                    raise ProtocolError(f"bad Content-Length: {headers['content-length']!r}") from None
                if not 0 <= self._length <= _MAX_BODY:
                    raise ProtocolError(f"bad Content-Length: {self._length}")
            else:
                self._to_eof = True
                self._keep_alive = False
        if self._length is not None:
            if len(buf) < self._length:
                if eof:
                    raise ProtocolError(f"the answer ended after {len(buf)} of {self._length} bytes")
                return
            if len(buf) > self._length:
                self._keep_alive = False         # bytes beyond the answer: out of step
            body = bytes(buf[:self._length])
            buf.clear()
            self._done(body)
        elif self._chunked:
            self._advance_chunked(eof)
        elif self._to_eof:
            if len(buf) > _MAX_BODY:
                raise ProtocolError("the answer is over 256 MiB")
            if eof:
                body = bytes(buf)
                buf.clear()
                self._done(body)

    def _advance_chunked(self, eof: bool) -> None:
        buf = self._buf
        while True:
            line_end = buf.find(b"\r\n", self._pos)
            if line_end < 0:
                if len(buf) - self._pos > _MAX_HEAD:
                    raise ProtocolError("a chunk size line is over 64 KiB")
                break
            line = bytes(buf[self._pos:line_end])
            if self._trailers:
                self._pos = line_end + 2
                if not line:                       # the empty line after the last chunk's trailers
                    if len(buf) > self._pos:
                        self._keep_alive = False
                    body = b"".join(self._chunks)
                    buf.clear()
                    self._pos = 0
                    self._done(body)
                    return
                continue
            size_text = line.split(b";", 1)[0].strip()
            try:
                size = int(size_text, 16)
            except ValueError:
                raise ProtocolError(f"bad chunk size: {line[:40]!r}") from None
            if size == 0:
                self._trailers = True
                self._pos = line_end + 2
                continue
            start = line_end + 2
            if len(buf) < start + size + 2:
                break
            if buf[start + size:start + size + 2] != b"\r\n":
                raise ProtocolError("a chunk does not end with CRLF")
            self._chunks.append(bytes(buf[start:start + size]))
            if sum(map(len, self._chunks)) > _MAX_BODY:
                raise ProtocolError("the answer is over 256 MiB")
            del buf[:start + size + 2]
            self._pos = 0
        if eof:
            raise ProtocolError("the server closed the connection in the middle of a chunked answer")


@dataclass
class Pool:
    """Keep-alive connections per origin. `request` sends one request and returns its answer;
    a connection that answered in full and may be kept goes back to the pool."""

    ssl_context: ssl.SSLContext | bool = True     # https: True = system CAs, False = no verification
    connect_timeout_s: float = 10.0
    keepalive_s: float = 30.0
    max_idle: int = 8
    proxies: Mapping[Origin, Proxy] = field(default_factory=dict)   # origins reached through a proxy
    _idle: dict[Origin, list[_Conn]] = field(default_factory=dict)
    _default_ctx: ssl.SSLContext | None = None
    _closed: bool = False

    def _ctx(self) -> ssl.SSLContext:
        if isinstance(self.ssl_context, ssl.SSLContext):
            return self.ssl_context
        if self._default_ctx is None:
            ctx = ssl.create_default_context()
            if self.ssl_context is False:
                ctx.check_hostname = False
                ctx.verify_mode = ssl.CERT_NONE
            self._default_ctx = ctx
        return self._default_ctx

    async def _connect(self, origin: Origin) -> _Conn:
        loop = asyncio.get_running_loop()
        ssl_arg = self._ctx() if origin.scheme == "https" else None
        proxy = self.proxies.get(origin)
        async with asyncio.timeout(self.connect_timeout_s):
            if proxy is None:
                _t, conn = await loop.create_connection(
                    lambda: _Conn(loop), origin.host, origin.port, ssl=ssl_arg,
                    server_hostname=origin.host if ssl_arg is not None else None)
            elif ssl_arg is None:
                _t, conn = await loop.create_connection(lambda: _Conn(loop), proxy.host, proxy.port)
            else:
                # TLS end to end through the tunnel: SNI and the certificate are the destination's
                sock = await proxy.open(origin.host, origin.port)
                try:
                    _t, conn = await loop.create_connection(lambda: _Conn(loop), sock=sock, ssl=ssl_arg,
                                                            server_hostname=origin.host)
                except BaseException:
                    sock.close()
                    raise
        return conn

    def _take_idle(self, origin: Origin, now: float) -> _Conn | None:
        idle = self._idle.get(origin)
        while idle:
            conn = idle.pop()
            if not conn.closed and now - conn.idle_since < self.keepalive_s:
                return conn
            conn.close()
        return None

    async def request(self, origin: Origin, method: str, target: str, headers: dict[str, str],
                      body: bytes = b"") -> Response:
        """One request; its headers get Host and Content-Length here. A reused connection that the
        server had closed meanwhile (no byte of an answer came) is replaced by a new one once."""
        if self._closed:
            raise ConnectionError("the HTTP client is closed")
        loop = asyncio.get_running_loop()
        proxy = self.proxies.get(origin) if origin.scheme == "http" else None
        if proxy is not None:
            # through a proxy, a plain-http request names the whole URL (absolute form)
            target = f"http://{origin.host_header}{target}"
            headers = {**headers, **proxy.headers()}
        head = [f"{method} {target} HTTP/1.1\r\nHost: {origin.host_header}\r\n"]
        for k, v in headers.items():
            head.append(f"{k}: {v}\r\n")
        if body or method in ("POST", "PUT"):
            head.append(f"Content-Length: {len(body)}\r\n")
        head.append("\r\n")
        data = "".join(head).encode("latin-1")
        data = data + body if body else data
        for attempt in (0, 1):
            conn = self._take_idle(origin, loop.time()) if attempt == 0 else None
            reused = conn is not None
            if conn is None:
                conn = await self._connect(origin)
            try:
                answer = await conn.begin(data, method == "HEAD")
            except (ConnectionError, OSError) as e:
                conn.close()
                if reused and not conn.got_bytes and not isinstance(e, ProtocolError):
                    continue                       # a stale keep-alive connection: once more, fresh
                raise
            except BaseException:
                conn.close()                       # timed out or cancelled mid-answer: never reuse it
                raise
            self._release(origin, conn, answer.keep_alive, loop.time())
            return answer
        raise AssertionError("unreachable")

    def _release(self, origin: Origin, conn: _Conn, keep: bool, now: float) -> None:
        if not keep or conn.closed or self._closed:
            conn.close()
            return
        conn.used = True
        conn.idle_since = now
        idle = self._idle.setdefault(origin, [])
        idle.append(conn)
        while len(idle) > self.max_idle:
            idle.pop(0).close()

    def close(self) -> None:
        self._closed = True
        for idle in self._idle.values():
            for conn in idle:
                conn.close()
        self._idle.clear()
