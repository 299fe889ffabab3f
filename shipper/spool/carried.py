"""Where each file's newest checkpoint is stored: in the row of the queued batch that carries it
(a commit's checkpoints ride in its last batch) or in a row of its own. Pure bookkeeping for
store.Spool, which does every write; nothing here touches the cache."""

from __future__ import annotations

from collections.abc import Container, Iterable
from typing import Any

from shipper.model import Checkpoint


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
