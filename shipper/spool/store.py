"""The durable queue on diskcache's public API: batches (a bulk request's body each, gzipped once,
here) and the checkpoints they advance, in one transaction; a batch leaves only when acked. One
thread only (AsyncSpool's; commands and tests while no daemon runs). Layout: rows.py."""

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
from shipper.spool.carried import CheckpointBook
from shipper.spool.contents import SpoolContents, shipped_offsets
from shipper.spool.database import DECODE_ERRORS, Writes, damage_text, is_damage, open_cache
from shipper.spool.headroom import Headroom, release_reserve
from shipper.spool.loading import listed, load, upgrade
from shipper.spool.made import Bodies, BodiesOrMaker, Made, make_bodies

log = logging.getLogger("shipper.spool")

T = TypeVar("T")


READ_ONLY_TRIES = 5          # a read-only view read again while rows vanish under it (see Spool.__init__)

class Spool:
    """Synchronous spool. Not thread-safe: one caller thread only.

    Where a checkpoint lives: a commit's checkpoints ride in its last batch's row (one set(), one
    transaction). They move to their own `c:` rows only when that batch is acked while it still
    carries the newest checkpoint of a file (nothing newer was committed since: the queue ran
    dry), so under load an ack is one delete. Checkpoint-only commits write `c:` rows directly.
    """

    def __init__(self, state_dir: str, *, read_only: bool = False, headroom: bool = False,
                 clock: Clock | None = None, queue_max_bytes: int | None = None) -> None:
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
        self.headroom = Headroom(state_dir, clock=self.clock, queue_max_bytes=queue_max_bytes) \
            if headroom and not read_only else None
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
        self.writes = Writes(self.cache, self.headroom, self.db_path)
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
        self.writes.limit_wal()

    # ---------------------------------------------------------------- opening

    def _load(self) -> bool:
        """The queue and the checkpoints from the rows (spool/loading.py); False when a row listed
        was gone when read (a writer beside us acked it): the view may then be older than any the
        writer had. A writer rewrites what an older version left first (loading.upgrade)."""
        got = load(self.cache, self.db_path)
        if not self.read_only:
            upgrade(self.cache, got, self.writes.run, self.db_path, self.clock.time())
        self.pending = got.pending
        self.dead_letters, self.quarantined, self.next_seq = got.dead_letters, got.quarantined, got.next_seq
        self.book = CheckpointBook(got.checkpoints, got.version, got.carries, got.carrier)
        self._two_row = got.two_row          # 073664d's batches: left so only in a read-only view
        return got.whole

    def close(self) -> None:
        self.writes.close()
        self.cache.close()

    @property
    def checkpoints(self) -> dict[str, Checkpoint]:
        """Each incarnation's newest checkpoint, wherever it is stored."""
        return self.book.checkpoints

    @property
    def db_path(self) -> str:
        return os.path.join(self.path, diskcache.core.DBNAME)

    def set_autocheckpoint(self, pages: int) -> None:
        """On this thread's connection: checkpoint the WAL after a commit that leaves it over `pages`
        pages (SQLite's default 1000), or never (0: someone else checkpoints, see AsyncSpool)."""
        self.writes.set_autocheckpoint(pages)

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

    def commit(self, bodies: BodiesOrMaker, covers: dict[str, tuple[int, int]],
               checkpoints: Iterable[Checkpoint], gzip: bool) -> list[tuple[BatchMeta, bytes]]:
        """Store batches (each one bulk request: body, event count) and the checkpoints they advance,
        all in one transaction. Every batch carries the covers, so a file counts as shipped only
        when all of them are acked. Returns each batch's metadata and stored body (posted as is).
        With no bodies (only checkpoint moves: filtered or empty lines) no batch is stored.
        """
        stamped = self.book.stamp(checkpoints)
        out, values = self._rows(make_bodies(bodies, covers, gzip), stamped)
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

        self.writes.run(tx, sum(len(v) for _, v in values))
        self._queued(out, stamped)
        return out

    def _rows(self, made: Sequence[Made], stamped: dict[str, dict[str, Any]],
              ) -> tuple[list[tuple[BatchMeta, bytes]], list[tuple[int, bytes]]]:
        """The new batches' metadata and stored bodies, and their rows (the last one carries the
        checkpoints). New batches only with the margin for acks free (issue 19): SpoolFullError."""
        if made:
            self._check_room(sum(len(m.stored) for m in made))
        now = self.clock.time()
        out: list[tuple[BatchMeta, bytes]] = []
        values: list[tuple[int, bytes]] = []
        for i, m in enumerate(made):
            meta = BatchMeta(self.next_seq + i, m.events, m.raw_bytes, len(m.stored), m.gzipped, dict(m.covers), now)
            values.append((meta.seq, rows.pack_batch(meta, stamped if i == len(made) - 1 else {}, m.stored)))
            out.append((meta, m.stored))
        return out, values

    def _queued(self, out: list[tuple[BatchMeta, bytes]], stamped: dict[str, dict[str, Any]]) -> None:
        """After the transaction: the new batches are pending, the last one carries `stamped`."""
        last = out[-1][0].seq
        self.next_seq = last + 1
        for meta, _ in out:
            self.pending[meta.seq] = meta
        self.book.remember(stamped, last)

    def commit_acking(self, bodies: BodiesOrMaker, covers: dict[str, tuple[int, int]],
                      checkpoints: Iterable[Checkpoint], gzip: bool, acks: Sequence[int]) -> list[tuple[BatchMeta, bytes]]:
        """`commit` and the acks of earlier batches (delivered whole: no dead letters) in ONE
        transaction, so a steady trickle costs one SQLite transaction per request cycle, not two
        (issue 14). The acked batches leave exactly as `ack` would drop them (a checkpoint a batch
        carries moves to its own row unless this commit carries a newer one); the new batches and
        their checkpoints are written as `commit` writes them. No bodies and no checkpoints: only the
        acks; seqs not queued (acked before) are skipped. Returns what `commit` returns."""
        return self.commit_stored(make_bodies(bodies, covers, gzip), checkpoints, acks)

    def commit_stored(self, made: Sequence[Made], checkpoints: Iterable[Checkpoint],
                      acks: Sequence[int] = ()) -> list[tuple[BatchMeta, bytes]]:
        """`commit_acking` of bodies made already, each with its own covers (batches spilled from memory)."""
        stamped = self.book.stamp(checkpoints)
        # on SpoolFullError (no room for new batches) the acks are not written either: AsyncSpool
        # keeps them for its linger write, which carries no batch and so needs no room
        out, values = self._rows(made, stamped)
        acked = [seq for seq in dict.fromkeys(acks) if seq in self.pending]
        settle = self.book.settled(acked, newer=stamped)
        if not acked and not values and not stamped:
            return []

        def tx() -> None:
            with self.cache.transact():
                self._drop(acked, settle)
                if values:
                    for seq, value in values:
                        self.cache.set(seq, value)
                else:
                    self._set_checkpoints(stamped)

        self.writes.run(tx, sum(len(v) for _, v in values))
        self._dropped(acked, settle)
        if not values:
            self.book.remember(stamped, None)
            if self.headroom is not None and self.headroom.full and stamped:
                # sent from memory, no batch checks the room: this look ends the episode
                self.headroom.may_write(0, queue_empty=not self.pending)
            return []
        self._queued(out, stamped)
        return out

    def save_checkpoints(self, checkpoints: Iterable[Checkpoint]) -> None:
        self._write_checkpoints(self.book.stamp(checkpoints))

    def _write_checkpoints(self, stamped: dict[str, dict[str, Any]]) -> None:
        if not stamped:
            return

        def tx() -> None:
            with self.cache.transact():
                self._set_checkpoints(stamped)

        self.writes.run(tx)
        self.book.remember(stamped, None)

    def _set_checkpoints(self, stored: dict[str, dict[str, Any]]) -> None:
        """In a transaction: checkpoints (as stored, versioned) in their own rows."""
        for inc, d in stored.items():
            self.cache.set(rows.CHECKPOINT + inc, rows.pack_checkpoint(d))

    def _drop(self, seqs: Iterable[int], settle: dict[str, dict[str, Any]]) -> None:
        """In a transaction: the batch rows of `seqs` deleted, the checkpoints they carried as their
        file's newest (`settle`: book.settled) written to their own rows."""
        for seq in seqs:
            self.cache.delete(seq)
        self._set_checkpoints(settle)

    def _dropped(self, seqs: Iterable[int], settle: dict[str, dict[str, Any]]) -> None:
        """After `_drop`'s transaction: the same in memory."""
        for seq in seqs:
            self.pending.pop(seq, None)
        self.book.dropped(seqs, settle)

    def forget_checkpoints(self, incarnations: Iterable[str]) -> list[str]:
        """Delete the checkpoints of these incarnations, except those a queued batch still covers
        or carries (a restart must know where they stand until it is acked). Returns those deleted."""
        busy = self.book.carried()
        for m in self.pending.values():
            busy.update(m.covers)
        incs = [inc for inc in incarnations if inc not in busy and inc in self.checkpoints]
        if not incs:
            return []

        def tx() -> None:
            with self.cache.transact():
                for inc in incs:
                    self.cache.delete(rows.CHECKPOINT + inc)

        self.writes.run(tx)
        for inc in incs:
            self.checkpoints.pop(inc, None)
        return incs

    def read(self, seq: int) -> bytes | None:
        """A queued batch's stored body, or None when it is not queued. A row that does not decode
        (its checksum or header is wrong, or SQLite cannot read it) is quarantined, never raised:
        see `quarantine`; None then too (the sender drops it from the outbox)."""
        return self._read(seq, strict=False)

    def read_strict(self, seq: int) -> bytes | None:
        """`read` that raises SpoolCorruptError instead of quarantining (for tools and tests)."""
        return self._read(seq, strict=True)

    def _read(self, seq: int, strict: bool) -> bytes | None:
        try:
            value = self.cache.get(seq)
        except (sqlite3.DatabaseError, *DECODE_ERRORS) as e:
            if strict or (isinstance(e, sqlite3.DatabaseError) and not is_damage(e)):
                raise
            self.quarantine(seq, damage_text(e), b"")
            return None
        if not isinstance(value, bytes):
            return None
        if seq in self._two_row:
            return value           # a read-only view of 073664d's layout: the bare body
        try:
            return rows.batch_body(rows.unpack_batch(seq, value), value)
        except rows.BadRow as e:
            if strict:
                raise SpoolCorruptError(self.db_path, seq, str(e)) from e
            self.quarantine(seq, str(e), value)
            return None

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
        carried = self.book.carries.get(seq, {})
        settle = self.book.settled([seq])

        def tx() -> None:
            with self.cache.transact():
                self.cache.set(f"{rows.QUARANTINE}{seq:016d}", rows.pack_quarantine(q))
                self._drop([seq], settle)

        moved = True
        try:
            self.writes.run(tx)
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
            self._dropped([seq], settle)
            self.quarantined += 1
        return moved

    def quarantined_items(self) -> list[dict[str, Any]]:
        out = [v for _k, v in listed(self.cache, rows.QUARANTINE, rows.unpack_quarantine, self.db_path)]
        out.sort(key=lambda v: int(v.get("seq", 0)))
        return out

    def ack(self, seq: int, dead: Sequence[DeadLetter] = ()) -> int:
        """Elasticsearch acknowledged the batch: it leaves, its dead letters stored in the same transaction
        (a seq no row has, a batch sent from memory: the dead letters alone). Returns how many are held."""
        dl = list(dead)
        settle = self.book.settled([seq])

        def tx() -> None:
            if not dl and not settle:
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
                self._drop([seq], settle)

        self.writes.run(tx)
        self._dropped([seq], settle)
        self.dead_letters += len(dl)
        return self.dead_letters

    def replace(self, seq: int, body: bytes, events: int, gzip: bool) -> BatchMeta | None:
        """Shrink a partly delivered batch to what is still to send (so a restart re-sends less)."""
        meta = self.pending.get(seq)
        if meta is None:
            return None
        stored = gzip_compress(body) if gzip else body
        new = BatchMeta(seq, events, len(body), len(stored), gzip, meta.covers, meta.at)
        value = rows.pack_batch(new, self.book.carries.get(seq, {}), stored)
        self.writes.run(lambda: self.cache.set(seq, value), len(value))
        self.pending[seq] = new
        return new

    # ---------------------------------------------------------------- room (issue 19)

    def _check_room(self, nbytes: int) -> None:
        """New batches of `nbytes` only with the margin for acks free (Headroom.check_batches)."""
        if self.headroom is not None:
            self.headroom.check_batches(nbytes, self.db_path + "-wal", queue_empty=not self.pending)

    def room(self) -> dict[str, Any]:
        """For status and metrics: is the state dir full, its free bytes (statvfs, fresh)."""
        h = self.headroom
        room = h.status() if h is not None else {"full": False, "free_bytes": None, "reserve_bytes": 0}
        return {**room, "quarantined": self.quarantined}

    # ---------------------------------------------------------------- dead letters

    def dead_letter_items(self) -> list[tuple[str, dict[str, Any]]]:
        return listed(self.cache, rows.DEAD_LETTER, rows.unpack_dead_letter, self.db_path)

    def purge_dead_letters(self) -> int:
        keys = [k for k, _ in self.dead_letter_items()]

        def tx() -> None:
            with self.cache.transact():
                for k in keys:
                    self.cache.delete(k)

        self.writes.run(tx)
        self.dead_letters = 0
        return len(keys)

    def replay_dead_letters(self, bodies_of: Callable[[list[dict[str, Any]]], Bodies],
                            gzip: bool) -> list[tuple[BatchMeta, bytes]]:
        """Re-queue every dead letter as new batches (bodies from `bodies_of`, each one bulk request)
        and drop them from the dead-letter queue, in one transaction. Returns the new batches."""
        items = self.dead_letter_items()
        if not items:
            return []
        made = make_bodies(bodies_of([v for _, v in items]), {}, gzip)
        now = self.clock.time()
        out = [(BatchMeta(self.next_seq + i, m.events, m.raw_bytes, len(m.stored), gzip, {}, now), m.stored)
               for i, m in enumerate(made)]

        def tx() -> None:
            with self.cache.transact():
                for meta, st in out:
                    self.cache.set(meta.seq, rows.pack_batch(meta, {}, st))
                for k, _ in items:
                    self.cache.delete(k)

        self.writes.run(tx)
        for meta, _ in out:
            self.pending[meta.seq] = meta
        if out:
            self.next_seq = out[-1][0].seq + 1
        self.dead_letters = 0
        return out
