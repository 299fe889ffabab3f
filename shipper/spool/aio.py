"""AsyncSpool: the daemon's only way to the spool. Every call runs on one thread of our own
(SpoolThread), in the order it was made, so transactions never interleave and the loop never blocks
on SQLite; callers get values back, never the Spool's state. WAL checkpoints run on a second thread."""

from __future__ import annotations

import asyncio
import logging
import queue
import sqlite3
import sys
import threading
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

from shipper.clock import Clock
from shipper.codec import join_bodies
from shipper.model import BatchMeta, Checkpoint, DeadLetter
from shipper.spool.contents import SpoolContents
from shipper.spool.made import Bodies, BodiesOrMaker, Made, make_bodies
from shipper.spool.store import Spool

log = logging.getLogger(__name__)

T = TypeVar("T")

CHECKPOINT_EVERY_S = 0.5    # WAL checkpoints (and their fsyncs) at most this often, off the spool thread
# The interpreter's switch interval (CPython's default is 5 ms): how long a thread that wants the
# GIL waits before the running one is made to drop it. See AsyncSpool.__init__.
GIL_SWITCH_INTERVAL_S = 0.0002
# How long a plain ack (a batch delivered whole) may wait for the next commit to carry it in
# the same transaction (`Spool.commit_acking`) before it is written on its own. A steady trickle
# then costs one SQLite transaction and one thread hand-over per request cycle instead of two.
ACK_LINGER_S = 0.5


class CommitSkipped(Exception):
    """A commit handed over with `commit_in_order` found the commit before it not written (it
    failed, or was cancelled) when its turn came on the spool thread: nothing of it was written.
    The writer hands it over again once the one before it is written."""


class WriteOrder:
    """One writer's commits in order (`AsyncSpool.commit_in_order`): the last turn written, read
    and set on the spool thread only. Each writer has its own (a pipeline rebuilt on the same
    spool starts at turn 1 again)."""

    __slots__ = ("written",)

    def __init__(self) -> None:
        self.written = 0


class SpoolThread:
    """One thread that runs the calls handed to it in order, each answered as an asyncio future
    on the loop that made it. It does what a one-worker ThreadPoolExecutor under `run_in_executor`
    does, at a fraction of the loop's cost (issue 14): the executor builds a concurrent Future (a
    Condition and its locks), a work item and a chained asyncio future per call, and its worker
    signals the idle semaphore and the concurrent future's Condition before the loop hears of the
    result; here a call is one tuple on a SimpleQueue and one `call_soon_threadsafe` back
    (docs/development.md has the measurement).

    A call whose future was cancelled before the thread took it is not run (run_in_executor's
    behaviour); one cancelled while it runs still runs to its end, and its result is dropped."""

    def __init__(self, name: str = "spool") -> None:
        self._q: queue.SimpleQueue[tuple[Callable[..., Any], tuple[Any, ...], asyncio.Future[Any],
                                         asyncio.AbstractEventLoop] | None] = queue.SimpleQueue()
        # a daemon: an exit without close() does not wait for it (a transaction cut short is
        # rolled back by SQLite at the next open; nothing is lost)
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def call(self, fn: Callable[..., T], *args: Any) -> asyncio.Future[T]:
        """`fn(*args)` on the thread, behind every call made before; its future on the running loop."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[T] = loop.create_future()
        self._q.put((fn, args, fut, loop))
        return fut

    @property
    def native_id(self) -> int | None:
        return self._thread.native_id

    def stop(self, wait: bool = True) -> None:
        """The thread ends after the calls handed to it before; `wait`: until it has."""
        self._q.put(None)
        if wait:
            self._thread.join()

    def _run(self) -> None:
        get = self._q.get
        while True:
            item = get()
            if item is None:
                return
            fn, args, fut, loop = item
            if fut.cancelled():         # read under the GIL: the loop cancelled it before its turn
                continue
            try:
                result = fn(*args)
            except BaseException as e:  # handed to the caller, as an executor would
                _answer(loop, _set_exception, fut, e)
            else:
                _answer(loop, _set_result, fut, result)
            del item, fn, args, fut     # not kept alive while the thread waits for the next call


def _answer(loop: asyncio.AbstractEventLoop, setter: Callable[[asyncio.Future[Any], Any], None],
            fut: asyncio.Future[Any], value: Any) -> None:
    try:
        loop.call_soon_threadsafe(setter, fut, value)
    except RuntimeError:        # the loop is closed: nobody waits for the answer any more
        pass


def _set_result(fut: asyncio.Future[Any], value: Any) -> None:
    if not fut.cancelled():
        fut.set_result(value)


def _set_exception(fut: asyncio.Future[Any], e: BaseException) -> None:
    if not fut.cancelled():
        fut.set_exception(e)


def thread_written_bytes(native_id: int | None) -> int | None:
    """What a thread of this process passed to write(2) and pwrite(2) (`wchar` in the kernel's
    per-thread I/O accounting, /proc/self/task/TID/io); None where /proc does not say."""
    if native_id is None:
        return None
    try:
        with open(f"/proc/self/task/{native_id}/io", "rb") as f:
            for line in f.read().splitlines():
                if line.startswith(b"wchar:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def _open(state_dir: str, clock: Clock | None, queue_max_bytes: int | None) -> Spool:
    # room kept for acks on a full disk (issue 19), sized within SPEC's bound of the state dir
    spool = Spool(state_dir, headroom=True, clock=clock, queue_max_bytes=queue_max_bytes)
    spool.set_autocheckpoint(0)     # on the spool thread's connection: the checkpointer thread does it
    return spool


def _noop() -> None:
    return None


def _resize_reserve(spool: Spool, queue_max_bytes: int | None) -> None:
    if spool.headroom is not None:
        spool.headroom.resize(queue_max_bytes)
        spool.writes.limit_wal()        # the WAL left after a checkpoint is cut to the same margin


class AsyncSpool:
    """The spool behind one worker thread; open with `await AsyncSpool.open(state_dir)`.

    A WAL checkpoint ends in fdatasync of the database (and of the WAL), which on a busy disk
    takes from milliseconds to seconds; inline (SQLite's autocheckpoint) it would hold up the
    commit that triggered it, and every batch and ack queued behind it. A commit in WAL mode with
    synchronous=NORMAL writes the WAL without syncing, so the spool thread never waits for the disk.
    A full disk raises shipper.errors.SpoolFullError from the call that hit it; nothing of that
    call was written.
    """

    def __init__(self, spool: Spool, worker: SpoolThread | None = None,
                 checkpoint_every_s: float = CHECKPOINT_EVERY_S) -> None:
        # The spool thread takes the GIL back after every SQLite step, gzip and join, while the
        # loop thread parses without pause. With the default 5 ms switch interval each of those
        # waits up to 5 ms, a batch took longer to write than to read, and the reader stood
        # waiting for the spool. The loop thread is only made to drop the GIL when another thread
        # asks for it, so a short interval costs a few hundred switches a second and nothing while
        # the spool thread is idle.
        if sys.getswitchinterval() > GIL_SWITCH_INTERVAL_S:
            sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)
        self._spool = spool
        self._worker = worker if worker is not None else SpoolThread()
        self.dead_letters = spool.dead_letters      # kept current from the answers (for status)
        self._checkpoint_every_s = checkpoint_every_s
        self._acks: list[int] = []           # delivered, not yet deleted: the next commit carries them
        self._ack_timer: asyncio.TimerHandle | None = None
        self._ack_flush: asyncio.Task[None] | None = None
        self._ckpt_wake = threading.Event()
        self._ckpt_stop = threading.Event()
        self._ckpt_thread = threading.Thread(target=self._checkpointer, name="spool-checkpoint", daemon=True)
        self._ckpt_thread.start()

    @classmethod
    async def open(cls, state_dir: str, *, checkpoint_every_s: float = CHECKPOINT_EVERY_S,
                   clock: Clock | None = None, queue_max_bytes: int | None = None) -> AsyncSpool:
        """Open (and, after an older version, read in place) the spool under state_dir/spool, on
        the spool thread. `queue_max_bytes` (queue.max_bytes) sizes the full-disk reserve."""
        worker = SpoolThread()
        try:
            spool = await worker.call(_open, state_dir, clock, queue_max_bytes)
        except Exception:
            worker.stop(wait=True)         # the open has ended: the thread is idle, it ends at once
            raise
        except BaseException:
            worker.stop(wait=False)        # cancelled: the open may still run; its thread ends after
            raise
        return cls(spool, worker, checkpoint_every_s)

    async def _call(self, fn: Callable[..., T], *args: Any) -> T:
        result = await self._worker.call(fn, *args)
        self._written()
        return result

    def _written(self) -> None:
        """Something may have been written: the checkpointer looks (at its pace). Between its looks
        the event stays set, so most calls pay only the test."""
        if not self._ckpt_wake.is_set():
            self._ckpt_wake.set()

    # ---------------------------------------------------------------- the API

    async def contents(self) -> SpoolContents:
        """What is queued, the checkpoints and the dead-letter count, as of every call made before."""
        await self.flush_acks()
        return await self._call(self._spool.contents)

    async def commit(self, bodies: BodiesOrMaker, covers: dict[str, tuple[int, int]],
                     checkpoints: Iterable[Checkpoint], gzip: bool) -> list[tuple[BatchMeta, bytes]]:
        """Spool.commit on the spool thread: batches and the checkpoints they advance, one transaction.
        `bodies` may be a maker: it runs there too."""
        acks = self._take_acks()
        if not acks:
            return await self._call(self._spool.commit, bodies, covers, list(checkpoints), gzip)
        try:
            return await self._call(self._spool.commit_acking, bodies, covers, list(checkpoints), gzip, acks)
        except BaseException:
            self._acks[:0] = acks          # not written: the next write (or the linger) carries them
            if acks:
                self._arm_ack_timer()
            raise

    def commit_in_order(self, order: WriteOrder, turn: int, bodies: BodiesOrMaker, covers: dict[str, tuple[int, int]],
                        checkpoints: Iterable[Checkpoint], gzip: bool,
                        ) -> asyncio.Future[list[tuple[BatchMeta, bytes]]]:
        """`commit`, handed to the spool thread NOW (not when the caller's task next runs), queued
        behind every call made before it; returns its future. `turn` numbers the commits of one
        writer (`order`) 1, 2, 3...: commit `turn` is written only if commit `turn - 1` was, when
        its turn comes on the spool thread; otherwise it raises CommitSkipped, having written nothing. So a
        reader may hand over the next commit while the one before is still being written (the
        spool thread never waits for the loop to take an answer and pass the next commit), and a
        commit that failed still stops every one handed over behind it. A retry passes the same
        turn."""
        cps = list(checkpoints)

        def write(acks: list[int]) -> list[tuple[BatchMeta, bytes]]:
            if acks:
                return self._spool.commit_acking(bodies, covers, cps, gzip, acks)
            return self._spool.commit(bodies, covers, cps, gzip)

        return self._in_order(order, turn, write)

    def spill_in_order(self, order: WriteOrder, turn: int, made: Sequence[Made], checkpoints: Iterable[Checkpoint],
                       ) -> asyncio.Future[list[tuple[BatchMeta, bytes]]]:
        """`commit_in_order` of bodies made already, each with its own covers (`Spool.commit_stored`):
        batches sent from memory written to the queue, or (no bodies) a checkpoint flush."""
        cps = list(checkpoints)
        items = list(made)
        return self._in_order(order, turn, lambda acks: self._spool.commit_stored(items, cps, acks))

    def make(self, bodies: BodiesOrMaker, covers: dict[str, tuple[int, int]], gzip: bool) -> asyncio.Future[list[Made]]:
        """The bodies made and compressed on the spool thread, behind every call before it; nothing
        is written (they are sent from memory)."""
        return self._worker.call(make_bodies, bodies, covers, gzip)

    def _in_order(self, order: WriteOrder, turn: int, write: Callable[[list[int]], T]) -> asyncio.Future[T]:
        acks = self._take_acks()

        def run() -> T:
            if order.written != turn - 1:
                raise CommitSkipped(f"commit {turn} handed over behind commit {turn - 1}, which was not written")
            out = write(acks)
            order.written = turn
            return out

        fut = self._worker.call(run)

        def done(f: asyncio.Future[T]) -> None:
            self._written()
            if f.cancelled() or f.exception() is not None:
                if acks:
                    self._acks[:0] = acks    # not written: the next write (or the linger) carries them
                    self._arm_ack_timer()

        fut.add_done_callback(done)
        return fut

    async def read(self, seq: int) -> bytes | None:
        return await self._call(self._spool.read, seq)

    async def joined(self, bodies: Sequence[bytes | int], gzipped: bool) -> tuple[bytes, list[int]]:
        """Several batches as one request's body (`codec.join_bodies`), on the spool thread, the one
        that compresses: a body given, or a seq whose stored body is read here. Also the seqs the
        spool no longer holds (left out of the body)."""
        return await self._call(self._join, bodies, gzipped)

    def _join(self, bodies: Sequence[bytes | int], gzipped: bool) -> tuple[bytes, list[int]]:
        found: list[bytes] = []
        missing: list[int] = []
        for b in bodies:
            body = self._spool.read(b) if isinstance(b, int) else b
            if body is not None:
                found.append(body)
            elif isinstance(b, int):
                missing.append(b)
        return join_bodies(found, gzipped), missing

    def ack_soon(self, seq: int) -> None:
        """The batch was delivered whole: it leaves with the next commit's transaction, or on its
        own within ACK_LINGER_S. Until then it is still in the spool: after a crash it is sent
        again, and its `_id`s make Elasticsearch answer 409 (delivered), never index it twice."""
        self._acks.append(seq)
        self._arm_ack_timer()

    def _take_acks(self) -> list[int]:
        acks, self._acks = self._acks, []
        if self._ack_timer is not None:
            self._ack_timer.cancel()
            self._ack_timer = None
        return acks

    def _arm_ack_timer(self) -> None:
        if self._ack_timer is None:
            self._ack_timer = asyncio.get_running_loop().call_later(ACK_LINGER_S, self._linger_over)

    def _linger_over(self) -> None:
        self._ack_timer = None
        if self._acks and (self._ack_flush is None or self._ack_flush.done()):
            self._ack_flush = asyncio.ensure_future(self._write_acks())

    async def _write_acks(self) -> None:
        """The acks no commit has carried, in one transaction of their own."""
        acks = self._take_acks()
        if not acks:
            return
        try:
            await self._call(self._spool.commit_acking, [], {}, [], False, acks)
        except Exception as e:
            self._acks[:0] = acks          # a full disk: tried again after the next linger
            self._arm_ack_timer()
            log.warning("acks not written yet, retrying", extra={"error": str(e)})

    async def flush_acks(self) -> None:
        """Write the acks waiting for a commit now (and wait for a linger write under way)."""
        if self._ack_flush is not None and not self._ack_flush.done():
            await asyncio.shield(self._ack_flush)
        await self._write_acks()

    async def ack(self, seq: int, dead: Sequence[DeadLetter] = ()) -> int:
        """The batch leaves (its dead letters stored with it). Returns the dead-letter total."""
        self.dead_letters = await self._call(self._spool.ack, seq, list(dead))
        return self.dead_letters

    async def replace(self, seq: int, body: bytes, events: int, gzip: bool) -> BatchMeta | None:
        return await self._call(self._spool.replace, seq, body, events, gzip)

    async def forget_checkpoints(self, incarnations: Iterable[str]) -> list[str]:
        return await self._call(self._spool.forget_checkpoints, list(incarnations))

    async def replay_dead_letters(self, make_bodies: Callable[[list[dict[str, Any]]], Bodies],
                                  gzip: bool) -> list[tuple[BatchMeta, bytes]]:
        """Every dead letter back into the queue as new batches (`make_bodies` runs on the spool thread)."""
        out = await self._call(self._spool.replay_dead_letters, make_bodies, gzip)
        self.dead_letters = 0
        return out

    async def purge_dead_letters(self) -> int:
        n = await self._call(self._spool.purge_dead_letters)
        self.dead_letters = 0
        return n

    def room(self) -> dict[str, Any]:
        """Issue 19: the state dir's room (full, free_bytes) and the quarantined records; a statvfs,
        safe from the loop thread (it reads no table)."""
        return self._spool.room()

    async def resize_reserve(self, queue_max_bytes: int | None) -> None:
        """A reload changed queue.max_bytes: the full-disk reserve follows it (on the spool thread:
        it may write or cut a file of up to 2 MiB)."""
        await self._call(_resize_reserve, self._spool, queue_max_bytes)

    async def flush(self) -> None:
        """Returns once every call submitted before it has finished (the worker runs them in order),
        acks waiting for a commit included."""
        await self.flush_acks()
        await self._call(_noop)

    async def close(self) -> None:
        try:
            await self.flush_acks()
        except Exception as e:             # a full disk at exit: they are re-sent (409) at the next start
            log.warning("acks not written at close", extra={"error": str(e)})
        self._ckpt_stop.set()
        self._ckpt_wake.set()
        await asyncio.to_thread(self._ckpt_thread.join)
        await self._call(self._spool.close)
        self._worker.stop(wait=True)       # idle now: it ends at once

    def written_bytes(self) -> int | None:
        """Bytes written to the state dir's spool (queue, checkpoints, dead letters, and the WAL
        copied into the database): everything its two threads wrote, as the kernel counted it. The
        spool thread is the only writer of the queue's SQLite files, the checkpointer the only one
        that copies the WAL back. None where /proc has no per-thread accounting (not Linux)."""
        total = 0
        for tid in (self._worker.native_id, self._ckpt_thread.native_id):
            n = thread_written_bytes(tid)
            if n is None:
                return None
            total += n
        return total

    # ---------------------------------------------------------------- WAL checkpoints

    def _checkpointer(self) -> None:
        """Checkpoint the WAL at most every checkpoint_every_s while the spool is written. A failed
        checkpoint (full disk) is logged once and retried: SQLite leaves the WAL as it was. The one
        statement shipper runs outside diskcache: it copies pages, it reads and writes no table."""
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
                        con = sqlite3.connect(self._spool.db_path, timeout=60, isolation_level=None)
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
