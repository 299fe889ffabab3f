"""Pure: which waiting records go out together as one bulk request when a slot frees, and each
document's answer mapped back to the record it came from. No I/O and no clock: delivery.py takes
the records from the outbox and acks each on its own; the bodies are joined on the spool thread."""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Iterable, Sequence
from typing import Protocol, TypeVar

T = TypeVar("T")


class Record(Protocol):
    """A queued record as the merge rule sees it (model.BatchMeta)."""

    @property
    def events(self) -> int: ...
    @property
    def raw_bytes(self) -> int: ...
    @property
    def gzipped(self) -> bool: ...


def take_count(waiting: Iterable[Record], max_events: int, max_bytes: int) -> int:
    """How many records from the head of `waiting` go in one request: the first always (a record
    is a request on its own, as the draft writer grouped it), then each next one while the
    request stays within `max_events` documents and `max_bytes` of NDJSON and is compressed the
    same way. 0 when nothing waits. Records are never reordered: a later one that would fit does
    not jump one that does not."""
    n = events = nbytes = 0
    gzipped = False
    for rec in waiting:
        if n == 0:
            gzipped = rec.gzipped
        elif (rec.gzipped != gzipped or events + rec.events > max_events
              or nbytes + rec.raw_bytes > max_bytes):
            break
        n += 1
        events += rec.events
        nbytes += rec.raw_bytes
    return n


def by_record(counts: Sequence[int], items: Iterable[tuple[int, T]]) -> list[list[T]]:
    """Items keyed by a document's position in the merged request (from 0, in the order the
    records were joined) -> one list per record, each in the order given. `counts[k]` is record
    k's documents. A position outside the request is a bug of the caller: ValueError."""
    starts = list(itertools.accumulate(counts, initial=0))
    out: list[list[T]] = [[] for _ in counts]
    for pos, item in items:
        if not 0 <= pos < starts[-1]:
            raise ValueError(f"document {pos} is not in a request of {starts[-1]}")
        out[bisect.bisect_right(starts, pos) - 1].append(item)
    return out


def split_cap(failed_raw_bytes: int, cap: int) -> int:
    """A merged request of `failed_raw_bytes` was answered 413 (too large for the destination):
    later merges stay under half of it, so a destination whose limit is below bulk_max_bytes is
    not sent an oversized merge, and split, at every slot (a round trip each on a slow one)."""
    return max(1, min(cap, failed_raw_bytes // 2))
