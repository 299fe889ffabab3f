"""The aiohttp side of the output: hosts and their health, auth, TLS, timeouts, one POST per bulk.

Decisions live in ship/bulk.py and ship/backoff.py; this module performs the I/O and reports
what came back. It never touches files or spool internals. Secrets never reach an error text.
"""

from __future__ import annotations

import asyncio
import base64
import random
import ssl
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import aiohttp
import orjson

from shipper.clock import Clock, SystemClock
from shipper.config import ElasticsearchConfig
from shipper.errors import TransportError
from shipper.logs import register_secret
from shipper.ship.backoff import Backoff
from shipper.ship.bulk import FILTER_PATH, parse_retry_after


_ALL_DELIVERED = b'{"errors":false'   # filter_path puts `errors` first


def redact_url(url: str) -> str:
    """A URL with any user:password@ removed, for logs."""
    parts = urlsplit(url)
    if parts.username or parts.password:
        host = parts.hostname or ""
        if parts.port:
            host += f":{parts.port}"
        return urlunsplit((parts.scheme, host, parts.path, parts.query, parts.fragment))
    return url


@dataclass(slots=True)
class Host:
    url: str                 # without credentials
    label: str               # for logs and metrics
    auth: str | None         # Authorization header from URL credentials
    failures: int = 0
    down_until: float = 0.0  # monotonic

    def is_up(self, now: float) -> bool:
        return now >= self.down_until


@dataclass(slots=True)
class Reply:
    status: int
    answer: dict[str, Any] | None
    retry_after_s: float | None
    host: str
    seconds: float
    host_recovered: bool = False   # the host had failed before this answer


class BulkClient:
    """Posts bulk bodies to the healthiest host; a failing host is set aside with backoff."""

    def __init__(self, cfg: ElasticsearchConfig, backoff: Backoff, rng: random.Random | None = None,
                 clock: Clock | None = None) -> None:
        self.cfg = cfg
        self._backoff = backoff
        self._rng = rng or random.Random()
        self._clock = clock or SystemClock()
        self.hosts: list[Host] = []
        for h in cfg.hosts:
            parts = urlsplit(h)
            auth = None
            if parts.username:
                from urllib.parse import unquote
                cred = f"{unquote(parts.username)}:{unquote(parts.password or '')}"
                auth = "Basic " + base64.b64encode(cred.encode()).decode()
                register_secret(unquote(parts.password or ""))
                register_secret(auth.split(" ", 1)[1])
            clean = redact_url(h).rstrip("/")
            self.hosts.append(Host(clean, clean, auth))
        self._next = 0
        self._session: aiohttp.ClientSession | None = None
        headers = {"Content-Type": "application/x-ndjson", "Accept": "application/json",
                   "User-Agent": "shipper/0.1"}
        if cfg.api_key:
            headers["Authorization"] = "ApiKey " + cfg.api_key
            register_secret(cfg.api_key)
        elif cfg.username is not None:
            cred = f"{cfg.username}:{cfg.password or ''}"
            headers["Authorization"] = "Basic " + base64.b64encode(cred.encode()).decode()
            register_secret(cfg.password)
        if "Authorization" in headers:
            # the header value is as secret as the password it encodes
            register_secret(headers["Authorization"].split(" ", 1)[1])
        self._headers = headers
        q = f"filter_path={FILTER_PATH}"
        if cfg.pipeline:
            q += f"&pipeline={cfg.pipeline}"
        self._query = q

    def _ssl(self) -> ssl.SSLContext | bool:
        if not self.cfg.tls.verify:
            return False
        if self.cfg.tls.ca_file:
            return ssl.create_default_context(cafile=self.cfg.tls.ca_file)
        return True

    async def session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(limit=max(4, self.cfg.max_in_flight * 2), ssl=self._ssl(),
                                             keepalive_timeout=30)
            timeout = aiohttp.ClientTimeout(total=self.cfg.timeout_s, connect=min(10.0, self.cfg.timeout_s))
            self._session = aiohttp.ClientSession(connector=connector, timeout=timeout,
                                                  auto_decompress=True, skip_auto_headers=("Accept-Encoding",))
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def pick(self, now: float) -> Host:
        """Round robin over hosts that are up; when all are down, the one back soonest."""
        n = len(self.hosts)
        for i in range(n):
            h = self.hosts[(self._next + i) % n]
            if h.is_up(now):
                self._next = (self._next + i + 1) % n
                return h
        return min(self.hosts, key=lambda h: h.down_until)

    def next_host_ready_in(self, now: float) -> float:
        """Seconds until some host may be tried again (0 when one is up)."""
        return max(0.0, min(h.down_until for h in self.hosts) - now)

    def any_up(self, now: float) -> bool:
        return any(h.is_up(now) for h in self.hosts)

    def mark(self, host: Host, ok: bool, now: float) -> bool:
        """Record a request's result on its host. With several hosts a failing one is set aside for
        a backoff delay (growing with its consecutive failures), so the others carry the load and
        it is tried again later. Returns True when the host just came back after failures."""
        if ok:
            came_back = host.failures > 0
            host.failures = 0
            host.down_until = 0.0
            return came_back
        host.failures += 1
        if len(self.hosts) > 1:
            host.down_until = now + self._backoff.delay(host.failures, self._rng)
        return False

    async def post_bulk(self, body: bytes, gzipped: bool) -> Reply:
        """One bulk POST. Raises TransportError (retryable) when no HTTP answer came."""
        host = self.pick(self._clock.monotonic())
        headers = dict(self._headers)
        if host.auth and "Authorization" not in headers:
            headers["Authorization"] = host.auth
        if gzipped:
            headers["Content-Encoding"] = "gzip"
        url = f"{host.url}/_bulk?{self._query}"
        session = await self.session()
        t0 = time.monotonic()
        try:
            async with session.post(url, data=body, headers=headers) as resp:
                raw = await resp.read()
                status = resp.status
                retry_after = parse_retry_after(resp.headers.get("Retry-After"))
        except asyncio.TimeoutError:
            self.mark(host, False, self._clock.monotonic())
            raise TransportError(f"timeout after {self.cfg.timeout_s:g}s", host=host.label) from None
        except (aiohttp.ClientError, OSError) as e:
            self.mark(host, False, self._clock.monotonic())
            raise TransportError(f"{type(e).__name__}: {_safe(str(e))}", host=host.label) from None
        seconds = time.monotonic() - t0
        answer: dict[str, Any] | None = None
        if 200 <= status < 300 and raw.startswith(_ALL_DELIVERED):
            # `errors: false` means every item succeeded: skip parsing one status per document
            answer = {"errors": False}
        elif raw:
            try:
                v = orjson.loads(raw)
                answer = v if isinstance(v, dict) else None
            except orjson.JSONDecodeError:
                answer = None
        came_back = self.mark(host, status < 500 and status != 429, self._clock.monotonic())
        return Reply(status, answer, retry_after, host.label, seconds, came_back)

    async def probe(self) -> list[tuple[str, bool, str]]:
        """GET / on each host: (host, ok, detail) — for `shipper check`."""
        out = []
        session = await self.session()
        for h in self.hosts:
            headers = {k: v for k, v in self._headers.items() if k == "Authorization"}
            if h.auth and "Authorization" not in headers:
                headers["Authorization"] = h.auth
            try:
                async with session.get(h.url + "/", headers=headers) as resp:
                    raw = await resp.read()
                    if resp.status == 200:
                        try:
                            info = orjson.loads(raw)
                            ver = info.get("version", {}).get("number", "?")
                            dist = info.get("version", {}).get("distribution", "elasticsearch")
                            out.append((h.label, True, f"{dist} {ver}"))
                        except (orjson.JSONDecodeError, AttributeError):
                            out.append((h.label, True, "HTTP 200"))
                    else:
                        out.append((h.label, False, f"HTTP {resp.status}"))
            except (aiohttp.ClientError, asyncio.TimeoutError) as e:
                out.append((h.label, False, f"{type(e).__name__}: {_safe(str(e))}"))
        return out


def _safe(text: str) -> str:
    """Strip anything that looks like credentials in a URL from an error text."""
    import re
    return re.sub(r"(https?://)[^/@\s]+@", r"\1", text)
