"""TLS for the output: the client context (CA file, client certificate), the CA pinned by SHA-256
fingerprint (the only trust anchor once it matched; SPEC, Trust boundaries), and TLS failures told
in words an operator can act on. Decisions are pure; `fetch_chain` is the only I/O."""

from __future__ import annotations

import _ssl
import asyncio
import hashlib
import logging
import ssl
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from shipper.config import TLSConfig

if TYPE_CHECKING:
    from shipper.ship.proxy import Proxy

log = logging.getLogger("shipper.output")

_BASIC_CONSTRAINTS_OID = b"\x06\x03\x55\x1d\x13"     # 2.5.29.19


def fingerprint(der: bytes) -> str:
    """SHA-256 of a DER certificate as 64 lower-case hex digits (the form `tls.ca_fingerprint` is stored in)."""
    return hashlib.sha256(der).hexdigest()


def colon_hex(hexed: str) -> str:
    """`3af1..` -> `3A:F1:..`, as `openssl x509 -fingerprint -sha256` prints it."""
    return ":".join(hexed[i:i + 2] for i in range(0, len(hexed), 2)).upper()


def _der_length(data: bytes, pos: int) -> tuple[int, int]:
    """(length, position of the contents) of the DER element whose length octets start at `pos`."""
    first = data[pos]
    if first < 0x80:
        return first, pos + 1
    n = first & 0x7F
    if n == 0 or n > 4 or pos + 1 + n > len(data):
        raise ValueError("unsupported DER length")
    return int.from_bytes(data[pos + 1:pos + 1 + n], "big"), pos + 1 + n


def is_ca(der: bytes) -> bool:
    """Whether a DER certificate's basicConstraints extension says cA TRUE (false when absent or unreadable).

    The extension is `SEQUENCE { OID 2.5.29.19, [BOOLEAN critical], OCTET STRING { SEQUENCE { [BOOLEAN cA] ... } } }`;
    the stdlib parses no certificate extensions, and this one is easy to find.
    """
    at = der.find(_BASIC_CONSTRAINTS_OID)
    try:
        while at >= 0:
            pos = at + len(_BASIC_CONSTRAINTS_OID)
            if der[pos] == 0x01:                     # critical flag
                length, start = _der_length(der, pos + 1)
                pos = start + length
            if der[pos] == 0x04:                     # the extension's value
                _olen, ostart = _der_length(der, pos + 1)
                if der[ostart] == 0x30:
                    slen, sstart = _der_length(der, ostart + 1)
                    return slen >= 3 and der[sstart] == 0x01 and der[sstart + 2] != 0x00
            at = der.find(_BASIC_CONSTRAINTS_OID, at + 1)
    except (IndexError, ValueError):
        return False
    return False


@dataclass(frozen=True, slots=True)
class PinVerdict:
    """What the server's chain says about `tls.ca_fingerprint`: the CA to trust, or why none."""

    ca_der: bytes | None
    error: str | None


def pick_pinned_ca(chain: list[bytes], wanted: str) -> PinVerdict:
    """The certificate of `chain` (DER, leaf first) whose SHA-256 is `wanted`, if it is a CA."""
    seen = []
    for der in chain:
        fp = fingerprint(der)
        if fp == wanted:
            if not is_ca(der):
                return PinVerdict(None, "the certificate matching tls.ca_fingerprint is not a CA certificate "
                                        "(pin the CA that signed the server's certificate)")
            return PinVerdict(der, None)
        seen.append(colon_hex(fp))
    return PinVerdict(None, "no certificate the server sent matches tls.ca_fingerprint "
                            f"({len(chain)} sent, SHA-256 {', '.join(seen) or 'none'})")


def client_context(tls: TLSConfig) -> ssl.SSLContext | bool:
    """The context for every connection: system CAs or `ca_file`, the client certificate; False
    when verification is off. With `ca_fingerprint` it trusts nothing until `trust` gives it the
    pinned CA, and then that CA alone."""
    if tls.ca_fingerprint:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)       # verifies, checks host names, no CA loaded
        # the pinned CA may be an intermediate: it is then the trust anchor, like Beats' pool entry
        ctx.verify_flags |= ssl.VERIFY_X509_PARTIAL_CHAIN
        if tls.cert_file:
            ctx.load_cert_chain(tls.cert_file, tls.key_file)
        return ctx
    if not tls.verify:
        if not tls.cert_file:
            return False
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    elif tls.ca_file:
        ctx = ssl.create_default_context(cafile=tls.ca_file)
    elif tls.cert_file:
        ctx = ssl.create_default_context()
    else:
        return True
    if tls.cert_file:
        ctx.load_cert_chain(tls.cert_file, tls.key_file)
    return ctx


def trust(ctx: ssl.SSLContext, ca_der: bytes) -> None:
    """The pinned CA into the (otherwise empty) store of `client_context`'s pinned context:
    connections made from now on verify against it alone. The same CA again changes nothing."""
    ctx.load_verify_locations(cadata=ca_der)


def chain_context(tls: TLSConfig) -> ssl.SSLContext:
    """For reading the server's chain once: no verification, the client certificate still offered
    (a server that requires one would otherwise end the handshake before showing its chain)."""
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    if tls.cert_file:
        ctx.load_cert_chain(tls.cert_file, tls.key_file)
    return ctx


def peer_chain(ssl_object: Any) -> list[bytes]:
    """The certificates the server sent (DER, leaf first). Python 3.13 has the public
    `get_unverified_chain`; 3.10-3.12 have it on the private `_sslobj`; older: the leaf only."""
    for obj in (ssl_object, getattr(ssl_object, "_sslobj", None)):
        get = getattr(obj, "get_unverified_chain", None)
        if get is None:
            continue
        chain = get() or []
        return [c if isinstance(c, bytes) else c.public_bytes(_ssl.ENCODING_DER) for c in chain]
    leaf = ssl_object.getpeercert(binary_form=True)
    return [leaf] if leaf else []


async def _open_tls(host: str, port: int, ctx: ssl.SSLContext | bool,
                    proxy: Proxy | None) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A TLS stream to host:port, through the proxy's tunnel when there is one (TLS end to end)."""
    if proxy is None:
        return await asyncio.open_connection(host, port, ssl=ctx, server_hostname=host)
    sock = await proxy.open(host, port)
    try:
        return await asyncio.open_connection(sock=sock, ssl=ctx, server_hostname=host)
    except BaseException:
        sock.close()
        raise


async def fetch_chain(host: str, port: int, ctx: ssl.SSLContext, timeout_s: float,
                      proxy: Proxy | None = None) -> list[bytes]:
    """Connect, complete the TLS handshake, read the chain and close: nothing is sent.

    Pinning: the server's chain is read once without verification, and the CA certificate in it
    whose SHA-256 matches becomes the ONLY trust anchor of the output's context (no system CAs,
    no `ca_file`): every new connection is verified (chain and host name) against that CA alone,
    so a server that moved to a chain of any other CA is refused at its next handshake. No
    request is sent over the unverified connection.
    """
    reader_writer = await asyncio.wait_for(_open_tls(host, port, ctx, proxy), timeout_s)
    _reader, writer = reader_writer
    try:
        return peer_chain(writer.get_extra_info("ssl_object"))
    finally:
        writer.close()
        try:
            await asyncio.wait_for(writer.wait_closed(), 1.0)
        except (TimeoutError, OSError, ssl.SSLError):
            pass


async def diagnose(host: str, port: int, ctx: ssl.SSLContext | bool, timeout_s: float,
                   proxy: Proxy | None = None) -> BaseException | None:
    """After a connection reset on an https host: what a fresh connection's TLS says. With TLS 1.3
    the server judges the client certificate after the handshake, so its alert (unknown CA, bad
    certificate) arrives as the first record, which the failed request never read; a short read
    gets it. None when the connection looks healthy (the server waits for a request)."""
    try:
        reader, writer = await asyncio.wait_for(_open_tls(host, port, ctx, proxy), timeout_s)
    except (TimeoutError, OSError, ssl.SSLError) as e:
        return e
    try:
        data = await asyncio.wait_for(reader.read(1), min(2.0, timeout_s))
        if not data:
            return ConnectionResetError(_CLOSED_AFTER_HANDSHAKE)
        return None
    except TimeoutError:
        return None
    except (OSError, ssl.SSLError) as e:
        return e
    finally:
        writer.close()
        try:
            await asyncio.wait_for(writer.wait_closed(), 1.0)
        except (TimeoutError, OSError, ssl.SSLError):
            pass


_CLOSED_AFTER_HANDSHAKE = "the server closed the connection right after the TLS handshake"

# OpenSSL reasons that mean the server did not accept our client certificate (or wanted one)
_CLIENT_CERT_REASONS = ("CERTIFICATE_REQUIRED", "BAD_CERTIFICATE", "UNKNOWN_CA", "CERTIFICATE_UNKNOWN",
                        "HANDSHAKE_FAILURE", "ACCESS_DENIED", "DECRYPT_ERROR", "UNSUPPORTED_CERTIFICATE")


def describe_tls_error(exc: BaseException, tls: TLSConfig) -> str | None:
    """A TLS failure in words that name the setting to fix; None when `exc` is not about TLS."""
    text = str(exc)
    inner = exc
    while inner is not None and not isinstance(inner, ssl.SSLError):
        inner = inner.__cause__ or inner.__context__ or getattr(inner, "os_error", None)   # type: ignore[assignment]
    reason = getattr(inner, "reason", None) or ""
    if isinstance(inner, ssl.SSLCertVerificationError) or "CERTIFICATE_VERIFY_FAILED" in text:
        detail = getattr(inner, "verify_message", None) or "certificate verify failed"
        where = ("tls.ca_fingerprint" if tls.ca_fingerprint else "tls.ca_file" if tls.ca_file
                 else "the system's CAs (set tls.ca_file or tls.ca_fingerprint)")
        return f"TLS: the server's certificate is not trusted ({detail}); checked against {where}"
    upper = (reason or text).upper()
    if any(r in upper for r in _CLIENT_CERT_REASONS) and ("ALERT" in upper or inner is not None):
        if tls.cert_file:
            return (f"TLS: the server refused the client certificate tls.cert_file ({reason or text}); "
                    "check that the server trusts its CA and that it is not expired")
        return f"TLS: the server requires a client certificate ({reason or text}); set tls.cert_file and tls.key_file"
    if inner is not None:
        return f"TLS: {reason or text}"
    if _CLOSED_AFTER_HANDSHAKE in text:
        if tls.cert_file:
            return (f"TLS: {_CLOSED_AFTER_HANDSHAKE}: it probably refused the client certificate tls.cert_file "
                    "(does the server trust its CA? is it expired?)")
        return (f"TLS: {_CLOSED_AFTER_HANDSHAKE}: it probably requires a client certificate "
                "(set tls.cert_file and tls.key_file)")
    return None
