"""AWS Signature Version 4, verified the way a service does it: written from AWS's description of
the signing process with hashlib and hmac alone (no botocore, which the code under test uses), and
itself checked against AWS's published test suite (tests/fixtures/sigv4_test_suite.json).

`verify` takes a request as it arrived (method, the raw target, the headers, the body) and a
lookup of credentials by access key id, and says what is wrong with it, or None.
"""

from __future__ import annotations

import hashlib
import hmac
import posixpath
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from urllib.parse import quote, unquote

ALGORITHM = "AWS4-HMAC-SHA256"
MAX_SKEW_S = 15 * 60          # AWS refuses a request dated further than this from its clock


@dataclass(frozen=True)
class Credential:
    secret_key: str
    token: str | None = None
    expires_at: float | None = None       # time.time() after which the front refuses it


def _encode(text: str) -> str:
    return quote(text, safe="-_.~")


def canonical_uri(raw_path: str) -> str:
    """The path with dot segments and doubled slashes removed, each segment encoded (again: the raw
    path is already encoded on the wire, which is the 'encoded twice' of non-S3 services)."""
    path = raw_path or "/"
    normalized = posixpath.normpath(path) if path != "/" else "/"
    if normalized.startswith("//"):
        normalized = "/" + normalized.lstrip("/")
    if path.endswith("/") and normalized != "/":
        normalized += "/"
    return quote(normalized, safe="/~")


def canonical_query(raw_query: str) -> str:
    """Each name and value decoded, then encoded with only the unreserved characters left as they are;
    sorted by name, then value."""
    pairs = []
    for part in raw_query.split("&") if raw_query else []:
        if not part:
            continue
        name, _, value = part.partition("=")
        pairs.append((_encode(unquote(name)), _encode(unquote(value))))
    return "&".join(f"{n}={v}" for n, v in sorted(pairs))


def canonical_headers(headers: Iterable[tuple[str, str]], signed: list[str]) -> str:
    """`name:value\\n` for each signed header: names lower-cased, values trimmed with inner runs of
    spaces made one, repeated headers joined with commas in their order."""
    values: dict[str, list[str]] = {}
    for name, value in headers:
        values.setdefault(name.lower(), []).append(" ".join(value.split()))
    return "".join(f"{name}:{','.join(values.get(name, []))}\n" for name in signed)


def canonical_request(method: str, target: str, headers: Iterable[tuple[str, str]], signed: list[str],
                      payload_hash: str) -> str:
    path, _, query = target.partition("?")
    return "\n".join([method, canonical_uri(path), canonical_query(query),
                      canonical_headers(headers, signed), ";".join(signed), payload_hash])


def _hmac(key: bytes, text: str) -> bytes:
    return hmac.new(key, text.encode(), hashlib.sha256).digest()


def signature(secret_key: str, amz_date: str, region: str, service: str, creq: str) -> str:
    scope = f"{amz_date[:8]}/{region}/{service}/aws4_request"
    string_to_sign = "\n".join([ALGORITHM, amz_date, scope, hashlib.sha256(creq.encode()).hexdigest()])
    key = _hmac(("AWS4" + secret_key).encode(), amz_date[:8])
    for part in (region, service, "aws4_request"):
        key = _hmac(key, part)
    return hmac.new(key, string_to_sign.encode(), hashlib.sha256).hexdigest()


def parse_authorization(value: str) -> dict[str, str]:
    """`AWS4-HMAC-SHA256 Credential=..., SignedHeaders=..., Signature=...` -> its three fields."""
    algorithm, _, rest = value.partition(" ")
    if algorithm != ALGORITHM:
        raise ValueError(f"not {ALGORITHM}: {algorithm!r}")
    fields = {}
    for part in rest.split(","):
        name, _, v = part.strip().partition("=")
        fields[name] = v
    if set(fields) != {"Credential", "SignedHeaders", "Signature"}:
        raise ValueError(f"Authorization fields {sorted(fields)}")
    return fields


def verify(method: str, target: str, headers: list[tuple[str, str]], body: bytes,
           lookup: Callable[[str], Credential | None], region: str, service: str,
           now: float | None = None, require_content_sha256: bool = True) -> str | None:
    """What is wrong with this request's signature, or None when it is right."""
    now = time.time() if now is None else now
    by_name = {k.lower(): v for k, v in headers}
    auth = by_name.get("authorization")
    if not auth:
        return "no Authorization header"
    try:
        fields = parse_authorization(auth)
    except ValueError as e:
        return str(e)
    key_id, _, scope = fields["Credential"].partition("/")
    cred = lookup(key_id)
    if cred is None:
        return f"unknown access key {key_id}"
    amz_date = by_name.get("x-amz-date", "")
    try:
        signed_at = time.mktime(time.strptime(amz_date, "%Y%m%dT%H%M%SZ")) - time.timezone
    except ValueError:
        return f"bad X-Amz-Date {amz_date!r}"
    if abs(now - signed_at) > MAX_SKEW_S:
        return "the request is dated too far from now"
    if scope != f"{amz_date[:8]}/{region}/{service}/aws4_request":
        return f"credential scope {scope!r} is not {amz_date[:8]}/{region}/{service}/aws4_request"
    if cred.expires_at is not None and now > cred.expires_at:
        return "the security token included in the request is expired"
    signed = fields["SignedHeaders"].split(";")
    for needed in ("host", "x-amz-date"):
        if needed not in signed:
            return f"{needed} is not signed"
    if cred.token is not None:
        if by_name.get("x-amz-security-token") != cred.token:
            return "the security token does not belong to the access key"
        if "x-amz-security-token" not in signed:
            return "x-amz-security-token is not signed"
    body_hash = hashlib.sha256(body).hexdigest()
    claimed = by_name.get("x-amz-content-sha256")
    if claimed is None and require_content_sha256:
        return "no x-amz-content-sha256 header"
    if claimed is not None and claimed != body_hash:
        return "x-amz-content-sha256 is not the body's hash"
    creq = canonical_request(method, target, headers, signed, body_hash)
    expected = signature(cred.secret_key, amz_date, region, service, creq)
    if not hmac.compare_digest(expected, fields["Signature"]):
        return "the request signature we calculated does not match the signature you provided"
    return None
