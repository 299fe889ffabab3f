"""The spool's rows read (at open: the queue, each incarnation's newest checkpoint and where it is
stored, the counts; the dead letters and quarantine listed), and what an older version left
rewritten once in this layout. diskcache's public API only; store.Spool does every other write."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import diskcache

from shipper.errors import SpoolCorruptError, SpoolFullError
from shipper.model import BatchMeta, Checkpoint
from shipper.spool import rows

log = logging.getLogger("shipper.spool")
T = TypeVar("T")


@dataclass
class Loaded:
    """What the rows hold. `carries`: seq -> the checkpoints its row holds; `carrier`: incarnation
    -> the seq whose row holds its newest checkpoint; `version`: the newest checkpoint version."""

    pending: dict[int, BatchMeta] = field(default_factory=dict)
    checkpoints: dict[str, Checkpoint] = field(default_factory=dict)
    carries: dict[int, dict[str, dict[str, Any]]] = field(default_factory=dict)
    carrier: dict[str, int] = field(default_factory=dict)
    version: int = 0
    next_seq: int = 1
    dead_letters: int = 0
    quarantined: int = 0
    two_row: set[int] = field(default_factory=set)     # batches in 073664d's two-row layout (rows.py)
    orphans: list[int] = field(default_factory=list)   # two-row bodies without their metadata row
    whole: bool = True        # False: a row listed was gone when read (a writer beside us acked it)


def load(cache: diskcache.Cache, db_path: str) -> Loaded:
    """Every row, sorted into a `Loaded`. A row that does not decode raises SpoolCorruptError
    naming the file (a batch row's body is checked against its crc32 here, not mid-run)."""
    got = Loaded()
    keys = list(cache.iterkeys())
    two_row: dict[int, BatchMeta] = {}
    newest: dict[str, tuple[int, dict[str, Any], int | None]] = {}    # inc -> (version, dict, carrier)

    def offer(d: dict[str, Any], carrier: int | None) -> None:
        v = int(d.get("v", 0))
        got.version = max(got.version, v)
        cur = newest.get(d["incarnation"])
        if cur is None or v > cur[0]:
            newest[d["incarnation"]] = (v, d, carrier)

    for key in keys:
        if not isinstance(key, str):
            continue
        if key.startswith(rows.LEGACY_META):
            m = cache.get(key)
            if m is not None:
                seq = int(key[len(rows.LEGACY_META):])
                two_row[seq] = rows.legacy_meta(seq, m)
            else:
                got.whole = False
        elif key.startswith(rows.CHECKPOINT):
            v = cache.get(key)
            if v is not None:
                try:
                    offer(rows.unpack_checkpoint(v), None)
                except rows.BadRow as e:
                    raise SpoolCorruptError(db_path, None, f"record {key}: {e}") from e
            else:
                got.whole = False
        elif key.startswith(rows.DEAD_LETTER):
            got.dead_letters += 1
        elif key.startswith(rows.QUARANTINE):
            got.quarantined += 1
    for seq in sorted(two_row):
        got.pending[seq] = two_row[seq]
        got.two_row.add(seq)
        got.next_seq = max(got.next_seq, seq + 1)
    for key in keys:
        if not isinstance(key, int) or key in two_row:
            continue
        got.next_seq = max(got.next_seq, key + 1)
        value = cache.get(key)
        if value is None:
            got.whole = False            # acked since the listing
            continue
        if not rows.is_batch_row(value):
            # a body of the old layout without its metadata row (cannot happen: they were
            # written in one transaction), as the old code treated it: harmless, removed
            got.orphans.append(key)
            continue
        assert isinstance(value, bytes)
        try:
            row = rows.unpack_batch(key, value)
            rows.batch_body(row, value)
        except rows.BadRow as e:
            raise SpoolCorruptError(db_path, key, str(e)) from e
        got.pending[key] = row.meta
        if row.checkpoints:
            got.carries[key] = row.checkpoints
            for d in row.checkpoints.values():
                offer(d, key)
    got.pending = dict(sorted(got.pending.items()))
    for inc, (_v, d, carrier) in newest.items():
        got.checkpoints[inc] = Checkpoint.from_dict(d)
        if carrier is not None:
            got.carrier[inc] = carrier
    return got


def upgrade(cache: diskcache.Cache, got: Loaded, guard: Callable[[Callable[[], None]], None], db_path: str,
            now: float) -> None:
    """What 073664d's two-row layout left, written once in this one, so that no write path meets
    it: each batch's body and metadata as one batch row (a transaction each through `guard`, so a
    full disk needs room for one row at a time), bodies without metadata deleted. Metadata without
    its body (never written so: they went in one transaction) is quarantined like a damaged row."""
    for key in got.orphans:
        cache.delete(key)
    for seq in sorted(got.two_row):
        body = cache.get(seq)
        meta = got.pending[seq]
        q = None
        if not isinstance(body, bytes):
            q = rows.quarantine_value(seq, "an older version's batch record without its body", b"", now)
            q["covers"], q["events"] = dict(meta.covers), meta.events

        def tx(seq: int = seq, body: Any = body, meta: BatchMeta = meta, q: dict[str, Any] | None = q) -> None:
            with cache.transact():
                if q is None:
                    cache.set(seq, rows.pack_batch(meta, {}, body))
                else:
                    cache.set(f"{rows.QUARANTINE}{seq:016d}", rows.pack_quarantine(q))
                cache.delete(f"{rows.LEGACY_META}{seq}")

        try:
            guard(tx)
        except SpoolFullError:
            guard(tx)            # the reserve was given back (the guard's headroom.hit_full): once more
        if q is not None:
            del got.pending[seq]
            got.quarantined += 1
            log.warning("corrupt queue record quarantined", extra={
                "file": db_path, "seq": seq, "reason": q["reason"], "events": meta.events,
                "ranges": [{"incarnation": inc, "from": r[0], "to": r[1]} for inc, r in meta.covers.items()]})
    got.two_row = set()


def listed(cache: diskcache.Cache, prefix: str, unpack: Callable[[Any], T], db_path: str) -> list[tuple[str, T]]:
    """The rows whose key starts with `prefix` (dead letters, quarantined batches), decoded by
    `unpack`, in key order. A row that does not decode raises SpoolCorruptError naming the file."""
    out = []
    for key in cache.iterkeys():
        if isinstance(key, str) and key.startswith(prefix):
            v = cache.get(key)
            if v is not None:
                try:
                    out.append((key, unpack(v)))
                except rows.BadRow as e:
                    raise SpoolCorruptError(db_path, None, f"record {key}: {e}") from e
    out.sort(key=lambda kv: kv[0])
    return out
