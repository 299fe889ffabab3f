"""AWS Signature Version 4 for Amazon OpenSearch (`es`, Serverless `aoss`): the signature, pure and our
own (`sign`, held equal to botocore's; docs/development.md says why), and the credentials it is made
with (`Signer`: botocore's chain, refreshed in a thread, never on the event loop)."""

from __future__ import annotations

import asyncio
import functools
import hashlib
import hmac
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, unquote

from shipper.config_output import AwsSigV4Config

ALGORITHM = "AWS4-HMAC-SHA256"
HASH_IN_THREAD_BYTES = 64 * 1024      # a larger body is hashed off the loop (hashlib drops the GIL)
# botocore refreshes temporary credentials 15 minutes before they expire (its advisory margin);
# within a minute more of that, credentials are fetched in a thread, so a refresh never blocks the loop
_REFRESH_MARGIN_S = 15 * 60 + 60


class CredentialsError(ConnectionError):
    """No AWS credentials could be had now (none configured, STS or the metadata endpoint failing):
    the request is not sent; retried like a connection error."""


@dataclass(frozen=True, slots=True)
class Frozen:
    access_key: str
    secret_key: str
    token: str | None


def _quote(text: str) -> str:
    return quote(text, safe="-_.~")


@functools.lru_cache(maxsize=64)
def encode_query(query: str) -> str:
    """The query as SigV4 canonicalises it (each name and value encoded with only `-_.~` and
    alphanumerics left as they are), in the order given: sent like that, what the service
    re-encodes on its side is what was signed (`filter_path=a,b*` goes as `a%2Cb%2A`)."""
    out = []
    for part in query.split("&"):
        if part:
            name, eq, value = part.partition("=")
            out.append(_quote(unquote(name)) + "=" + _quote(unquote(value)))
    return "&".join(out)


@functools.lru_cache(maxsize=64)
def _canonical_query(query: str) -> str:
    pairs = []
    for part in query.split("&"):
        if part:
            name, _eq, value = part.partition("=")
            pairs.append((_quote(unquote(name)), _quote(unquote(value))))
    return "&".join(f"{n}={v}" for n, v in sorted(pairs))


@functools.lru_cache(maxsize=64)
def _canonical_path(path: str) -> str:
    """Dot segments and empty segments removed (a trailing slash kept), each segment encoded again."""
    segments: list[str] = []
    for seg in path.split("/"):
        if seg in ("", "."):
            continue
        if seg == "..":
            if segments:
                segments.pop()
            continue
        segments.append(seg)
    out = "/" + "/".join(segments)
    if path.endswith("/") and out != "/":
        out += "/"
    return quote(out, safe="/~")


@functools.lru_cache(maxsize=8)
def _signing_key(secret_key: str, day: str, region: str, service: str) -> bytes:
    """Four HMACs, the same all day for one credential: kept (a few, for refreshed credentials)."""
    key = hmac.new(("AWS4" + secret_key).encode(), day.encode(), hashlib.sha256).digest()
    for part in (region, service, "aws4_request"):
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    return key


# headers left out of the signature, as botocore leaves them (hop-by-hop, tracing, User-Agent)
_BLOCKED = frozenset(("baggage", "connection", "expect", "keep-alive", "proxy-authenticate", "proxy-authorization",
                      "te", "traceparent", "tracestate", "trailer", "transfer-encoding", "upgrade", "user-agent",
                      "x-amzn-trace-id"))


def sign(creds: Frozen, region: str, service: str, method: str, host: str, target: str,
         headers: Mapping[str, str], payload_hash: str, now: float) -> dict[str, str]:
    """The headers that sign this request (`Authorization`, `X-Amz-Date`, `X-Amz-Content-SHA256`,
    `X-Amz-Security-Token` with temporary credentials). `host` is the Host header sent; `target`
    the path and query as sent; `headers` the others sent but Content-Length (all signed but
    hop-by-hop ones and User-Agent, as botocore does); `now` epoch seconds."""
    amz_date = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(now))
    day = amz_date[:8]
    added = {"X-Amz-Date": amz_date, "X-Amz-Content-SHA256": payload_hash}
    if creds.token:
        added["X-Amz-Security-Token"] = creds.token
    canonical: dict[str, str] = {"host": host}
    for name, value in (*headers.items(), *added.items()):
        lower = name.lower()
        if lower not in _BLOCKED:
            canonical[lower] = " ".join(value.split())
    signed = sorted(canonical)
    path, _q, query = target.partition("?")
    creq = "\n".join((method, _canonical_path(path), _canonical_query(query),
                      "".join(f"{n}:{canonical[n]}\n" for n in signed), ";".join(signed), payload_hash))
    scope = f"{day}/{region}/{service}/aws4_request"
    to_sign = f"{ALGORITHM}\n{amz_date}\n{scope}\n{hashlib.sha256(creq.encode()).hexdigest()}"
    signature = hmac.new(_signing_key(creds.secret_key, day, region, service), to_sign.encode(),
                         hashlib.sha256).hexdigest()
    added["Authorization"] = (f"{ALGORITHM} Credential={creds.access_key}/{scope}, "
                              f"SignedHeaders={';'.join(signed)}, Signature={signature}")
    return added


class Signer:
    """Signs requests with the credentials botocore's chain finds (found once, in a thread;
    refreshed by botocore, in a thread when a refresh may be due).

    Credentials come from botocore, the chain every AWS SDK shares: environment variables, the
    shared credentials and config files (AWS_PROFILE), web identity (Kubernetes service
    accounts, IRSA), the ECS container endpoint, EC2 instance metadata (IMDSv2). Temporary ones
    are refreshed by botocore before they expire; a refresh does network I/O, so it runs in a
    thread.
    """

    def __init__(self, cfg: AwsSigV4Config) -> None:
        import botocore.session  # the optional extra: settings checked it is there

        self.cfg = cfg
        self._session = botocore.session.get_session()
        self._creds: Any = None
        self._lock = asyncio.Lock()

    async def _credentials(self) -> Frozen:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            if self._creds is None:
                async with self._lock:
                    if self._creds is None:
                        self._creds = await asyncio.to_thread(self._session.get_credentials)
                if self._creds is None:
                    raise CredentialsError(
                        "AWS credentials: none found (environment, shared credentials file and AWS_PROFILE, "
                        "web identity, ECS or EC2 instance metadata)")
            creds = self._creds
            refresh_needed = getattr(creds, "refresh_needed", None)
            if refresh_needed is not None and refresh_needed(_REFRESH_MARGIN_S):
                frozen = await asyncio.to_thread(creds.get_frozen_credentials)
            else:
                frozen = creds.get_frozen_credentials()
        except (BotoCoreError, ClientError) as e:
            raise CredentialsError(f"AWS credentials: {e}") from None
        return Frozen(frozen.access_key, frozen.secret_key, frozen.token or None)

    async def headers(self, method: str, host: str, target: str, headers: Mapping[str, str],
                      body: bytes, now: float) -> dict[str, str]:
        """The signing headers for this request (see `sign`; `now`: epoch seconds). Raises CredentialsError."""
        creds = await self._credentials()
        if len(body) > HASH_IN_THREAD_BYTES:
            payload_hash = await asyncio.to_thread(_sha256, body)
        else:
            payload_hash = _sha256(body)
        return sign(creds, self.cfg.region, self.cfg.service, method, host, target, headers, payload_hash, now)


def _sha256(body: bytes) -> str:
    return hashlib.sha256(body).hexdigest()
