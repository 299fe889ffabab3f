"""gzip for batch bodies: ISA-L (about 5x zlib's speed, releases the GIL just the same), zlib as fallback.

Bottom layer: imports nothing of shipper. The spool compresses once when it stores a batch; the
sender decompresses only to re-send part of one.
"""

from __future__ import annotations

try:
    from isal import igzip as _gzip_mod

    def gzip_compress(data: bytes) -> bytes:
        return _gzip_mod.compress(data, 1)

    def gzip_decompress(data: bytes) -> bytes:
        return bytes(_gzip_mod.decompress(data))  # type: ignore[no-untyped-call]
except ImportError:  # pragma: no cover
    import gzip as _gzip_std

    def gzip_compress(data: bytes) -> bytes:
        return _gzip_std.compress(data, 1)

    def gzip_decompress(data: bytes) -> bytes:
        return _gzip_std.decompress(data)


def decode_body(stored: bytes, gzipped: bool) -> bytes:
    return gzip_decompress(stored) if gzipped else stored
