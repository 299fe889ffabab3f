"""The durable queue and checkpoints on diskcache's public API: batches, file offsets, dead letters.

A batch is one bulk request's body (gzip-compressed once, here, off the event loop) plus the
file ranges it covers. The checkpoints read up to are written in the same transaction as the
batches, so a restart resumes exactly after what was queued; a batch leaves only when
Elasticsearch acked it. Blocking: one thread only (`AsyncSpool` runs every call on its own
worker); commands and tests use it directly while no daemon runs. Layout: `rows.py`.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import sqlite3
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

import diskcache

from shipper import statedir
from shipper.clock import Clock, SystemClock
from shipper.codec import gzip_compress
from shipper.errors import SpoolCorruptError, SpoolFullError
from shipper.model import BatchMeta, Checkpoint, DeadLetter
from shipper.spool import rows
from shipper.spool.contents import SpoolContents, shipped_offsets
from shipper.spool.disk import DataDisk
from shipper.spool.headroom import Headroom, release_reserve

log = logging.getLogger("shipper.spool")

T = TypeVar("T")
Bodies = list[tuple[bytes, int]]                 # (NDJSON body, events) per batch
BodiesOrMaker = Bodies | Callable[[], Bodies]     # a maker runs on the spool thread (a large join releases the GIL)


READ_ONLY_TRIES = 5          # a read-only view read again while rows vanish under it (see Spool.__init__)

class Spool:
    """Synchronous spool. Not thread-safe: one caller thread only.

    Where a checkpoint lives: a commit's checkpoints ride in its last batch's row (one set(), one
    transaction). They move to their own `c:` rows only when that batch is acked while it still
    carries the newest checkpoint of a file (nothing newer was committed since: the queue ran
    dry), so under load an ack is one delete. Checkpoint-only commits write `c:` rows directly.
    """

    def __init__(self, state_dir: str, *, read_only: bool = False, headroom: bool = False,
                 clock: Clock | None = None) -> None:
        self.clock = clock or SystemClock()             # wall time: when a batch was queued, a row quarantined
        path = os.path.join(state_dir, "spool")
        if read_only and not os.path.isdir(path):
            raise FileNotFoundError(path)
        if not read_only:
            statedir.make_dir(state_dir)        # 0700 and 0600 whatever the umask (SPEC, Trust boundaries)
        statedir.make_subdir(path)
        self.path = path
        self.read_only = read_only
        self.quarantined = 0                                # batch rows set aside: they did not decode
        # the daemon's spool keeps room for acks on a full disk (issue 19); tools and tests do not
        self.headroom = Headroom(state_dir, clock=self.clock) if headroom and not read_only else None
        self._wal_seen = 0     # the WAL's size at the headroom's last look (_check_room)
        try:
            self.cache = open_cache(path, self.db_path)
        except sqlite3.OperationalError:
            # opening writes diskcache's settings: on a full disk the daemon gives its reserve back
            # (spool/headroom.py) and tries once more, so it starts and can ack (issue 19)
            if not headroom or not release_reserve(state_dir):
                raise
            self.cache = open_cache(path, self.db_path)
        if not read_only:
            statedir.private_sqlite_files(path)
        self._autocheckpoint: int | None = None
        try:
            # read-only beside a running daemon: the rows are read one by one (diskcache has no
            # read snapshot), so an ack between the listing and the read of a row makes that row
            # vanish, and with it the checkpoint it carried; such a view is read again
            for _ in range(READ_ONLY_TRIES if read_only else 1):
                if self._load():
                    break
        except SpoolCorruptError:
            self.cache.close()
            raise
        except (sqlite3.DatabaseError, *DECODE_ERRORS) as e:
            self.cache.close()
            if isinstance(e, sqlite3.DatabaseError) and not is_damage(e):
                raise
            raise SpoolCorruptError(self.db_path, None, damage_text(e)) from e
        self._limit_wal()

    # ---------------------------------------------------------------- opening

    def _load(self) -> bool:
        """The queue and the checkpoints from the rows; False when a row listed was gone when
        read (a writer beside us acked it): the view may then be older than any the writer had."""
        self.pending: dict[int, BatchMeta] = {}
        self.checkpoints: dict[str, Checkpoint] = {}
        self.dead_letters = 0
        self.quarantined = 0
        self.next_seq = 1
        self._version = 0                                   # the newest checkpoint version stored
        self._carries: dict[int, dict[str, dict[str, Any]]] = {}   # seq -> checkpoints its row holds
        self._carrier: dict[str, int] = {}                  # incarnation -> seq whose row holds its newest checkpoint
        self._legacy: set[int] = set()                      # batches in the old two-row layout
        whole = True
        cache = self.cache
        keys = list(cache.iterkeys())
        legacy: dict[int, BatchMeta] = {}
        newest: dict[str, tuple[int, dict[str, Any], int | None]] = {}    # inc -> (version, dict, carrier)

        def offer(d: dict[str, Any], carrier: int | None) -> None:
            v = int(d.get("v", 0))
            self._version = max(self._version, v)
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
                    legacy[seq] = rows.legacy_meta(seq, m)
                else:
                    whole = False
            elif key.startswith(rows.CHECKPOINT):
                v = cache.get(key)
                if v is not None:
                    try:
                        offer(rows.unpack_checkpoint(v), None)
                    except rows.BadRow as e:
                        raise SpoolCorruptError(self.db_path, None, f"record {key}: {e}") from e
                else:
                    whole = False
            elif key.startswith(rows.DEAD_LETTER):
                self.dead_letters += 1
            elif key.startswith(rows.QUARANTINE):
                self.quarantined += 1
        orphans = []
        for seq in sorted(legacy):
            self.pending[seq] = legacy[seq]
            self._legacy.add(seq)
            self.next_seq = max(self.next_seq, seq + 1)
        for key in keys:
            if not isinstance(key, int) or key in legacy:
                continue
            self.next_seq = max(self.next_seq, key + 1)
            value = cache.get(key)
            if value is None:
                whole = False            # acked since the listing
                continue
            if not rows.is_batch_row(value):
                # a body of the old layout without its metadata row (cannot happen: they were
                # written in one transaction), as the old code treated it: harmless, removed
                orphans.append(key)
                continue
            assert isinstance(value, bytes)
            try:
                row = rows.unpack_batch(key, value)
                rows.batch_body(row, value)       # the crc32 too: damage is found at start, not mid-run
            except rows.BadRow as e:
                raise SpoolCorruptError(self.db_path, key, str(e)) from e
            self.pending[key] = row.meta
            if row.checkpoints:
                self._carries[key] = row.checkpoints
                for d in row.checkpoints.values():
                    offer(d, key)
        self.pending = dict(sorted(self.pending.items()))
        for inc, (_v, d, carrier) in newest.items():
            self.checkpoints[inc] = Checkpoint.from_dict(d)
            if carrier is not None:
                self._carrier[inc] = carrier
        if not self.read_only:
            for key in orphans:
                cache.delete(key)
        return whole

    def close(self) -> None:
        self.cache.close()

    @property
    def db_path(self) -> str:
        return os.path.join(self.path, diskcache.core.DBNAME)

    def set_autocheckpoint(self, pages: int) -> None:
        """On this thread's connection: checkpoint the WAL after a commit that leaves it over `pages`
        pages (SQLite's default 1000), or never (0: someone else checkpoints, see AsyncSpool)."""
        self._autocheckpoint = pages
        self.cache.reset("sqlite_wal_autocheckpoint", pages, update=False)

    def contents(self) -> SpoolContents:
        return SpoolContents(tuple(self.pending.values()),
                             tuple(dataclasses.replace(cp) for cp in self.checkpoints.values()), self.dead_letters)

    # ---------------------------------------------------------------- accounting

    @property
    def queued_events(self) -> int:
        return sum(m.events for m in self.pending.values())

    @property
    def queued_bytes(self) -> int:
        return sum(m.stored_bytes for m in self.pending.values())

    def shipped_offsets(self) -> dict[str, int]:
        """Per incarnation: the offset below which everything is acknowledged."""
        return shipped_offsets(self.checkpoints.values(), self.pending.values())

    # ---------------------------------------------------------------- writing

    def _guard(self, fn: Callable[[], T]) -> T:
        """Run a write; a full disk becomes SpoolFullError. diskcache rolls a failed statement's
        transaction back, but not a failed COMMIT, after which SQLite may leave the transaction
        open (a full disk hits at COMMIT, when the WAL is written): every later write would then
        fail to begin. So after a failure an empty transaction probes the connection, and if it
        cannot begin, the connection is closed (which rolls back) and the next call opens anew."""
        try:
            return fn()
        except BaseException as e:
            self._recover()
            # SQLITE_FULL only (SQLite reports ENOSPC so): "database disk image is malformed"
            # is damage, not a full disk (issue 19 saw it reported as "state dir is full")
            full = (isinstance(e, sqlite3.Error)
                    and (getattr(e, "sqlite_errorcode", 0) or 0) & 0xFF == sqlite3.SQLITE_FULL) or \
                (isinstance(e, OSError) and e.errno == 28)     # ENOSPC
            if full:
                if self.headroom is not None:
                    self.headroom.hit_full()        # the reserve goes: acks and checkpoints get room
                raise SpoolFullError(f"state_dir is full: {e}") from e
            raise

    def _recover(self) -> None:
        try:
            with self.cache.transact():
                return
        except (diskcache.Timeout, sqlite3.Error):   # BEGIN failed: a transaction is still open here
            pass
        self.cache.close()
        self._limit_wal()
        if self._autocheckpoint is not None:
            try:
                self.cache.reset("sqlite_wal_autocheckpoint", self._autocheckpoint, update=False)
            except sqlite3.Error:
                pass            # applied again at the next failure; the checkpointer still runs

    def _stamp(self, checkpoints: Iterable[Checkpoint]) -> dict[str, dict[str, Any]]:
        """Checkpoints as stored, with the version of this write (one more than any stored)."""
        v = self._version + 1
        return {cp.incarnation: dict(cp.to_dict(), v=v) for cp in checkpoints}

    def _remember(self, stamped: dict[str, dict[str, Any]], carrier: int | None) -> None:
        if not stamped:
            return
        self._version += 1
        for inc, d in stamped.items():
            self.checkpoints[inc] = Checkpoint.from_dict(d)
            if carrier is None:
                self._carrier.pop(inc, None)
            else:
                self._carrier[inc] = carrier

    def commit(self, bodies: BodiesOrMaker, covers: dict[str, tuple[int, int]],
               checkpoints: Iterable[Checkpoint], gzip: bool) -> list[tuple[BatchMeta, bytes]]:
        """Store batches (each one bulk request: body, event count) and the checkpoints they advance,
        all in one transaction. Every batch carries the covers, so a file counts as shipped only
        when all of them are acked. Returns each batch's metadata and stored body (posted as is).
        With no bodies (only checkpoint moves: filtered or empty lines) no batch is stored.
        """
        stamped = self._stamp(checkpoints)
        out, values = self._batches(bodies, covers, stamped, gzip)
        if not values:
            self._write_checkpoints(stamped)
            return []

        def tx() -> None:
            if len(values) == 1:
                self.cache.set(*values[0])          # a transaction of its own
                return
            with self.cache.transact():
                for seq, value in values:
                    self.cache.set(seq, value)

        self._guard(tx)
        self._queued(out, stamped)
        return out

    def _batches(self, bodies: BodiesOrMaker, covers: dict[str, tuple[int, int]],
                 stamped: dict[str, dict[str, Any]], gzip: bool,
                 ) -> tuple[list[tuple[BatchMeta, bytes]], list[tuple[int, bytes]]]:
        """The new batches' metadata and stored bodies, and their rows (the last one carries the
        checkpoints). New batches only with the margin for acks free (issue 19): SpoolFullError."""
        made = bodies() if callable(bodies) else bodies
        stored = [(gzip_compress(b) if gzip else b, len(b), n) for b, n in made if n]
        if stored:
            self._check_room(sum(len(st) for st, _, _ in stored))
        now = self.clock.time()
        out: list[tuple[BatchMeta, bytes]] = []
        values: list[tuple[int, bytes]] = []
        for i, (st, raw_len, n) in enumerate(stored):
            meta = BatchMeta(self.next_seq + i, n, raw_len, len(st), gzip, dict(covers), now)
            values.append((meta.seq, rows.pack_batch(meta, stamped if i == len(stored) - 1 else {}, st)))
            out.append((meta, st))
        return out, values

    def _queued(self, out: list[tuple[BatchMeta, bytes]], stamped: dict[str, dict[str, Any]]) -> None:
        """After the transaction: the new batches are pending, the last one carries `stamped`."""
        last = out[-1][0].seq
        self.next_seq = last + 1
        for meta, _ in out:
            self.pending[meta.seq] = meta
        if stamped:
            self._carries[last] = stamped
        self._remember(stamped, last)

    def commit_acking(self, bodies: BodiesOrMaker, covers: dict[str, tuple[int, int]],
                      checkpoints: Iterable[Checkpoint], gzip: bool,
                      acks: Sequence[int]) -> list[tuple[BatchMeta, bytes]]:
        """`commit` and the acks of earlier batches (delivered whole: no dead letters) in ONE
        transaction, so a steady trickle costs one SQLite transaction per request cycle, not two
        (issue 14). The acked batches leave exactly as `ack` would drop them (a checkpoint a batch
        carries moves to its own row unless this commit carries a newer one); the new batches and
        their checkpoints are written as `commit` writes them. No bodies and no checkpoints: only
        the acks. Seqs not queued (acked before) are skipped. Returns what `commit` returns."""
        stamped = self._stamp(checkpoints)
        # on SpoolFullError (no room for new batches) the acks are not written either: AsyncSpool
        # keeps them for its linger write, which carries no batch and so needs no room
        out, values = self._batches(bodies, covers, stamped, gzip)
        acked = [seq for seq in dict.fromkeys(acks) if seq in self.pending]
        settle: dict[str, dict[str, Any]] = {}
        for seq in acked:
            for inc, d in self._carries.get(seq, {}).items():
                if self._carrier.get(inc) == seq and inc not in stamped:
                    settle[inc] = d
        legacy = [seq for seq in acked if seq in self._legacy]
        if not acked and not values and not stamped:
            return []

        def tx() -> None:
            with self.cache.transact():
                for seq in acked:
                    self.cache.delete(seq)
                for seq in legacy:
                    self.cache.delete(f"{rows.LEGACY_META}{seq}")
                for inc, stored_cp in settle.items():
                    self.cache.set(rows.CHECKPOINT + inc, rows.pack_checkpoint(stored_cp))
                if values:
                    for seq, value in values:
                        self.cache.set(seq, value)
                else:
                    for inc, d in stamped.items():
                        self.cache.set(rows.CHECKPOINT + inc, rows.pack_checkpoint(d))

        self._guard(tx)
        for seq in acked:
            self.pending.pop(seq, None)
            self._carries.pop(seq, None)
            self._legacy.discard(seq)
        for inc in settle:
            self._carrier.pop(inc, None)
        if not values:
            self._remember(stamped, None)
            return []
        self._queued(out, stamped)
        return out

    def save_checkpoints(self, checkpoints: Iterable[Checkpoint]) -> None:
        self._write_checkpoints(self._stamp(checkpoints))

    def _write_checkpoints(self, stamped: dict[str, dict[str, Any]]) -> None:
        if not stamped:
            return

        def tx() -> None:
            with self.cache.transact():
                for inc, d in stamped.items():
                    self.cache.set(rows.CHECKPOINT + inc, rows.pack_checkpoint(d))

        self._guard(tx)
        self._remember(stamped, None)

    def forget_checkpoints(self, incarnations: Iterable[str]) -> list[str]:
        """Delete the checkpoints of these incarnations, except those a queued batch still covers
        or carries (a restart must know where they stand until it is acked). Returns those deleted."""
        busy: set[str] = set()
        for m in self.pending.values():
            busy.update(m.covers)
        for carried in self._carries.values():
            busy.update(carried)
        incs = [inc for inc in incarnations if inc not in busy and inc in self.checkpoints]
        if not incs:
            return []

        def tx() -> None:
            with self.cache.transact():
                for inc in incs:
                    self.cache.delete(rows.CHECKPOINT + inc)

        self._guard(tx)
        for inc in incs:
            self.checkpoints.pop(inc, None)
        return incs

    def read(self, seq: int) -> bytes | None:
        """A queued batch's stored body, or None when it is not queued. A row that does not decode
        (its checksum or header is wrong, or SQLite cannot read it) is quarantined, never raised:
        see `quarantine`; None then too (the sender drops it from the outbox)."""
        try:
            value = self.cache.get(seq)
        except (sqlite3.DatabaseError, *DECODE_ERRORS) as e:
            if isinstance(e, sqlite3.DatabaseError) and not is_damage(e):
                raise
            self.quarantine(seq, damage_text(e), b"")
            return None
        if not isinstance(value, bytes):
            return None
        if seq in self._legacy:
            return value
        try:
            return rows.batch_body(rows.unpack_batch(seq, value), value)
        except rows.BadRow as e:
            self.quarantine(seq, str(e), value)
            return None

    def read_strict(self, seq: int) -> bytes | None:
        """`read` that raises SpoolCorruptError instead of quarantining (for tools and tests)."""
        value = self.cache.get(seq)
        if not isinstance(value, bytes):
            return None
        if seq in self._legacy:
            return value
        try:
            return rows.batch_body(rows.unpack_batch(seq, value), value)
        except rows.BadRow as e:
            raise SpoolCorruptError(self.db_path, seq, str(e)) from e

    def quarantine(self, seq: int, reason: str, value: bytes) -> bool:
        """Move a batch row that does not decode out of the queue, into a "q:<seq>" row (with the
        file ranges its header names, when it still decodes), in one transaction. Logged as a
        warning naming the file ranges, counted in `quarantined` (`shipper status`, `shipper state
        check`). The checkpoints it carried stay where they were: a restart does not read those
        lines again (they are in the quarantine, and in the file while it exists). False when the
        move could not be written (a full disk): the row stays and is tried again at the next start."""
        meta = self.pending.get(seq)
        q = rows.quarantine_value(seq, reason, value, self.clock.time())
        if meta is not None and not q["covers"]:
            q["covers"], q["events"] = dict(meta.covers), meta.events
        carried = self._carries.get(seq, {})
        settle = {inc: d for inc, d in carried.items() if self._carrier.get(inc) == seq}

        def tx() -> None:
            with self.cache.transact():
                self.cache.set(f"{rows.QUARANTINE}{seq:016d}", rows.pack_quarantine(q))
                self.cache.delete(seq)
                if seq in self._legacy:
                    self.cache.delete(f"{rows.LEGACY_META}{seq}")
                for inc, stored_cp in settle.items():
                    self.cache.set(rows.CHECKPOINT + inc, rows.pack_checkpoint(stored_cp))

        moved = True
        try:
            self._guard(tx)
        except (SpoolFullError, sqlite3.Error) as e:
            moved = False
            log.error("corrupt queue record not quarantined", extra={"file": self.db_path, "seq": seq,
                                                                     "error": str(e)})
        paths = {inc: d.get("path") for inc, d in carried.items()}
        for inc in q["covers"]:
            cp = self.checkpoints.get(inc)
            if cp is not None:
                paths.setdefault(inc, cp.path)
        log.warning("corrupt queue record quarantined", extra={
            "file": self.db_path, "seq": seq, "reason": reason, "events": q["events"],
            "ranges": [{"path": paths.get(inc), "incarnation": inc, "from": r[0], "to": r[1]}
                       for inc, r in q["covers"].items()]})
        if moved:
            self.pending.pop(seq, None)
            self._carries.pop(seq, None)
            self._legacy.discard(seq)
            for inc in settle:
                self._carrier.pop(inc, None)
            self.quarantined += 1
        return moved

    def quarantined_items(self) -> list[dict[str, Any]]:
        out = []
        for key in self.cache.iterkeys():
            if isinstance(key, str) and key.startswith(rows.QUARANTINE):
                v = self.cache.get(key)
                if v is not None:
                    try:
                        out.append(rows.unpack_quarantine(v))
                    except rows.BadRow as e:
                        raise SpoolCorruptError(self.db_path, None, f"record {key}: {e}") from e
        out.sort(key=lambda v: int(v.get("seq", 0)))
        return out

    def ack(self, seq: int, dead: Sequence[DeadLetter] = ()) -> int:
        """Elasticsearch acknowledged the batch: it leaves, its dead letters (if any) are stored in
        the same transaction. Returns the number of dead letters stored."""
        dl = list(dead)
        legacy = seq in self._legacy
        settle = {inc: d for inc, d in self._carries.get(seq, {}).items() if self._carrier.get(inc) == seq}

        def tx() -> None:
            if not dl and not settle and not legacy:
                self.cache.delete(seq)              # the usual ack: a transaction of its own
                return
            with self.cache.transact():
                if dl:
                    n = int(self.cache.get(rows.NEXT_DEAD_LETTER, 0))
                    for d in dl:
                        n += 1
                        self.cache.set(f"{rows.DEAD_LETTER}{n:016d}", rows.pack_dead_letter(rows.dead_letter_value(
                            d.index, d.reason, d.status, d.document, d.at, d.doc_id)))
                    self.cache.set(rows.NEXT_DEAD_LETTER, n)
                self.cache.delete(seq)
                if legacy:
                    self.cache.delete(f"{rows.LEGACY_META}{seq}")
                for inc, stored_cp in settle.items():
                    self.cache.set(rows.CHECKPOINT + inc, rows.pack_checkpoint(stored_cp))

        self._guard(tx)
        self.pending.pop(seq, None)
        self._carries.pop(seq, None)
        self._legacy.discard(seq)
        for inc in settle:
            self._carrier.pop(inc, None)
        self.dead_letters += len(dl)
        return self.dead_letters

    def replace(self, seq: int, body: bytes, events: int, gzip: bool) -> BatchMeta | None:
        """Shrink a partly delivered batch to what is still to send (so a restart re-sends less)."""
        meta = self.pending.get(seq)
        if meta is None:
            return None
        stored = gzip_compress(body) if gzip else body
        new = BatchMeta(seq, events, len(body), len(stored), gzip, meta.covers, meta.at)
        value = rows.pack_batch(new, self._carries.get(seq, {}), stored)
        legacy = seq in self._legacy

        def tx() -> None:
            with self.cache.transact():
                self.cache.set(seq, value)
                if legacy:
                    self.cache.delete(f"{rows.LEGACY_META}{seq}")

        self._guard(tx)
        self._legacy.discard(seq)
        self.pending[seq] = new
        return new

    # ---------------------------------------------------------------- room (issue 19)

    def _limit_wal(self) -> None:
        """With headroom: the WAL file is cut back to the margin whenever a checkpoint resets it,
        so its size is what the next checkpoint may still have to copy into the database file."""
        if self.headroom is not None:
            try:
                self.cache.reset("sqlite_journal_size_limit", self.headroom.reserve_bytes, update=False)
            except sqlite3.Error:
                pass            # applied again when the connection is next opened by _recover

    def _check_room(self, nbytes: int) -> None:
        """New batches only while the margin for acks stays free beyond what they need: `nbytes` in
        the WAL, then again in the database file when the WAL is checkpointed, plus what the WAL
        already holds (a checkpoint copies it into the database file, which may have to grow: with
        no room for that the WAL can never restart and no ack could be written: the wedge of issue
        19). Raises SpoolFullError: the writer waits it out, reading paused."""
        h = self.headroom
        if h is None:
            return
        if h.clear_for(2 * nbytes, held=self._wal_seen):
            return             # a look less than a second old leaves room to spare (REUSE_S)
        try:
            wal = os.path.getsize(self.db_path + "-wal")
        except OSError:
            wal = 0
        self._wal_seen = wal
        if not h.may_write(2 * nbytes + wal, queue_empty=not self.pending):
            e = SpoolFullError(f"state_dir is full: {h.free_bytes} bytes free, "
                               f"{h.reserve_bytes} kept for acks and checkpoints")
            e.logged = True
            raise e

    def room(self) -> dict[str, Any]:
        """For status and metrics: is the state dir full, its free bytes (statvfs, fresh)."""
        h = self.headroom
        if h is None:
            return {"full": False, "free_bytes": None, "reserve_bytes": 0, "quarantined": self.quarantined}
        return {"full": h.full, "free_bytes": h.measure(), "reserve_bytes": h.reserve_bytes if h.has_reserve else 0,
                "quarantined": self.quarantined}

    # ---------------------------------------------------------------- dead letters

    def dead_letter_items(self) -> list[tuple[str, dict[str, Any]]]:
        out = []
        for key in self.cache.iterkeys():
            if isinstance(key, str) and key.startswith(rows.DEAD_LETTER):
                v = self.cache.get(key)
                if v is not None:
                    try:
                        out.append((key, rows.unpack_dead_letter(v)))
                    except rows.BadRow as e:
                        raise SpoolCorruptError(self.db_path, None, f"record {key}: {e}") from e
        out.sort()
        return out

    def purge_dead_letters(self) -> int:
        keys = [k for k, _ in self.dead_letter_items()]

        def tx() -> None:
            with self.cache.transact():
                for k in keys:
                    self.cache.delete(k)

        self._guard(tx)
        self.dead_letters = 0
        return len(keys)

    def replay_dead_letters(self, make_bodies: Callable[[list[dict[str, Any]]], Bodies],
                            gzip: bool) -> list[tuple[BatchMeta, bytes]]:
        """Re-queue every dead letter as new batches (bodies from `make_bodies`, each one bulk request)
        and drop them from the dead-letter queue, in one transaction. Returns the new batches."""
        items = self.dead_letter_items()
        if not items:
            return []
        stored = [(gzip_compress(b) if gzip else b, len(b), n) for b, n in make_bodies([v for _, v in items]) if n]
        now = self.clock.time()
        out = [(BatchMeta(self.next_seq + i, n, raw_len, len(st), gzip, {}, now), st)
               for i, (st, raw_len, n) in enumerate(stored)]

        def tx() -> None:
            with self.cache.transact():
                for meta, st in out:
                    self.cache.set(meta.seq, rows.pack_batch(meta, {}, st))
                for k, _ in items:
                    self.cache.delete(k)

        self._guard(tx)
        for meta, _ in out:
            self.pending[meta.seq] = meta
        if out:
            self.next_seq = out[-1][0].seq + 1
        self.dead_letters = 0
        return out


# ---------------------------------------------------------------- damage (issue 19)

DECODE_ERRORS = (KeyError, TypeError, ValueError, AttributeError, IndexError)   # rows.BadRow is a ValueError
_DAMAGE_CODES = (11, 26)        # SQLITE_CORRUPT ("database disk image is malformed"), SQLITE_NOTADB


def is_damage(e: BaseException) -> bool:
    """SQLite says the file is damaged (not busy, not full, not an I/O error)."""
    code = getattr(e, "sqlite_errorcode", None)
    if isinstance(e, sqlite3.DatabaseError) and code is not None:
        return code & 0xFF in _DAMAGE_CODES
    text = str(e)
    return isinstance(e, sqlite3.DatabaseError) and ("malformed" in text or "not a database" in text)


def damage_text(e: BaseException) -> str:
    if isinstance(e, sqlite3.DatabaseError):
        return f"SQLite: {e}"
    return f"a stored record does not decode ({type(e).__name__}: {e})"


def open_cache(path: str, db_path: str) -> diskcache.Cache:
    try:
        return diskcache.Cache(
            path,
            disk=DataDisk,              # data only: no pickles, no files named by a row (spool/disk.py)
            size_limit=2**62,
            eviction_policy="none",
            cull_limit=0,
            statistics=False,
            tag_index=False,
            disk_min_file_size=2**30,   # bodies live in SQLite: one transaction covers everything
            sqlite_synchronous=1,       # NORMAL in WAL mode: durable across process kill
            # diskcache's defaults (32 MiB page cache, 64 MiB mmap) make RSS grow with the queue
            # while the destination is slow; the queue is written and read sequentially anyway.
            sqlite_cache_size=256,
            sqlite_mmap_size=0,
            # diskcache's count/size triggers make every set() a statement SQLite may have to undo
            # alone: its statement journal spilled to a temporary file (created, written, unlinked
            # in $TMPDIR) for every batch over 64 KiB. In memory: -90 us of the spool thread per
            # 2,000-doc commit (bench/README.md, issue 14's seventh round).
            sqlite_temp_store=2,
        )
    except sqlite3.DatabaseError as e:
        if is_damage(e):
            raise SpoolCorruptError(db_path, None, damage_text(e)) from e
        raise
