"""Room on the state dir's filesystem for the writes that free space: new batches only while a margin
stays free beyond them (reading pauses meanwhile, the files are the buffer), and a reserve file given
back when a write meets a full disk anyway. Spool thread only; `full` and `free_bytes` readable anywhere."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import Any

from shipper import statedir
from shipper.clock import Clock, SystemClock
from shipper.errors import SpoolFullError

log = logging.getLogger("shipper.spool")

RESERVE_FILE = "reserve"               # state_dir/reserve: zeros, given back when the disk is full
# SPEC (Delivery): the state dir holds at most queue.max_bytes of queue plus 8 MiB of everything else
# (checkpoints, reserves, status). The reserve (and the WAL left after a checkpoint, cut to the same
# size) is one share of those 8 MiB: at most 2 MiB, and at most an eighth of the queue's bound.
MAX_RESERVE_BYTES = 2 * 1024 * 1024
MIN_RESERVE_BYTES = 64 * 1024
# A look at the free space (statvfs, and the WAL's size) that said yes is trusted for the batches
# that follow it for this long, while what they add leaves this many margins free: a steady trickle
# then looks once a second, not once per request cycle (two syscalls, dear after the spool thread
# slept: docs/development.md). Nearer the edge every batch looks; a disk filled by
# another writer meanwhile is what the reserve file is for (`hit_full`).
REUSE_S = 1.0
REUSE_MARGINS = 4


def reserve_size(total_bytes: int, max_bytes: int = MAX_RESERVE_BYTES, queue_max_bytes: int | None = None) -> int:
    """The margin for a filesystem of `total_bytes` under a queue bounded at `queue_max_bytes`:
    1/16 of the filesystem and 1/8 of the queue's bound, between 64 KiB and `max_bytes`."""
    cap = max_bytes if queue_max_bytes is None else min(max_bytes, queue_max_bytes // 8)
    return max(MIN_RESERVE_BYTES, min(cap, total_bytes // 16))


def should_write(free_bytes: int, nbytes: int, reserve_bytes: int, full: bool, *, total_bytes: int = 0,
                 queue_empty: bool = False) -> bool:
    """Pure: may `nbytes` of new queue be written with `free_bytes` free? Writing stops before less
    than `reserve_bytes` would stay free. Once stopped (`full`), it starts again when the queue has
    drained (the destination took everything) or three quarters of the filesystem are free again, with twice the
    margin: one pause per episode, not one per ack."""
    if not full:
        return free_bytes >= nbytes + reserve_bytes
    room = free_bytes >= nbytes + 2 * reserve_bytes
    return room and (queue_empty or free_bytes >= total_bytes * 3 // 4)


def room_is_clear(free_bytes: int, spent: int, nbytes: int, reserve_bytes: int, age_s: float | None) -> bool:
    """Pure: may `nbytes` more be written on the strength of a look `age_s` seconds old (None: no
    look to trust) that found `free_bytes` free, `spent` bytes having been let through since?
    Only while the look is younger than REUSE_S and REUSE_MARGINS margins stay free beyond both."""
    if age_s is None or not 0 <= age_s < REUSE_S:
        return False
    return free_bytes - spent - nbytes >= REUSE_MARGINS * reserve_bytes


class Headroom:
    """The state dir's free space and its reserve file. `statvfs` and the clock are injectable for tests.

    Acks, WAL checkpoints and dead-letter moves need a little space themselves (SQLite writes
    the WAL before it can drop anything), so a disk filled by the queue would wedge: nothing
    more could be acked. Two margins keep it from that: new batches are only written while more
    than `reserve_bytes` stay free beyond them, and a reserve file of the same size, made at
    start, is given back when a write hits a full disk anyway (another writer on the same
    filesystem). Reading resumes by itself once twice the margin is free again and the reserve
    is back.
    """

    def __init__(self, state_dir: str, max_reserve_bytes: int = MAX_RESERVE_BYTES,
                 statvfs: Callable[[str], os.statvfs_result] = os.statvfs,
                 clock: Clock | None = None, queue_max_bytes: int | None = None) -> None:
        self.state_dir = state_dir
        self.path = os.path.join(state_dir, RESERVE_FILE)
        self._max_reserve_bytes = max_reserve_bytes
        self._statvfs = statvfs
        self._clock = clock or SystemClock()
        self._looked_at: float | None = None    # when may_write last measured and said yes
        self._spent = 0                         # bytes let through since that look
        self._wal_seen = 0                      # the WAL's size at the last look of check_batches
        st = statvfs(state_dir)
        self.total_bytes = st.f_blocks * st.f_frsize
        self.reserve_bytes = reserve_size(self.total_bytes, max_reserve_bytes, queue_max_bytes)
        self.free_bytes = st.f_bavail * st.f_frsize
        self.full = False
        self.has_reserve = self._make_reserve()

    def resize(self, queue_max_bytes: int | None) -> None:
        """queue.max_bytes changed (SIGHUP): the margin and the reserve file follow it at once, so
        a lowered bound lowers what the state dir holds (SPEC, Delivery). Spool thread."""
        size = reserve_size(self.total_bytes, self._max_reserve_bytes, queue_max_bytes)
        if size == self.reserve_bytes:
            return
        log.info("state_dir reserve resized", extra={"state_dir": self.state_dir, "reserve_bytes": size,
                                                     "was": self.reserve_bytes})
        self.reserve_bytes = size
        self._looked_at = None
        if self.has_reserve or not self.full:
            self.has_reserve = self._make_reserve()

    def measure(self) -> int:
        st = self._statvfs(self.state_dir)
        self.free_bytes = st.f_bavail * st.f_frsize
        return self.free_bytes

    def clear_for(self, nbytes: int, held: int = 0) -> bool:
        """True, without measuring, when the last look that said yes still leaves room for `nbytes`
        more beyond `held` (the WAL's size at that look): see REUSE_S. False: ask `may_write`."""
        if self.full or not room_is_clear(self.free_bytes, self._spent + held, nbytes, self.reserve_bytes,
                                          None if self._looked_at is None else self._clock.monotonic() - self._looked_at):
            return False
        self._spent += nbytes
        return True

    def may_write(self, nbytes: int, queue_empty: bool = False) -> bool:
        """Before new batches are written: False (full) while less than the margin would stay free."""
        self._looked_at = None
        looked_at = self._clock.monotonic()
        free = self.measure()
        ok = should_write(free, nbytes, self.reserve_bytes, self.full, total_bytes=self.total_bytes,
                          queue_empty=queue_empty)
        if ok and self.full:
            if not self.has_reserve:
                self.has_reserve = self._make_reserve()
                ok = self.has_reserve and should_write(self.measure(), nbytes, self.reserve_bytes, False)
            if ok:
                self.full = False
                log.info("state_dir has room again, reading resumes",
                         extra={"state_dir": self.state_dir, "free_bytes": self.free_bytes})
        elif not ok and not self.full:
            self._enter(free, "reading paused")
        if ok:
            self._looked_at, self._spent = looked_at, nbytes
        return ok

    def check_batches(self, nbytes: int, wal_path: str, queue_empty: bool) -> None:
        """New batches only while the margin for acks stays free beyond what they need: `nbytes` in
        the WAL, then again in the database file when the WAL is checkpointed, plus what the WAL
        (`wal_path`) already holds (a checkpoint copies it into the database file, which may have to
        grow: with no room for that the WAL can never restart and no ack could be written). Raises
        SpoolFullError (already logged): the writer waits it out, reading paused."""
        if self.clear_for(2 * nbytes, held=self._wal_seen):
            return             # a look less than a second old leaves room to spare (REUSE_S)
        try:
            wal = os.path.getsize(wal_path)
        except OSError:
            wal = 0
        self._wal_seen = wal
        if not self.may_write(2 * nbytes + wal, queue_empty=queue_empty):
            e = SpoolFullError(f"state_dir is full: {self.free_bytes} bytes free, "
                               f"{self.reserve_bytes} kept for acks and checkpoints")
            e.logged = True
            raise e

    def status(self) -> dict[str, Any]:
        """For status and metrics: is the state dir full, its free bytes (statvfs, fresh), the reserve."""
        return {"full": self.full, "free_bytes": self.measure(),
                "reserve_bytes": self.reserve_bytes if self.has_reserve else 0}

    def hit_full(self) -> None:
        """A write failed for a full disk: give the reserve back so acks and checkpoints can run."""
        self._looked_at = None
        released = False
        if self.has_reserve:
            try:
                os.unlink(self.path)
                released = True
            except FileNotFoundError:
                released = True
            except OSError as e:
                log.debug("reserve not released", extra={"path": self.path, "error": str(e)})
            self.has_reserve = not released
        if not self.full:
            self._enter(self.measure(), "reserve released" if released else "no reserve left")
        elif released:
            log.info("state_dir reserve released for acks", extra={"state_dir": self.state_dir,
                                                                   "free_bytes": self.measure()})

    def _enter(self, free: int, what: str) -> None:
        self.full = True
        log.warning("state_dir is full: reading paused, sending and acking go on", extra={
            "state_dir": self.state_dir, "free_bytes": free, "reserve_bytes": self.reserve_bytes, "detail": what})

    def _make_reserve(self) -> bool:
        """The reserve file at exactly its size (kept across restarts; one a larger margin left, as
        before a lower queue.max_bytes, is cut to it). False when there is no room for it and none
        was there; a file that cannot grow keeps the size it had."""
        try:
            fd = statedir.open_file(self.path, os.O_WRONLY | os.O_CREAT)     # no link followed, 0600
        except (OSError, statedir.UnsafeStateDir):
            return False
        try:
            had = os.fstat(fd).st_size
            if had >= self.reserve_bytes:
                if had > self.reserve_bytes:
                    os.ftruncate(fd, self.reserve_bytes)
                return True
            if self.measure() < 2 * self.reserve_bytes:
                return self._keep(fd, had)
            try:
                try:
                    os.posix_fallocate(fd, 0, self.reserve_bytes)
                except OSError as e:
                    if e.errno == 28:
                        raise
                    os.ftruncate(fd, had)         # no fallocate here: real zeros, so the blocks are taken
                    chunk = bytes(1 << 16)
                    left = self.reserve_bytes - had
                    os.lseek(fd, had, os.SEEK_SET)
                    while left > 0:
                        left -= os.write(fd, chunk[:min(left, len(chunk))])
                return True
            except OSError:
                return self._keep(fd, had)
        except OSError:
            return False
        finally:
            os.close(fd)

    def _keep(self, fd: int, had: int) -> bool:
        """The reserve could not grow: what it held before stays (nothing of it is given up for a
        larger one that does not fit); an empty one goes."""
        try:
            if had:
                os.ftruncate(fd, had)
                return True
            os.unlink(self.path)
        except OSError:
            pass
        return False


def release_reserve(state_dir: str) -> bool:
    """Delete state_dir/reserve (before a Headroom exists: opening on a full disk). True if it was there."""
    try:
        os.unlink(os.path.join(state_dir, RESERVE_FILE))
    except OSError:
        return False
    log.warning("state_dir is full: reserve released to open the spool", extra={"state_dir": state_dir})
    return True
