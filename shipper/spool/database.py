"""The spool's SQLite file: opened through diskcache with our settings (`disk.DataDisk`), its
writes run so that a full disk or a failed COMMIT leaves it usable, its errors told apart (damage,
a full disk, anything else). Which rows are written is store.Spool's; none is read here."""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Callable
from typing import TypeVar

import diskcache

from shipper.errors import SpoolCorruptError, SpoolFullError
from shipper.spool.disk import DataDisk
from shipper.spool.headroom import Headroom

# The WAL is checkpointed and truncated once it holds more than this (`Writes._bound_wal`): with the
# full-disk reserve (at most 2 MiB) it is most of the state dir's 8 MiB beside the queue (SPEC).
WAL_MAX_BYTES = 2 * 1024 * 1024
WAL_LOOK_BYTES = WAL_MAX_BYTES // 4    # written between two looks at the WAL's size (a stat)

T = TypeVar("T")

DECODE_ERRORS = (KeyError, TypeError, ValueError, AttributeError, IndexError)   # rows.BadRow is a ValueError
_DAMAGE_CODES = (11, 26)        # SQLITE_CORRUPT ("database disk image is malformed"), SQLITE_NOTADB
ENOSPC = 28


def _code(e: BaseException) -> int | None:
    """SQLite's extended result code of an error (sqlite3 sets it only on some errors)."""
    code = getattr(e, "sqlite_errorcode", None)
    return code if isinstance(code, int) else None


def is_damage(e: BaseException) -> bool:
    """SQLite says the file is damaged (not busy, not full, not an I/O error)."""
    code = _code(e)
    if isinstance(e, sqlite3.DatabaseError) and code is not None:
        return code & 0xFF in _DAMAGE_CODES
    text = str(e)
    return isinstance(e, sqlite3.DatabaseError) and ("malformed" in text or "not a database" in text)


def is_full(e: BaseException) -> bool:
    """The disk is full: SQLITE_FULL (SQLite reports ENOSPC so), or ENOSPC itself. "database disk
    image is malformed" is damage, not a full disk."""
    return ((isinstance(e, sqlite3.Error) and (_code(e) or 0) & 0xFF == sqlite3.SQLITE_FULL)
            or (isinstance(e, OSError) and e.errno == ENOSPC))


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
            # in $TMPDIR) for every batch over 64 KiB; in memory it costs the spool thread less
            # (docs/development.md, "Why the code is as it is").
            sqlite_temp_store=2,
        )
    except sqlite3.DatabaseError as e:
        if is_damage(e):
            raise SpoolCorruptError(db_path, None, damage_text(e)) from e
        raise


class Writes:
    """The writes to one open cache. diskcache rolls a failed statement's transaction back, but not
    a failed COMMIT, after which SQLite may leave the transaction open (a full disk hits at COMMIT,
    when the WAL is written): every later write would then fail to begin. So after a failure an
    empty transaction probes the connection, and if it cannot begin, the connection is closed
    (which rolls back) and the next call opens it anew, with our settings applied again."""

    def __init__(self, cache: diskcache.Cache, headroom: Headroom | None, db_path: str = "") -> None:
        self.cache = cache
        self.headroom = headroom
        self.autocheckpoint: int | None = None
        self.db_path = db_path
        self._unlooked = 0                  # bytes written since the WAL's size was last looked at
        self._ckpt: sqlite3.Connection | None = None

    def run(self, fn: Callable[[], T], nbytes: int = 0) -> T:
        """Run a write (of about `nbytes`); a full disk becomes SpoolFullError (and the headroom's
        reserve is given back)."""
        try:
            out = fn()
        except BaseException as e:
            self._recover()
            if is_full(e):
                if self.headroom is not None:
                    self.headroom.hit_full()        # the reserve goes: acks and checkpoints get room
                raise SpoolFullError(f"state_dir is full: {e}") from e
            raise
        if self.headroom is not None and nbytes:
            self._unlooked += nbytes
            if self._unlooked >= WAL_LOOK_BYTES:
                # refused (the checkpointer thread's passive checkpoint holds the checkpoint lock, a
                # reader's snapshot): looked at again after the next write, not WAL_LOOK_BYTES later
                self._unlooked = 0 if self._bound_wal() else WAL_LOOK_BYTES
        return out

    def _bound_wal(self) -> bool:
        """Past WAL_MAX_BYTES, checkpoint the WAL and truncate it, here on the one writer's thread
        between two transactions. The checkpointer thread's passive checkpoints never restart a WAL
        that a writer without pause keeps appending to: it grew by every byte spooled (13 MB in a
        2 s drain of a 1 MiB queue), past SPEC's bound of the state dir (queue.max_bytes plus 8 MiB
        of everything else). Only then does a commit wait for a checkpoint (a full disk: the
        checkpointer thread's retries go on).
        True when the WAL is within its bound or was truncated; False when the checkpoint was
        refused (SQLite answers busy while another checkpoint runs) or failed."""
        try:
            if os.path.getsize(self.db_path + "-wal") <= WAL_MAX_BYTES:
                return True
            if self._ckpt is None:
                self._ckpt = sqlite3.connect(self.db_path, timeout=60, isolation_level=None, check_same_thread=False)
            row = self._ckpt.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
        except (OSError, sqlite3.Error):
            return False
        return row is not None and row[0] == 0

    def close(self) -> None:
        if self._ckpt is not None:
            self._ckpt.close()
            self._ckpt = None

    def _recover(self) -> None:
        try:
            with self.cache.transact():
                return
        except (diskcache.Timeout, sqlite3.Error):   # BEGIN failed: a transaction is still open here
            pass
        self.cache.close()
        self.limit_wal()
        if self.autocheckpoint is not None:
            try:
                self.cache.reset("sqlite_wal_autocheckpoint", self.autocheckpoint, update=False)
            except sqlite3.Error:
                pass            # applied again at the next failure; the checkpointer still runs

    def set_autocheckpoint(self, pages: int) -> None:
        self.autocheckpoint = pages
        self.cache.reset("sqlite_wal_autocheckpoint", pages, update=False)

    def limit_wal(self) -> None:
        """With headroom: the WAL file is cut back to the margin whenever a checkpoint resets it,
        so its size is what the next checkpoint may still have to copy into the database file."""
        if self.headroom is not None:
            try:
                self.cache.reset("sqlite_journal_size_limit", self.headroom.reserve_bytes, update=False)
            except sqlite3.Error:
                pass            # applied again when the connection is next opened by _recover
