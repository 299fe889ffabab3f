"""What the spool holds, as a value: a snapshot the loop side may keep, and the shipped offsets
derived from it. Pure; built by store.Spool.contents on the spool thread.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from shipper.model import BatchMeta, Checkpoint


@dataclass(frozen=True, slots=True)
class SpoolContents:
    """A snapshot of what the spool holds, taken on the spool thread: copies, safe to keep."""

    pending: tuple[BatchMeta, ...]               # queued batches, in seq order
    checkpoints: tuple[Checkpoint, ...]
    dead_letters: int

    @property
    def queued_events(self) -> int:
        return sum(m.events for m in self.pending)

    @property
    def queued_bytes(self) -> int:
        return sum(m.stored_bytes for m in self.pending)

    def shipped_offsets(self) -> dict[str, int]:
        return shipped_offsets(self.checkpoints, self.pending)


def shipped_offsets(checkpoints: Iterable[Checkpoint], pending: Iterable[BatchMeta]) -> dict[str, int]:
    """Per incarnation: the offset below which everything is acknowledged."""
    out = {cp.incarnation: cp.offset for cp in checkpoints}
    for m in pending:
        for inc, (start, _end) in m.covers.items():
            if inc in out and start < out[inc]:
                out[inc] = start
    return out
