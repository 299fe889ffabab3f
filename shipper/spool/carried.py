"""Where each file's newest checkpoint is stored: in the row of the queued batch that carries it
(a commit's checkpoints ride in its last batch) or in a row of its own. Pure bookkeeping for
store.Spool, which does every write; nothing here touches the cache."""

from __future__ import annotations

from collections.abc import Container, Iterable
from typing import Any

from shipper.model import Checkpoint


def merge_cuts(held: Checkpoint | None, cp: Checkpoint) -> tuple[int, list[int]]:
    """The offset and cuts to store when `cp` is written over `held`. A copy carrying cuts may be
    the record of a cut (`Keeper.unstored`: offset 0, written before acks may move the checkpoint
    past it): it never takes the offset back, which would also re-read events whose cuts were
    pruned. Cuts are kept from both (a copy planned before a cut was made does not forget it)
    while above the offset."""
    if held is None:
        return cp.offset, [c for c in cp.cuts if c > cp.offset]
    offset = max(held.offset, cp.offset) if cp.cuts else cp.offset
    return offset, sorted({c for c in (*held.cuts, *cp.cuts) if c > offset})


class CheckpointBook:
    """The checkpoints as the spool holds them. `carries`: seq -> the checkpoints its row holds;
    `carrier`: incarnation -> the seq whose row holds its newest checkpoint (absent: its own row);
    `version`: the newest version stored (every write stamps one more)."""

    def __init__(self, checkpoints: dict[str, Checkpoint], version: int, carries: dict[int, dict[str, dict[str, Any]]],
                 carrier: dict[str, int]) -> None:
        self.checkpoints = checkpoints
        self.version = version
        self.carries = carries
        self.carrier = carrier

    def stamp(self, checkpoints: Iterable[Checkpoint]) -> dict[str, dict[str, Any]]:
        """Checkpoints as stored, with the version of this write (one more than any stored)."""
        v = self.version + 1
        out = {}
        for cp in checkpoints:
            d = dict(cp.to_dict(), v=v)
            held = self.checkpoints.get(cp.incarnation)
            if held is not None and held.fp_len > cp.fp_len:
                # an incarnation's first bytes never change: its fingerprint only grows. A copy taken
                # before it grew (a draft planned after a newer record) does not take it back
                d["fp_len"], d["fp"] = held.fp_len, held.fp
            if cp.cuts or (held is not None and held.cuts):
                d["offset"], d["cuts"] = merge_cuts(held, cp)
                if not d["cuts"]:
                    del d["cuts"]
            out[cp.incarnation] = d
        return out

    def remember(self, stamped: dict[str, dict[str, Any]], carrier: int | None) -> None:
        """After the write: `stamped` is stored, in the row of batch `carrier` or (None) in their own rows."""
        if not stamped:
            return
        self.version += 1
        if carrier is not None:
            self.carries[carrier] = stamped
        for inc, d in stamped.items():
            self.checkpoints[inc] = Checkpoint.from_dict(d)
            if carrier is None:
                self.carrier.pop(inc, None)
            else:
                self.carrier[inc] = carrier

    def settled(self, seqs: Iterable[int], newer: Container[str] = ()) -> dict[str, dict[str, Any]]:
        """The checkpoints the rows of `seqs` carry as their file's newest, except those `newer`
        (the write's own) supersedes: when these rows leave, the checkpoints move to rows of their own."""
        return {inc: d for seq in seqs for inc, d in self.carries.get(seq, {}).items()
                if self.carrier.get(inc) == seq and inc not in newer}

    def dropped(self, seqs: Iterable[int], settle: dict[str, dict[str, Any]]) -> None:
        """After the write: the rows of `seqs` are gone, what they carried of `settle` is in its own rows."""
        for seq in seqs:
            self.carries.pop(seq, None)
        for inc in settle:
            self.carrier.pop(inc, None)

    def carried(self) -> set[str]:
        """The incarnations some queued batch's row carries a checkpoint of."""
        return {inc for carried in self.carries.values() for inc in carried}
