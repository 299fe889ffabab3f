"""The pure account of what a damaged spool lost: which lines of which file the unreadable batch
records held, bounded by their neighbours when their own headers are gone. No I/O; salvage.py
hands it what it read, and `shipper state check|repair` prints what it says."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from shipper.model import BatchMeta
from shipper.spool import rows


@dataclass(frozen=True, slots=True)
class LostRange:
    """Lines of one file that an unreadable record held. `start`/`end` are byte offsets (None:
    not known). `reread`: the surviving checkpoint is at or before `start`, so the next start
    reads these lines again from the file, if it still holds them (same _ids: no duplicates)."""

    path: str | None
    incarnation: str
    start: int | None
    end: int | None
    seqs: tuple[int, ...]
    events: int | None
    reread: bool
    exact: bool                 # from the record's own header, not from its neighbours


def newest_checkpoints(checkpoint_rows: Iterable[dict[str, Any]], batch_rows: Iterable[rows.BatchRow]
                       ) -> dict[str, dict[str, Any]]:
    """Per incarnation the checkpoint the spool would load: the highest version wherever stored."""
    out: dict[str, dict[str, Any]] = {}
    for d in [*checkpoint_rows, *(d for r in batch_rows for d in r.checkpoints.values())]:
        inc = d.get("incarnation")
        if isinstance(inc, str) and (inc not in out or int(d.get("v", 0)) > int(out[inc].get("v", 0))):
            out[inc] = d
    return out


def lost_ranges(good: Mapping[int, BatchMeta], lost: Mapping[int, BatchMeta | None],
                checkpoints: Mapping[str, Mapping[str, Any]], paths: Mapping[str, str] | None = None,
                closing: Iterable[int] = ()) -> list[LostRange]:
    """The file ranges of lost batches. A lost batch whose header still decodes names its own
    ranges; else the kept batches beside it bound it, generously: every batch of a commit carries
    the commit's covers and only its last one (`closing`: the kept seqs that carry checkpoints)
    the checkpoints, so a lost batch after a kept one that does not close its commit may hold lines
    of that commit, and the kept one after it may be the end of a commit that began with lost
    batches. Such a range names lines to look at; some of them may have been kept."""
    names = dict(paths or {})
    for inc, d in checkpoints.items():
        names.setdefault(inc, str(d.get("path")))
    good_seqs = sorted(good)
    closes = set(closing)
    out: list[LostRange] = []
    pending: dict[tuple[str, int | None, int | None, bool], tuple[list[int], int | None]] = {}
    for seq in sorted(lost):
        meta = lost[seq]
        ranges: dict[str, tuple[int | None, int | None]]
        exact = meta is not None
        if meta is not None:
            ranges = {inc: (a, b) for inc, (a, b) in meta.covers.items()}
        else:
            prev = next((good[s] for s in reversed(good_seqs) if s < seq), None)
            nxt = next((good[s] for s in good_seqs if s > seq), None)
            if prev is not None and nxt is not None and prev.covers == nxt.covers:
                ranges = {inc: (a, b) for inc, (a, b) in prev.covers.items()}
            else:
                incs = set(prev.covers if prev else {}) | set(nxt.covers if nxt else {})
                ranges = {}
                for inc in incs:
                    a = None
                    if prev is not None and inc in prev.covers:
                        a = prev.covers[inc][1] if prev.seq in closes else prev.covers[inc][0]
                    if nxt is not None and inc in nxt.covers:
                        b: int | None = nxt.covers[inc][1]
                    else:
                        cp = checkpoints.get(inc)
                        # the newest checkpoint went with it: the lines from `a` on are read again
                        b = int(cp["offset"]) if cp is not None and (a is None or int(cp["offset"]) > a) else None
                    if a is None or b is None or b > a:
                        ranges[inc] = (a, b)
        for inc, (a, b) in sorted(ranges.items()):
            key = (inc, a, b, exact)
            seqs, ev = pending.get(key, ([], 0))
            seqs.append(seq)
            ev = None if ev is None or meta is None else ev + meta.events
            pending[key] = (seqs, ev)
    for (inc, a, b, exact), (seqs, ev) in pending.items():
        cp = checkpoints.get(inc)
        reread = cp is not None and a is not None and int(cp["offset"]) <= a
        out.append(LostRange(names.get(inc), inc, a, b, tuple(seqs), ev, reread, exact))
    out.sort(key=lambda r: (str(r.path), r.start if r.start is not None else -1))
    return out


