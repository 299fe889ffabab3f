"""A draft's bulk bodies as the spool stores them and the senders post them (grouped, compressed once),
made on the spool thread before they have a seq: sent from memory, or written to the queue by the store.
No I/O: a value and the function that makes it; the spool thread runs it (spool/aio.py).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from shipper.codec import gzip_compress

Body = bytes | list[bytes]                        # an NDJSON body, or its parts in order (batching.group_parts)
Bodies = Sequence[tuple[Body, int]]               # (body, events) per batch
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
    out: list[Made] = []
    for body, n in made:
        if not n:
            continue
        raw = len(body) if isinstance(body, bytes) else sum(map(len, body))
        if gzip:
            out.append(Made(gzip_compress(body), raw, n, True, covers))    # parts compressed where they are
        else:
            out.append(Made(body if isinstance(body, bytes) else b"".join(body), raw, n, False, covers))
    return out
