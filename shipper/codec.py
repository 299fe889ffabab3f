"""gzip for bulk bodies (compressed once before they are stored, decompressed to split or retry)
and the crc32 the spool keeps of each body: ISA-L where installed, zlib else (docs/development.md).
Imports nothing of shipper, so the spool and ship/ both use it without importing each other."""

from __future__ import annotations

from collections.abc import Sequence

try:
    from isal import igzip as _gzip
    from isal import isal_zlib as _zlib
    from isal.isal_zlib import crc32 as _crc32
except ImportError:  # pragma: no cover
    import gzip as _gzip  # type: ignore[no-redef]
    import zlib as _zlib  # type: ignore[no-redef]
    from zlib import crc32 as _crc32

LEVEL = 1   # the cheapest level: bodies are compressed once on the spool thread, at read speed
_GZIP_WBITS = 31   # a gzip header and trailer, the largest window


def gzip_compress(data: bytes | Sequence[bytes]) -> bytes:
    """One gzip member of `data`, or of its parts one after the other (a body as grouped: the parts
    are read where they are, never joined into one copy first)."""
    if isinstance(data, bytes):
        return _gzip.compress(data, LEVEL)
    c = _zlib.compressobj(LEVEL, _zlib.DEFLATED, _GZIP_WBITS)
    out = [c.compress(part) for part in data]
    out.append(c.flush())
    return b"".join(out)


def join_bodies(bodies: Sequence[bytes], gzipped: bool) -> bytes:
    """Stored bodies as one request's body, in order. Gzipped ones become ONE gzip member again:
    RFC 1952 allows a body of several members, but Elasticsearch and OpenSearch read request bodies
    through Netty's HttpContentDecompressor, whose JdkZlibDecoder stops at the end of the first
    member unless built with `decompressConcatenated` (it is not there), so the documents after it
    would silently not be indexed. Run off the loop: it decompresses and compresses every byte."""
    if not gzipped:
        return b"".join(bodies)
    return gzip_compress([gzip_decompress(b) for b in bodies])


def gzip_decompress(data: bytes) -> bytes:
    out: bytes = _gzip.decompress(data)  # type: ignore[no-untyped-call]   # isal's igzip.decompress has no annotations
    return out


def crc32(data: bytes) -> int:
    """CRC-32 as zlib computes it (ISA-L's where installed: docs/development.md)."""
    return _crc32(data)


def decode_body(stored: bytes, gzipped: bool) -> bytes:
    """A stored body as NDJSON: decompressed when it was stored gzipped."""
    return gzip_decompress(stored) if gzipped else stored
