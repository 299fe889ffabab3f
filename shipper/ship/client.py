"""The HTTP side of the output: hosts and their health, auth, TLS, timeouts, one POST per bulk, over
our own keep-alive connections (http1.py), a forward proxy where set (proxy.py), SigV4 for Amazon
(sigv4.py). Performs the I/O and reports what came back; decisions are bulk.py's and backoff.py's.
Never touches files or the spool; secrets never reach an error text."""

from __future__ import annotations

import asyncio
import base64
import logging
import random
import ssl
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import orjson

from shipper.clock import Clock, SystemClock
from shipper.config import ElasticsearchConfig
from shipper.errors import TransportError
from shipper.logs import register_secret
from shipper.ship import http1
from shipper.ship import tls as tlsmod
from shipper.ship.backoff import Backoff
from shipper.ship.bulk import FAILURE_STORE_MARK, FILTER_PATH, parse_retry_after
from shipper.ship.http_head import ProtocolError
from shipper.ship.proxy import Proxy, ProxyError, parse_proxy, secrets_of
from shipper.ship.sigv4 import CredentialsError, Signer, encode_query

log = logging.getLogger("shipper.output")

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


def api_key_header(api_key: str) -> str:
    """The Authorization header for an API key in either form Elasticsearch hands out: `id:api_key`
    (what the create-API-key answer lists as `id` and `api_key`) is base64-encoded here; the
    `encoded` form (base64 already, no `:` in it) is sent as it is. A pasted `ApiKey ` is dropped."""
    key = api_key.strip()
    if key[:7].lower() == "apikey ":
        key = key[7:].strip()
    if ":" in key:
        key = base64.b64encode(key.encode()).decode()
    return "ApiKey " + key


@dataclass(frozen=True, slots=True)
class Answer:
    """One non-bulk request's answer (GET /, the index template): status, JSON body or None, headers."""

    status: int
    body: Any
    headers: Mapping[str, str]
    host: str


Preflight = Callable[["BulkClient"], Awaitable[None]]


@dataclass(slots=True)
class Host:
    url: str                 # without credentials
    label: str               # for logs and metrics
    auth: str | None         # Authorization header from URL credentials
    failures: int = 0
    down_until: float = 0.0  # monotonic
    origin: http1.Origin | None = None
    base_path: str = ""      # a path prefix in the URL (a proxy's /es, say), without the final /
    proxy: Proxy | None = None          # the forward proxy it is reached through
    proxy_source: str | None = None     # where that came from: output.elasticsearch.proxy_url, https_proxy, ...

    @property
    def route(self) -> str:
        """How it is reached, for `shipper check` and the start-up log."""
        if self.proxy is None:
            return "directly"
        return f"through proxy {self.proxy.label} (from {self.proxy_source})"

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
        for i, h in enumerate(cfg.hosts):
            parts = urlsplit(h)
            auth = None
            if parts.username:
                from urllib.parse import unquote
                cred = f"{unquote(parts.username)}:{unquote(parts.password or '')}"
                auth = "Basic " + base64.b64encode(cred.encode()).decode()
                register_secret(unquote(parts.password or ""))
                register_secret(auth.split(" ", 1)[1])
            clean = redact_url(h).rstrip("/")
            scheme = (parts.scheme or "http").lower()
            origin = http1.Origin(scheme, parts.hostname or "localhost",
                                  parts.port or (443 if scheme == "https" else 80))
            chosen = cfg.host_proxies[i] if i < len(cfg.host_proxies) else None
            proxy = None
            if chosen is not None:
                for secret in secrets_of(chosen[1]):
                    register_secret(secret)
                proxy = parse_proxy(chosen[1], chosen[0])
            self.hosts.append(Host(clean, clean, auth, origin=origin, base_path=parts.path.rstrip("/"),
                                   proxy=proxy, proxy_source=chosen[0] if chosen else None))
        self._next = 0
        self._pool: http1.Pool | None = None
        headers = {"Content-Type": "application/x-ndjson", "Accept": "application/json",
                   "User-Agent": "shipper/0.1"}
        if cfg.api_key:
            headers["Authorization"] = api_key_header(cfg.api_key)
            register_secret(cfg.api_key)
            for part in cfg.api_key.split(":"):
                register_secret(part.strip())
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
        self._tls = tlsmod.client_context(cfg.tls)
        self._signer = Signer(cfg.aws_sigv4) if cfg.aws_sigv4 is not None else None
        self._pinned: set[str] = set()        # hosts whose chain showed the pinned CA
        self.preflight: Preflight | None = None
        self._preflight_done = False
        self._preflight_lock = asyncio.Lock()
        if not cfg.tls.verify and any(h.url.startswith("https:") for h in self.hosts):
            log.warning("TLS verification is off (tls.verify: false): anyone on the path can read and "
                        "change what is shipped; pin the CA with tls.ca_fingerprint or set tls.ca_file",
                        extra={"hosts": [h.label for h in self.hosts if h.url.startswith("https:")]})

    def _ssl(self) -> ssl.SSLContext | bool:
        return self._tls

    async def _pin(self, host: Host) -> None:
        """With tls.ca_fingerprint: before the first request to an https host, find the pinned CA in
        the chain it sends and trust it. Raises TransportError (retryable) when none matches."""
        if not self.cfg.tls.ca_fingerprint or host.label in self._pinned or not host.url.startswith("https:"):
            return
        assert isinstance(self._tls, ssl.SSLContext)
        parts = urlsplit(host.url)
        try:
            chain = await tlsmod.fetch_chain(parts.hostname or "", parts.port or 443,
                                             tlsmod.chain_context(self.cfg.tls), min(10.0, self.cfg.timeout_s),
                                             host.proxy)
        except TimeoutError:
            raise TransportError(f"timeout after {min(10.0, self.cfg.timeout_s):g}s", host=host.label) from None
        except (OSError, ssl.SSLError) as e:
            raise TransportError(self._describe(e), host=host.label) from None
        verdict = tlsmod.pick_pinned_ca(chain, self.cfg.tls.ca_fingerprint)
        if verdict.ca_der is None:
            raise TransportError(f"TLS: {verdict.error}", host=host.label)
        tlsmod.trust(self._tls, verdict.ca_der)
        self._pinned.add(host.label)

    def _describe(self, e: BaseException) -> str:
        described = tlsmod.describe_tls_error(e, self.cfg.tls)
        return _safe(described) if described else f"{type(e).__name__}: {_safe(str(e))}"

    async def _failed(self, host: Host, e: BaseException) -> TransportError:
        """A request that got no answer: the host is marked, the error says why in words."""
        self.mark(host, False, self._clock.monotonic())
        if self.cfg.tls.ca_fingerprint and isinstance(e, ssl.SSLError):
            self._pinned.discard(host.label)    # the server's chain may have changed: look again next time
        if isinstance(e, asyncio.TimeoutError):
            return TransportError(f"timeout after {self.cfg.timeout_s:g}s", host=host.label)
        if (host.url.startswith("https:") and tlsmod.describe_tls_error(e, self.cfg.tls) is None
                and isinstance(e, (ConnectionError, OSError))
                and not isinstance(e, (ProtocolError, ProxyError, CredentialsError))):
            # a reset on https: a refused client certificate looks like this under TLS 1.3
            parts = urlsplit(host.url)
            found = await tlsmod.diagnose(parts.hostname or "", parts.port or 443, self._tls,
                                          min(5.0, self.cfg.timeout_s), host.proxy)
            if found is not None and tlsmod.describe_tls_error(found, self.cfg.tls) is not None:
                e = found
        return TransportError(self._describe(e), host=host.label)

    async def _run_preflight(self) -> None:
        """The preflight once, before the first bulk request; it raises TransportError to be tried again."""
        if self.preflight is None or self._preflight_done:
            return
        async with self._preflight_lock:
            if not self._preflight_done:
                await self.preflight(self)
                self._preflight_done = True

    def _auth_headers(self, host: Host) -> dict[str, str]:
        headers = {k: v for k, v in self._headers.items() if k == "Authorization"}
        if host.auth and "Authorization" not in headers:
            headers["Authorization"] = host.auth
        return headers

    async def request(self, method: str, path: str, body: Any = None, host: Host | None = None) -> Answer:
        """One JSON request to `host` (default: the next one up). Raises TransportError when no answer came."""
        host = host or self.pick(self._clock.monotonic())
        await self._pin(host)
        headers = self._auth_headers(host)
        headers["Accept"] = "application/json"
        headers["User-Agent"] = self._headers["User-Agent"]
        data = b""
        if body is not None:
            data = orjson.dumps(body)
            headers["Content-Type"] = "application/json"
        try:
            resp = await self._send(host, method, path, headers, data)
        except (TimeoutError, OSError) as e:
            raise await self._failed(host, e) from None
        raw = resp.body
        try:
            answer: Any = orjson.loads(raw) if raw else None
        except orjson.JSONDecodeError:
            answer = raw.decode("utf-8", "replace")[:500]
        return Answer(resp.status, answer, resp.headers, host.label)

    def pool(self) -> http1.Pool:
        if self._pool is None:
            proxies = {h.origin: h.proxy for h in self.hosts if h.proxy is not None and h.origin is not None}
            self._pool = http1.Pool(self._ssl(), connect_timeout_s=min(10.0, self.cfg.timeout_s),
                                    keepalive_s=30.0, max_idle=max(4, self.cfg.max_in_flight * 2), proxies=proxies)
        return self._pool

    async def _send(self, host: Host, method: str, path: str, headers: dict[str, str], body: bytes) -> http1.Response:
        """One request to `host` within timeout_s (connecting included). Raises TimeoutError or OSError
        (ssl.SSLError, http1.ProtocolError) when no whole answer came."""
        assert host.origin is not None
        target = host.base_path + path
        async with asyncio.timeout(self.cfg.timeout_s):
            if self._signer is not None:
                # the query goes as SigV4 canonicalises it, so that what is signed is what arrives
                route, _q, query = target.partition("?")
                target = route + "?" + encode_query(query) if query else route
                headers = {**headers, **await self._signer.headers(
                    method, host.origin.host_header, target, headers, body, self._clock.time())}
            resp = await self.pool().request(host.origin, method, target, headers, body)
        if resp.status == 407 and host.proxy is not None:
            # only a proxy answers 407: the request never reached the destination
            raise ProxyError(f"the proxy {host.proxy.label} refused the request: HTTP 407 "
                             f"(proxy authentication required; check the proxy URL's user and password)")
        return resp

    async def close(self) -> None:
        if self._pool is not None:
            self._pool.close()
            self._pool = None

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
        await self._run_preflight()
        host = self.pick(self._clock.monotonic())
        await self._pin(host)
        headers = dict(self._headers)
        if host.auth and "Authorization" not in headers:
            headers["Authorization"] = host.auth
        if gzipped:
            headers["Content-Encoding"] = "gzip"
        t0 = self._clock.monotonic()
        try:
            resp = await self._send(host, "POST", f"/_bulk?{self._query}", headers, body)
        except (TimeoutError, OSError) as e:
            raise await self._failed(host, e) from None
        seconds = self._clock.monotonic() - t0
        raw, status = resp.body, resp.status
        retry_after = parse_retry_after(resp.headers.get("retry-after"), self._clock.time())
        answer: dict[str, Any] | None = None
        if 200 <= status < 300 and raw.startswith(_ALL_DELIVERED) and FAILURE_STORE_MARK not in raw:
            # `errors: false` means every item succeeded: skip parsing one status per document
            # (unless some went to the failure store: a success that is counted apart)
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
        for h in self.hosts:
            headers = self._auth_headers(h)
            try:
                await self._pin(h)
            except TransportError as e:
                out.append((h.label, False, str(e)))
                continue
            headers["Accept"] = "application/json"
            headers["User-Agent"] = self._headers["User-Agent"]
            try:
                resp = await self._send(h, "GET", "/", headers, b"")
            except (TimeoutError, OSError) as e:
                out.append((h.label, False, self._describe(e) if not isinstance(e, TimeoutError)
                            else f"timeout after {self.cfg.timeout_s:g}s"))
                continue
            if resp.status == 200:
                try:
                    info = orjson.loads(resp.body)
                    ver = info.get("version", {}).get("number", "?")
                    dist = info.get("version", {}).get("distribution", "elasticsearch")
                    out.append((h.label, True, f"{dist} {ver}"))
                except (orjson.JSONDecodeError, AttributeError):
                    out.append((h.label, True, "HTTP 200"))
            else:
                out.append((h.label, False, f"HTTP {resp.status}"))
        return out


def _safe(text: str) -> str:
    """Strip anything that looks like credentials in a URL from an error text."""
    import re
    return re.sub(r"(https?://)[^/@\s]+@", r"\1", text)
