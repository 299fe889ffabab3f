"""The durable queue and checkpoints, on diskcache (SQLite): records, offsets and dead letters.

A record is a ready bulk body (gzip-compressed once, here, off the event loop) plus the file
ranges it covers. Its checkpoints are written in the same transaction as the record, so a
restart resumes exactly after what was queued; a record leaves only when Elasticsearch acked it.
Blocking: call only from one thread (`AsyncSpool` runs every call on its own single worker).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import logging
import os
import sqlite3
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable, TypeVar

import diskcache

from shipper.errors import SpoolFullError
from shipper.model import BatchMeta, Checkpoint, DeadLetter

from shipper.codec import decode_body, gzip_compress, gzip_decompress  # noqa: F401  (re-exported)

log = logging.getLogger("shipper.spool")

T = TypeVar("T")

CHECKPOINT_EVERY_S = 0.5    # AsyncSpool: WAL checkpoints (and their fsyncs) at most this often, off the spool thread
# The interpreter's switch interval (CPython's default is 5 ms): how long a thread that wants the
# GIL waits before the running one is made to drop it. See AsyncSpool.
GIL_SWITCH_INTERVAL_S = 0.0002

_CP = "c:"      # checkpoint of a file incarnation
_META = "m:"    # record metadata (events, raw bytes, stored bytes, covers, encoding)
_DLQ = "d:"     # dead letter
_NEXT_DLQ = "n:dlq"

# diskcache's Cache table, written directly (see Spool._upsert): key, raw=1, store_time,
# expire_time, access_time, access_count, tag, size, mode, filename, value
_UPSERT_HEAD = ("INSERT INTO Cache(key, raw, store_time, expire_time, access_time, access_count, tag, size,"
                " mode, filename, value) VALUES ")
_UPSERT_ROW = "(?, 1, ?, NULL, ?, 0, NULL, ?, ?, NULL, ?)"
_UPSERT_TAIL = (" ON CONFLICT(key, raw) DO UPDATE SET store_time = excluded.store_time,"
                " access_time = excluded.access_time, size = excluded.size, mode = excluded.mode,"
                " filename = NULL, value = excluded.value")
_DELETE_RECORD = "DELETE FROM Cache WHERE key IN (?, ?) AND raw = 1"
ROWS_PER_STATEMENT = 80      # 6 parameters a row: under SQLite's historical limit of 999


RecordMeta = BatchMeta


class Spool:
    """Synchronous spool. Not thread-safe: one caller thread only."""

    def __init__(self, state_dir: str, *, read_only: bool = False) -> None:
        path = os.path.join(state_dir, "spool")
        if read_only and not os.path.isdir(path):
            raise FileNotFoundError(path)
        os.makedirs(path, exist_ok=True)
        self.path = path
        self.cache = diskcache.Cache(
            path,
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
        )
        self.pending: dict[int, RecordMeta] = {}
        self.checkpoints: dict[str, Checkpoint] = {}
        self.dead_letters = 0
        self.next_seq = 1
        self.read_only = read_only
        self._load()

    # ---------------------------------------------------------------- opening

    def _load(self) -> None:
        cache = self.cache
        for key in cache.iterkeys():
            if isinstance(key, int):
                self.next_seq = max(self.next_seq, key + 1)
            elif isinstance(key, str):
                if key.startswith(_META):
                    m = cache.get(key)
                    if m is not None:
                        seq = int(key[len(_META):])
                        self.pending[seq] = RecordMeta(seq, m["events"], m["raw_bytes"], m["stored_bytes"],
                                                       m["gzipped"], {k: tuple(v) for k, v in m["covers"].items()},  # type: ignore[misc]
                                                       m.get("at", 0.0))
                elif key.startswith(_CP):
                    d = cache.get(key)
                    if d is not None:
                        cp = Checkpoint.from_dict(d)
                        self.checkpoints[cp.incarnation] = cp
                elif key.startswith(_DLQ):
                    self.dead_letters += 1
        # a record whose metadata was written but body is missing cannot exist (one transaction);
        # the converse (orphan body without meta) is harmless and removed here.
        for key in ([] if self.read_only else list(cache.iterkeys())):
            if isinstance(key, int) and key not in self.pending:
                cache.delete(key)

    def close(self) -> None:
        self.cache.close()

    @property
    def db_path(self) -> str:
        return os.path.join(self.path, diskcache.core.DBNAME)

    def set_autocheckpoint(self, pages: int) -> None:
        """On this thread's connection: checkpoint the WAL after a commit that leaves it over `pages`
        pages (SQLite's default 1000), or never (0: someone else checkpoints, see AsyncSpool)."""
        self.cache._sql(f"PRAGMA wal_autocheckpoint = {int(pages)}")

    # ---------------------------------------------------------------- accounting

    def contents(self) -> SpoolContents:
        """Copies of what the store holds: queued batches in order, checkpoints, dead-letter count."""
        return SpoolContents(tuple(dataclasses.replace(self.pending[s]) for s in sorted(self.pending)),
                             tuple(dataclasses.replace(cp) for cp in self.checkpoints.values()),
                             self.dead_letters)

    @property
    def queued_events(self) -> int:
        return sum(m.events for m in self.pending.values())

    @property
    def queued_bytes(self) -> int:
        return sum(m.stored_bytes for m in self.pending.values())

    def shipped_offsets(self) -> dict[str, int]:
        """Per incarnation: the offset below which everything is acknowledged."""
        out = {inc: cp.offset for inc, cp in self.checkpoints.items()}
        for m in self.pending.values():
            for inc, (start, _end) in m.covers.items():
                if inc in out and start < out[inc]:
                    out[inc] = start
        return out

    # ---------------------------------------------------------------- writing

    def _guard(self, fn: Callable[[], T]) -> T:
        try:
            return fn()
        except sqlite3.OperationalError as e:
            msg = str(e).lower()
            if "full" in msg or "disk" in msg:
                raise SpoolFullError(f"state_dir is full: {e}") from e
            raise
        except OSError as e:
            if e.errno == 28:  # ENOSPC
                raise SpoolFullError(f"state_dir is full: {e}") from e
            raise

    def commit(self, bodies: list[tuple[bytes, int]], covers: dict[str, tuple[int, int]],
               checkpoints: Iterable[Checkpoint], gzip: bool) -> list[tuple[RecordMeta, bytes]]:
        """Store records (each one bulk request: body, event count) and the checkpoints they advance,
        all in one transaction. Every record carries the covers, so a file counts as shipped only
        when all of them are acked. Returns each record's metadata and stored body (posted as is).
        With no bodies (only checkpoint moves: filtered or empty lines) no record is stored.
        """
        stored = [(gzip_compress(b) if gzip else b, b, n) for b, n in bodies if n]
        now = time.time()
        cps = list(checkpoints)

        def tx() -> list[tuple[RecordMeta, bytes]]:
            seq = self.next_seq
            out = []
            rows: list[tuple[Any, Any]] = []
            for st, raw, n in stored:
                meta = RecordMeta(seq, n, len(raw), len(st), gzip, dict(covers), now)
                rows.append((seq, st))
                rows.append((f"{_META}{seq}", {"events": n, "raw_bytes": len(raw), "stored_bytes": len(st),
                                               "gzipped": gzip, "covers": covers, "at": now}))
                out.append((meta, st))
                seq += 1
            for cp in cps:
                rows.append((f"{_CP}{cp.incarnation}", cp.to_dict()))
            self._upsert(rows, now)
            self.next_seq = seq
            for meta, _ in out:
                self.pending[meta.seq] = meta
            for cp in cps:
                self.checkpoints[cp.incarnation] = cp
            return out

        return self._guard(tx)

    def _upsert(self, rows: list[tuple[Any, Any]], now: float) -> None:
        """Write (key, value) rows as diskcache's `set` would store them, in one transaction.

        diskcache's `set` runs a SELECT and an INSERT per key, and the spool thread needs the GIL
        back after each SQLite step: while the loop thread is busy parsing, every such hand-over
        waits for the interpreter's switch interval. Here a record (body, metadata, checkpoints) is
        one multi-row statement, which SQLite runs as its own transaction: one hand-over, not ~10.
        Beyond ROWS_PER_STATEMENT rows (many files' checkpoints) several statements share an
        explicit transaction. Keys and values are encoded by diskcache itself (same table, same
        modes), so `Cache.get`, `iterkeys` and the Settings triggers see what `set` would write.
        """
        disk = self.cache.disk
        params: list[Any] = []
        for key, value in rows:
            db_key, raw = disk.put(key)
            size, mode, filename, db_value = disk.store(value, False, key=key)
            if not raw or filename is not None:       # not reachable with our keys and sizes
                raise ValueError(f"spool row {key!r} cannot be written in place")
            params.extend((db_key, now, now, size, mode, db_value))
        sql = self.cache._sql
        per = ROWS_PER_STATEMENT * 6
        if len(params) <= per:
            sql(_UPSERT_HEAD + ",".join([_UPSERT_ROW] * (len(params) // 6)) + _UPSERT_TAIL, params)
            return
        with self.cache.transact():
            for i in range(0, len(params), per):
                chunk = params[i:i + per]
                sql(_UPSERT_HEAD + ",".join([_UPSERT_ROW] * (len(chunk) // 6)) + _UPSERT_TAIL, chunk)

    def save_checkpoints(self, checkpoints: Iterable[Checkpoint]) -> None:
        cps = list(checkpoints)

        def tx() -> None:
            with self.cache.transact():
                for cp in cps:
                    self.cache.set(f"{_CP}{cp.incarnation}", cp.to_dict())
            for cp in cps:
                self.checkpoints[cp.incarnation] = cp

        self._guard(tx)

    def forget_checkpoints(self, incarnations: Iterable[str]) -> list[str]:
        """Delete the checkpoints of these incarnations, except those a queued record still covers
        (a restart must know where they stand until the record is acked). Returns those deleted."""
        covered: set[str] = set()
        for m in self.pending.values():
            covered.update(m.covers)
        incs = [inc for inc in incarnations if inc not in covered and inc in self.checkpoints]

        def tx() -> list[str]:
            with self.cache.transact():
                for inc in incs:
                    self.cache.delete(f"{_CP}{inc}")
            for inc in incs:
                self.checkpoints.pop(inc, None)
            return incs

        return self._guard(tx)

    def read(self, seq: int) -> bytes | None:
        v = self.cache.get(seq)
        return v if isinstance(v, bytes) else None

    def ack(self, seq: int, dead: Iterable[DeadLetter] = ()) -> None:
        """Elasticsearch acknowledged the record (dead letters, if any, are stored in the same transaction)."""
        dl = list(dead)

        def tx() -> None:
            if not dl:
                # the usual ack: one statement (its own transaction), one GIL hand-over (see _upsert)
                self.cache._sql(_DELETE_RECORD, (seq, f"{_META}{seq}"))
            else:
                with self.cache.transact():
                    n = int(self.cache.get(_NEXT_DLQ, 0))
                    for d in dl:
                        n += 1
                        self.cache.set(f"{_DLQ}{n:016d}", {
                            "index": d.index, "reason": d.reason, "status": d.status,
                            "document": d.document, "at": d.at, "id": d.doc_id})
                    self.cache.set(_NEXT_DLQ, n)
                    self.cache.delete(seq)
                    self.cache.delete(f"{_META}{seq}")
            self.pending.pop(seq, None)
            self.dead_letters += len(dl)

        self._guard(tx)

    def replace(self, seq: int, body: bytes, events: int, gzip: bool) -> RecordMeta | None:
        """Shrink a partially delivered record to what is still to send (so a restart re-sends less)."""
        meta = self.pending.get(seq)
        if meta is None:
            return None
        stored = gzip_compress(body) if gzip else body

        def tx() -> None:
            with self.cache.transact():
                self.cache.set(seq, stored)
                self.cache.set(f"{_META}{seq}", {"events": events, "raw_bytes": len(body),
                                                  "stored_bytes": len(stored), "gzipped": gzip,
                                                  "covers": meta.covers, "at": meta.at})
            meta.events, meta.raw_bytes, meta.stored_bytes, meta.gzipped = events, len(body), len(stored), gzip

        self._guard(tx)
        return meta

    # ---------------------------------------------------------------- dead letters

    def dead_letter_items(self) -> list[tuple[str, dict[str, Any]]]:
        out = []
        for key in self.cache.iterkeys():
            if isinstance(key, str) and key.startswith(_DLQ):
                v = self.cache.get(key)
                if v is not None:
                    out.append((key, v))
        out.sort()
        return out

    def purge_dead_letters(self) -> int:
        keys = [k for k, _ in self.dead_letter_items()]

        def tx() -> None:
            with self.cache.transact():
                for k in keys:
                    self.cache.delete(k)
            self.dead_letters = 0

        self._guard(tx)
        return len(keys)

    def replay_dead_letters(self, make_bodies: Callable[[list[dict[str, Any]]], list[tuple[bytes, int]]],
                            gzip: bool) -> list[tuple[RecordMeta, bytes]]:
        """Re-queue every dead letter as new records (bodies from `make_bodies`, each one bulk request)
        and drop them from the dead-letter queue, in one transaction. Returns the new records."""
        items = self.dead_letter_items()
        if not items:
            return []
        bodies = make_bodies([v for _, v in items])
        stored = [(gzip_compress(b) if gzip else b, b, n) for b, n in bodies if n]
        now = time.time()

        def tx() -> list[tuple[RecordMeta, bytes]]:
            seq = self.next_seq
            out = []
            with self.cache.transact():
                for st, raw, n in stored:
                    self.cache.set(seq, st)
                    self.cache.set(f"{_META}{seq}", {"events": n, "raw_bytes": len(raw), "stored_bytes": len(st),
                                                      "gzipped": gzip, "covers": {}, "at": now})
                    out.append((RecordMeta(seq, n, len(raw), len(st), gzip, {}, now), st))
                    seq += 1
                for k, _ in items:
                    self.cache.delete(k)
            self.next_seq = seq
            for meta, _ in out:
                self.pending[meta.seq] = meta
            self.dead_letters = 0
            return out

        return self._guard(tx)


def _noop() -> None:
    return None


@dataclass(frozen=True, slots=True)
class SpoolContents:
    pending: tuple[RecordMeta, ...]
    checkpoints: tuple[Checkpoint, ...]
    dead_letters: int


class AsyncSpool:
    """Runs every Spool call on one dedicated thread, so transactions never interleave and the loop never blocks.

    WAL checkpoints run on a second thread with its own connection. A checkpoint ends in
    fdatasync of the database (and of the WAL), which on a busy disk takes from milliseconds to
    seconds; inline (SQLite's autocheckpoint) it would hold up the commit that triggered it, and
    every record and ack queued behind it. A commit in WAL mode with synchronous=NORMAL writes
    the WAL without syncing, so the spool thread itself never waits for the disk.
    """

    def __init__(self, spool: Spool, checkpoint_every_s: float = CHECKPOINT_EVERY_S) -> None:
        # The spool thread takes the GIL back ~8 times per record (woken, after the join, gzip and
        # SQLite, to hand the result over) while the loop thread parses without pause. With the
        # default 5 ms switch interval each of those waits up to 5 ms, a record took longer to
        # write than to read, and the reader stood waiting for the spool. The loop thread is only
        # made to drop the GIL when another thread asks for it, so a short interval costs a few
        # hundred switches a second and nothing while the spool thread is idle.
        if sys.getswitchinterval() > GIL_SWITCH_INTERVAL_S:
            sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)
        self.spool = spool
        self.dead_letters = spool.dead_letters
        self._executor = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="spool")
        self._checkpoint_every_s = checkpoint_every_s
        self._ckpt_wake = threading.Event()
        self._ckpt_stop = threading.Event()
        self._ckpt_thread: threading.Thread | None = None
        if not spool.read_only:
            self._executor.submit(spool.set_autocheckpoint, 0)   # first on the spool thread
            self._ckpt_thread = threading.Thread(target=self._checkpointer, name="spool-checkpoint", daemon=True)
            self._ckpt_thread.start()

    # ---------------------------------------------------------------- the typed API

    async def contents(self) -> SpoolContents:
        """What the store holds now (after every call submitted before): queued batches in order,
        checkpoints, the dead-letter count. Copies, taken on the spool thread."""
        c = await self.call(self.spool.contents)
        self.dead_letters = c.dead_letters
        return c

    async def commit(self, bodies: list[tuple[bytes, int]] | Callable[[], list[tuple[bytes, int]]],
                     covers: dict[str, tuple[int, int]], checkpoints: list[Checkpoint],
                     gzip: bool) -> list[tuple[RecordMeta, bytes]]:
        def tx() -> list[tuple[RecordMeta, bytes]]:
            return self.spool.commit(bodies() if callable(bodies) else bodies, covers, checkpoints, gzip)
        return await self.call(tx)

    async def read(self, seq: int) -> bytes | None:
        return await self.call(self.spool.read, seq)

    async def ack(self, seq: int, dead: list[DeadLetter] | tuple[DeadLetter, ...] = ()) -> int:
        def tx() -> int:
            self.spool.ack(seq, dead)
            return self.spool.dead_letters
        self.dead_letters = await self.call(tx)
        return self.dead_letters

    async def forget_checkpoints(self, incarnations: list[str]) -> list[str]:
        return await self.call(self.spool.forget_checkpoints, incarnations)

    async def replay_dead_letters(self, make_bodies: Callable[[list[dict[str, Any]]], list[tuple[bytes, int]]],
                                  gzip: bool) -> list[tuple[RecordMeta, bytes]]:
        out = await self.call(self.spool.replay_dead_letters, make_bodies, gzip)
        self.dead_letters = 0
        return out

    async def purge_dead_letters(self) -> int:
        n = await self.call(self.spool.purge_dead_letters)
        self.dead_letters = 0
        return n

    async def flush(self) -> None:
        """Returns once every call submitted before has finished (one worker, FIFO)."""
        await self.call(_noop)

    async def call(self, fn: Callable[..., T], *args: Any) -> T:
        loop = asyncio.get_running_loop()
        result = await loop.run_in_executor(self._executor, fn, *args)
        self._ckpt_wake.set()     # something may have been written: the checkpointer looks (at its pace)
        return result

    def _checkpointer(self) -> None:
        """Checkpoint the WAL at most every checkpoint_every_s while the spool is written. A failed
        checkpoint (full disk) is logged once and retried: SQLite leaves the WAL as it was."""
        con: sqlite3.Connection | None = None
        failing = False
        try:
            while True:
                self._ckpt_wake.wait()
                if self._ckpt_stop.is_set():
                    return
                self._ckpt_wake.clear()
                try:
                    if con is None:
                        con = sqlite3.connect(self.spool.db_path, timeout=60, isolation_level=None)
                    con.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
                    if failing:
                        failing = False
                        log.info("WAL checkpoints work again")
                except (sqlite3.Error, OSError) as e:
                    if not failing:
                        failing = True
                        log.warning("WAL checkpoint failed, retrying", extra={"error": str(e)})
                    self._ckpt_wake.set()
                if self._ckpt_stop.wait(self._checkpoint_every_s):
                    return
        finally:
            if con is not None:
                con.close()

    async def close(self) -> None:
        t = self._ckpt_thread
        if t is not None:
            self._ckpt_stop.set()
            self._ckpt_wake.set()
            await asyncio.to_thread(t.join)
        await self.call(self.spool.close)
        self._executor.shutdown(wait=True)

