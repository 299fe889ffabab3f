"""AsyncSpool's API on a real state dir: every method, calls finished in the order they were made
(`flush` waits for all before it), a full disk raised unchanged and leaving nothing behind, and
`contents()` a snapshot of everything submitted before it.
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
import threading
from pathlib import Path
from typing import Any

import pytest

from shipper.codec import decode_body
from shipper.errors import SpoolFullError
from shipper.model import BatchMeta, Checkpoint, DeadLetter
from shipper.spool import AsyncSpool, Spool, SpoolContents


def cp(inc: str, offset: int, **kw: Any) -> Checkpoint:
    return Checkpoint(inc, f"/var/log/{inc}.log", 1, 100, 16, "fp", offset, **kw)


def body(n: int, tag: str = "x") -> bytes:
    return b"".join(b'{"create":{"_index":"i","_id":"%s-%d"}}\n{"n":%d}\n' % (tag.encode(), i, i) for i in range(n))


def dead(doc_id: str) -> DeadLetter:
    return DeadLetter("logs", "mapper_parsing_exception: x", 400, b'{"n":"bad"}', 1000.0, doc_id)


def make_bodies(items: list[dict[str, Any]]) -> list[tuple[bytes, int]]:
    return [(b"".join(b'{"create":{"_index":"%s","_id":"%s"}}\n%s\n' % (d["index"].encode(), d["id"].encode(),
                                                                        d["document"]) for d in items), len(items))]


async def test_every_method_round_trips(tmp_path: Path) -> None:
    a = await AsyncSpool.open(str(tmp_path))
    try:
        assert await a.contents() == SpoolContents((), (), 0) and a.dead_letters == 0
        [(m1, st1)] = await a.commit([(body(3), 3)], {"a": (0, 300)}, [cp("a", 300)], True)
        assert isinstance(m1, BatchMeta) and m1.seq == 1 and m1.events == 3 and m1.gzipped
        assert decode_body(await a.read(1) or b"", True) == body(3) == decode_body(st1, True)
        assert await a.read(77) is None

        threads: list[int] = []

        def maker() -> list[tuple[bytes, int]]:      # runs on the spool thread, inside the commit
            threads.append(threading.get_ident())
            return [(body(2, "m"), 2), (body(1, "n"), 1)]

        made = await a.commit(maker, {"b": (0, 90)}, [cp("b", 90)], False)
        assert [(m.seq, m.events, m.covers) for m, _ in made] == [(2, 2, {"b": (0, 90)}), (3, 1, {"b": (0, 90)})]
        assert threads and threads[0] != threading.get_ident()
        assert await a.commit([], {"c": (0, 5)}, [cp("c", 5, finished=True)], False) == []

        new = await a.replace(1, body(1, "rest"), 1, True)
        assert new is not None and new.events == 1 and new.covers == {"a": (0, 300)}
        assert await a.replace(99, b"", 0, True) is None

        assert await a.ack(2) == 0
        assert await a.ack(3, [dead("n-0"), dead("n-1")]) == 2 and a.dead_letters == 2
        assert await a.forget_checkpoints(["a", "c", "nope"]) == ["c"]     # "a" is still covered by batch 1

        c = await a.contents()
        assert [m.seq for m in c.pending] == [1] and c.pending[0] == new
        assert {x.incarnation: x.offset for x in c.checkpoints} == {"a": 300, "b": 90}
        assert c.dead_letters == 2 and c.queued_events == 1 and c.queued_bytes == new.stored_bytes
        assert c.shipped_offsets() == {"a": 0, "b": 90}

        replayed = await a.replay_dead_letters(make_bodies, gzip=False)
        assert [(m.events, m.covers) for m, _ in replayed] == [(2, {})] and a.dead_letters == 0
        assert b'"_id":"n-1"' in (await a.read(replayed[0][0].seq) or b"")
        await a.ack(replayed[0][0].seq, [dead("z")])
        assert a.dead_letters == 1
        assert await a.purge_dead_letters() == 1 and a.dead_letters == 0
        assert await a.replay_dead_letters(make_bodies, gzip=False) == []
        await a.flush()
    finally:
        await a.close()
    again = Spool(str(tmp_path))
    try:
        assert list(again.pending) == [1] and again.dead_letters == 0
        assert {inc: x.offset for inc, x in again.checkpoints.items()} == {"a": 300, "b": 90}
    finally:
        again.close()


async def test_calls_finish_in_the_order_they_were_made_and_flush_waits_for_them(tmp_path: Path) -> None:
    a = await AsyncSpool.open(str(tmp_path))
    busy, release = threading.Event(), threading.Event()

    def occupy() -> None:
        busy.set()
        release.wait(10)

    try:
        blocker = asyncio.ensure_future(a._call(occupy))
        await asyncio.to_thread(busy.wait, 10)
        commits = [asyncio.ensure_future(a.commit([(body(1, str(i)), 1)], {"a": (i, i + 1)}, [cp("a", i + 1)], False))
                   for i in range(5)]
        acks = [asyncio.ensure_future(a.ack(seq)) for seq in (1, 2)]
        snapshot = asyncio.ensure_future(a.contents())
        flushed = asyncio.ensure_future(a.flush())
        for _ in range(10):
            await asyncio.sleep(0)
        assert not flushed.done() and not any(t.done() for t in commits + acks)
        release.set()
        await flushed
        assert blocker.done() and all(t.done() for t in commits + acks + [snapshot])
        assert [t.result()[0][0].seq for t in commits] == [1, 2, 3, 4, 5]
        c = snapshot.result()                      # made after the acks, before the flush
        assert [m.seq for m in c.pending] == [3, 4, 5] and c.checkpoints[0].offset == 5
    finally:
        release.set()
        await a.close()


def _fill(spool: Spool) -> None:
    """This connection may not grow the database any more: writes that need a page fail with
    SQLITE_FULL, as on a full disk (test-only, per connection)."""
    con = sqlite3.connect(spool.db_path)
    try:
        pages = con.execute("PRAGMA page_count").fetchone()[0]
    finally:
        con.close()
    spool.cache.reset("sqlite_max_page_count", pages, update=False)


def _unfill(spool: Spool) -> None:
    spool.cache.reset("sqlite_max_page_count", 1073741823, update=False)


async def test_a_full_disk_raises_spool_full_and_writes_nothing(tmp_path: Path) -> None:
    a = await AsyncSpool.open(str(tmp_path))
    try:
        [(first, _)] = await a.commit([(body(1), 1)], {"a": (0, 100)}, [cp("a", 100)], False)
        before = await a.contents()
        await a._call(_fill, a._spool)
        with pytest.raises(SpoolFullError, match="state_dir is full"):
            await a.commit([(os.urandom(300_000), 1)], {"a": (100, 200)}, [cp("a", 200)], False)
        with pytest.raises(SpoolFullError):
            await a.ack(first.seq, [DeadLetter("logs", "r", 400, os.urandom(200_000).hex().encode(), 0.0, "id")])
        assert await a.contents() == before and a.dead_letters == 0
        assert await a.ack(first.seq) == 0          # frees pages: needs none, even to give "a" its own row
        assert {c.incarnation: c.offset for c in (await a.contents()).checkpoints} == {"a": 100}
        await a._call(_unfill, a._spool)
        [(second, _)] = await a.commit([(os.urandom(300_000), 1)], {"a": (100, 200)}, [cp("a", 200)], False)
        assert [m.seq for m in (await a.contents()).pending] == [second.seq]
    finally:
        await a.close()
    again = Spool(str(tmp_path))
    try:
        assert list(again.pending) == [second.seq] and again.checkpoints["a"].offset == 200
    finally:
        again.close()


async def test_contents_is_a_snapshot_the_caller_may_keep(tmp_path: Path) -> None:
    a = await AsyncSpool.open(str(tmp_path))
    try:
        await a.commit([(body(1), 1)], {"a": (0, 100)}, [cp("a", 100)], False)
        snap = await a.contents()
        snap.checkpoints[0].offset = 12345         # the caller's copy
        await a.commit([(body(1), 1)], {"a": (100, 200)}, [cp("a", 200)], False)
        await a.ack(1)
        assert [m.seq for m in snap.pending] == [1] and snap.checkpoints[0].offset == 12345
        now = await a.contents()
        assert [m.seq for m in now.pending] == [2] and now.checkpoints[0].offset == 200
        with pytest.raises(AttributeError):
            now.pending[0].events = 5  # type: ignore[misc]   # BatchMeta is frozen
    finally:
        await a.close()


async def test_open_failure_leaves_no_thread(tmp_path: Path) -> None:
    (tmp_path / "spool").write_text("not a directory")
    before = {t.name for t in threading.enumerate()}
    with pytest.raises(OSError):
        await AsyncSpool.open(str(tmp_path))
    assert not [t for t in threading.enumerate() if t.name not in before and t.name.startswith("spool")]


# ---------------------------------------------------------------- the spool thread

async def test_spool_thread_runs_calls_in_order_and_answers_each() -> None:
    from shipper.spool.aio import SpoolThread
    worker = SpoolThread("spool-test")
    seen: list[int] = []
    threads: set[int] = set()

    def step(i: int) -> int:
        seen.append(i)
        threads.add(threading.get_ident())
        return i * i

    try:
        futs = [worker.call(step, i) for i in range(200)]
        assert await asyncio.gather(*futs) == [i * i for i in range(200)]
        assert seen == list(range(200))
        assert len(threads) == 1 and threading.get_ident() not in threads
    finally:
        worker.stop()
    assert not worker._thread.is_alive()


async def test_spool_thread_hands_back_exceptions_and_goes_on() -> None:
    from shipper.spool.aio import SpoolThread
    worker = SpoolThread("spool-test")

    def boom() -> None:
        raise SpoolFullError("database or disk is full")

    try:
        with pytest.raises(SpoolFullError, match="disk is full"):
            await worker.call(boom)
        assert await worker.call(lambda: 7) == 7
    finally:
        worker.stop()


async def test_spool_thread_skips_a_call_cancelled_before_its_turn() -> None:
    from shipper.spool.aio import SpoolThread
    worker = SpoolThread("spool-test")
    gate = threading.Event()
    ran: list[str] = []
    try:
        first = worker.call(gate.wait, 10)        # holds the thread until the gate opens
        second = worker.call(ran.append, "second")
        third = worker.call(ran.append, "third")
        second.cancel()
        gate.set()
        assert await first is True
        await third
        assert ran == ["third"] and second.cancelled()
    finally:
        worker.stop()


def test_spool_thread_answer_after_the_loop_closed_is_dropped() -> None:
    """A call still running when its loop closes ends without an error on the thread, and the
    thread takes the next call."""
    from shipper.spool.aio import SpoolThread
    worker = SpoolThread("spool-test")
    gate, done = threading.Event(), threading.Event()
    errors: list[BaseException] = []
    old_hook = threading.excepthook
    threading.excepthook = lambda a: errors.append(a.exc_value) if a.exc_value is not None else None

    async def start() -> None:
        worker.call(gate.wait, 10)

    try:
        asyncio.run(start())          # the loop is closed once start() returns: the call still waits
        gate.set()

        async def after() -> int:
            v = await worker.call(lambda: 5)
            done.set()
            return v

        assert asyncio.run(after()) == 5 and done.is_set()
        assert errors == []
    finally:
        threading.excepthook = old_hook
        worker.stop()


async def test_written_bytes_counts_what_the_spool_threads_wrote(tmp_path: Path) -> None:
    """shipper_state_written_bytes_total: the spool threads' write(2) bytes, per the kernel. A 1 MiB
    body (stored plain) is at least 1 MiB more; a checkpoint-only write is a few SQLite pages; the
    process as a whole (its /proc/self/io) wrote at least as much meanwhile."""

    def process_wchar() -> int:
        for line in Path("/proc/self/io").read_text().splitlines():
            if line.startswith("wchar:"):
                return int(line.split()[1])
        raise AssertionError("no wchar in /proc/self/io")

    a = await AsyncSpool.open(str(tmp_path))
    try:
        await a.flush()
        w0, p0 = a.written_bytes(), process_wchar()
        assert w0 is not None
        big = os.urandom(1 << 20)
        await a.commit([(big, 1)], {"a": (0, len(big))}, [cp("a", len(big))], False)
        w1, p1 = a.written_bytes(), process_wchar()
        assert w1 is not None and w1 - w0 >= len(big)
        assert p1 - p0 >= w1 - w0
        await a.commit([], {}, [cp("a", len(big) + 10)], False)
        w2 = a.written_bytes()
        assert w2 is not None and 0 < w2 - w1 < 64 * 1024      # a checkpoint row: a few pages, not the body again
    finally:
        await a.close()


async def test_a_spool_written_without_pause_keeps_its_wal_bounded(tmp_path: Path) -> None:
    """A writer that never pauses kept a passive checkpoint from ever restarting the WAL: it grew by
    every byte spooled (13 MB in a 2 s drain of a 1 MiB queue), past SPEC's bound of the state dir
    (queue.max_bytes plus 8 MiB). Past WAL_MAX_BYTES it is checkpointed and truncated at once."""
    from shipper.spool.database import WAL_MAX_BYTES
    a = await AsyncSpool.open(str(tmp_path), queue_max_bytes=1 << 20)
    wal = tmp_path / "spool" / "cache.db-wal"
    peak = 0
    try:
        blob = os.urandom(96 * 1024).hex().encode()          # gzip cannot shrink it: ~190 KiB a batch
        for i in range(120):                                 # ~23 MB through a queue that stays small
            [(m, _)] = await a.commit([(b'{"create":{}}\n{"b":"%s"}\n' % blob, 1)], {"a": (i, i + 1)},
                                      [cp("a", i + 1)], True)
            await a.ack(m.seq)
            peak = max(peak, wal.stat().st_size if wal.exists() else 0)
        # the whole burst went through a WAL of a few MiB (a look every WAL_MAX_BYTES / 4 written, and
        # after the next write when a checkpoint refused)
        assert peak <= WAL_MAX_BYTES + WAL_MAX_BYTES // 2 + 256 * 1024, peak
    finally:
        await a.close()
