"""A draft's bulk bodies as the spool stores them and the senders post them (grouped, compressed once),
made on the spool thread before they have a seq: sent from memory, or written to the queue by the store.
No I/O: a value and the function that makes it; the spool thread runs it (spool/aio.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from shipper.codec import gzip_compress

Bodies = list[tuple[bytes, int]]                 # (NDJSON body, events) per batch
BodiesOrMaker = Bodies | Callable[[], Bodies]     # a maker runs on the spool thread (a large join releases the GIL)


@dataclass(frozen=True, slots=True)
class Made:
    """One batch's body as stored and posted, its raw size, events, compression and the file ranges
    (incarnation -> (start, end)) its draft covers."""

    stored: bytes
    raw_bytes: int
    events: int
    gzipped: bool
    covers: dict[str, tuple[int, int]]


def make_bodies(bodies: BodiesOrMaker, covers: dict[str, tuple[int, int]], gzip: bool) -> list[Made]:
    """The bodies (a maker is run here), compressed; every batch carries the draft's covers."""
    made = bodies() if callable(bodies) else bodies
    return [Made(gzip_compress(b) if gzip else b, len(b), n, gzip, covers) for b, n in made if n]
