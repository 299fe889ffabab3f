"""A full disk under state_dir: writes fail as a whole (SQLite rolls back), the pipeline waits and
logs once, and carries on when space is back. The disk is made "full" with SQLite's
max_page_count, which fails exactly like ENOSPC does (SQLITE_FULL: "database or disk is full")."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from shipper.errors import SpoolFullError
from shipper.model import Checkpoint, DeadLetter
from shipper.ship import batching
from shipper.ship.outbox import Outbox
from shipper.spool import AsyncSpool, Spool
from shipper.spool.keeper import Keeper
from shipper.spool.writer import DiskWait, DraftWriter
from tests.support.pipeline_rig import FakeClock, RecordingEvents
from tests.support.wait import async_wait_until


def open_spool_of(spool: Spool) -> AsyncSpool:
    return AsyncSpool(spool)


def _fill(spool: Spool, spare_pages: int = 4) -> None:
    pages = spool.cache._sql("PRAGMA page_count").fetchone()[0]
    spool.cache._sql(f"PRAGMA max_page_count = {pages + spare_pages}")


def _unfill(spool: Spool) -> None:
    spool.cache._sql("PRAGMA max_page_count = 1073741823")


def _writer(aspool: AsyncSpool) -> tuple[FakeClock, RecordingEvents, Outbox, DraftWriter]:
    """A draft writer on `aspool` under a fake clock, handing its batches to an outbox."""
    clock = FakeClock()
    events = RecordingEvents()
    outbox = Outbox(1 << 30, 1, events)
    disk = DiskWait(events, clock)
    keeper = Keeper("always", 1.0, outbox, aspool, disk, events, clock)       # every draft into the spool
    writer = DraftWriter(aspool, batching.group, outbox.add, disk, clock, max_events=2000,
                         max_bytes=5 << 20, gzip=False, wake=asyncio.Event(), keeper=keeper)
    keeper.writer = writer
    return clock, events, outbox, writer


def _cp(offset: int) -> Checkpoint:
    return Checkpoint("inc1", "/var/log/app.log", 1, 2, 0, "", offset)


def test_a_full_disk_changes_nothing_and_the_spool_reopens_intact(tmp_path: Path) -> None:
    spool = Spool(str(tmp_path))
    [(first, _)] = spool.commit([(b"a" * 100, 1)], {"inc1": (0, 100)}, [_cp(100)], False)
    _fill(spool)
    with pytest.raises(SpoolFullError, match="full"):
        for _ in range(20):
            spool.commit([(os.urandom(60_000), 1)], {"inc1": (100, 200)}, [_cp(200)], False)
    kept = dict(spool.pending)
    with pytest.raises(SpoolFullError):
        spool.commit([(os.urandom(200_000), 1)], {"inc1": (200, 300)}, [_cp(300)], False)
    assert spool.pending == kept
    assert spool.checkpoints["inc1"].offset in (100, 200)        # never an offset without its record
    dead = [DeadLetter("logs", "mapper_parsing_exception: x", 400, os.urandom(300_000).hex().encode(), 0.0, "id1")]
    with pytest.raises(SpoolFullError):
        spool.ack(first.seq, dead)                             # record and dead letter go together or not at all
    assert first.seq in spool.pending and spool.dead_letters == 0
    _unfill(spool)
    spool.ack(first.seq, dead)
    assert first.seq not in spool.pending and spool.dead_letters == 1
    cp_offset = spool.checkpoints["inc1"].offset
    pending = sorted(spool.pending)
    spool.close()
    again = Spool(str(tmp_path))
    try:
        assert sorted(again.pending) == pending
        assert again.checkpoints["inc1"].offset == cp_offset
        assert again.dead_letters == 1
        for seq in pending:
            assert again.read(seq) is not None
    finally:
        again.close()


async def test_the_pipeline_waits_out_a_full_disk_logging_once(tmp_path: Path) -> None:
    spool = Spool(str(tmp_path))
    aspool = open_spool_of(spool)
    clock = FakeClock()
    events = RecordingEvents()
    disk = DiskWait(events, clock)
    outbox = Outbox(1 << 30, 1, events)
    try:
        [(meta, _)] = await aspool._call(spool.commit, [(b"x" * 100, 1)], {}, [], False)
        outbox.restore([meta])
        await aspool._call(_fill, spool, 0)
        dead = [DeadLetter("logs", "r", 400, os.urandom(200_000).hex().encode(), 0.0, "id")]
        ack = asyncio.create_task(disk.run(lambda: aspool.ack(meta.seq, dead)))
        await async_wait_until(lambda: len(clock.slept) >= 5,
                               lambda: f"five backoff sleeps on the full disk (slept {clock.slept})")
        assert not ack.done()
        assert [n for n, _ in events.seen].count("spool_error") == 1
        await aspool._call(_unfill, spool)
        assert await asyncio.wait_for(ack, 10) == 1          # the dead-letter count the spool answers
        outbox.acked(meta, 0)
        assert outbox.queue_events == 0 and spool.dead_letters == 1
        assert ("info", ("spool writable again",)) in [(n, a[:1]) for n, a in events.seen]
    finally:
        await aspool.close()


async def test_a_full_disk_does_not_hold_the_stop_past_shutdown_timeout(tmp_path: Path) -> None:
    """SIGTERM with a full disk: the final commit gives up after shutdown_timeout; its lines moved
    no checkpoint, so they are read again at the next start (nothing lost, nothing queued twice)."""
    spool = Spool(str(tmp_path))
    aspool = open_spool_of(spool)
    clock, events, outbox, writer = _writer(aspool)
    try:
        d = writer.draft
        d.parts.append(b'{"create":{"_index":"x","_id":"i-0"}}\n' + b'{"m":"' + os.urandom(100_000).hex().encode() + b'"}\n')
        d.events, d.nbytes = 1, len(d.parts[0])
        d.checkpoints["inc1"] = _cp(100)
        d.covers["inc1"] = [0, 100]
        await aspool._call(_fill, spool, 0)
        writer.disk.give_up_at = clock.monotonic() + 5.0     # what stopping sets: shutdown_timeout
        with pytest.raises(SpoolFullError):
            await asyncio.wait_for(writer.commit(), 10)      # the fake clock advances 1 s per retry
        assert 4.0 <= sum(clock.slept) <= 7.0
        assert "inc1" not in spool.checkpoints and not spool.pending
    finally:
        await aspool._call(_unfill, spool)
        await aspool.close()


async def test_a_draft_handed_over_behind_one_that_meets_a_full_disk_is_written_after_it(tmp_path: Path) -> None:
    """Drafts go to the spool thread's queue when they are handed over, not when the loop has taken
    the answer of the one before (issue 14). One that meets a full disk must still stop the one
    queued behind it: that one is skipped on the thread (nothing written, its checkpoint would skip
    the first one's lines), and both are written, in order, once there is room again."""
    spool = Spool(str(tmp_path))
    aspool = open_spool_of(spool)
    clock, events, outbox, writer = _writer(aspool)
    real_commit = spool.commit
    written: list[int] = []

    def commit(bodies, covers, cps, gzip):
        out = real_commit(bodies, covers, cps, gzip)
        written.extend(cp.offset for cp in cps)
        return out

    spool.commit = commit  # type: ignore[method-assign]

    def fill_draft(start: int, end: int, size: int) -> None:
        d = writer.draft
        d.parts.append(b'{"create":{"_index":"x","_id":"i-%d"}}\n{"m":"%s"}\n' % (start, os.urandom(size).hex().encode()))
        d.events, d.nbytes = 1, len(d.parts[0])
        d.checkpoints["inc1"] = _cp(end)
        d.covers["inc1"] = [start, end]

    try:
        await aspool._call(_fill, spool, 0)
        fill_draft(0, 100, 100_000)
        await writer.commit(wait=False)                      # meets the full disk
        fill_draft(100, 200, 10)
        await writer.commit(wait=False)                      # queued behind it on the spool thread
        assert len(writer.writing()) == 2
        await events.wait_for("spool_error")                 # the first one failed, and is retried
        for _ in range(3):
            await asyncio.sleep(0.01)
        assert written == [] and not spool.pending           # the second one was not written before it
        await aspool._call(_unfill, spool)
        await asyncio.wait_for(writer.commit(), 10)          # both written now
        assert written == [100, 200]
        assert [m.covers["inc1"] for m in spool.pending.values()] == [(0, 100), (100, 200)]
        assert spool.checkpoints["inc1"].offset == 200
        assert list(outbox.pending) == sorted(spool.pending)
    finally:
        await aspool._call(_unfill, spool)
        await aspool.close()
