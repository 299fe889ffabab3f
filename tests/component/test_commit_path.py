"""The commit path on a real spool (`queue.spool: always`): records handed to the spool thread while the reader reads on.

The reader may queue WRITES_BEHIND records behind the one being written; they are written in the
order they were read, a failed write stops every record behind it (their checkpoints would skip
its lines), and a batch is one row of the spool, written in one transaction with its checkpoints.
"""

from __future__ import annotations

import asyncio
import dataclasses
import sqlite3
import threading
from pathlib import Path

import pytest

from shipper.codec import decode_body
from shipper.config import QueueConfig
from shipper.model import Checkpoint
from shipper.spool import Spool, rows
from shipper.spool.writer import WRITES_BEHIND
from tests.support.pipeline_rig import Rig

# the path under test here: every draft a record of the spool (the memory path: test_keeper.py)
SPOOLED = QueueConfig(spool="always")


def _cp(inc: str, offset: int) -> Checkpoint:
    return Checkpoint(inc, "/var/log/a.log", 1, 100, 16, "fp", offset)


def test_a_batch_is_one_row_and_its_checkpoints_ride_in_it(tmp_path: Path) -> None:
    """Through diskcache's public API only: a batch is one row (header, metadata, checkpoints,
    body); checkpoints get rows of their own only when an ack would otherwise take them along."""
    s = Spool(str(tmp_path))
    try:
        s.commit([(b"body-one\n", 1), (b"body-two\n", 1)], {"a": (0, 10)}, [_cp("a", 10)], False)
        s.commit([(b"body-three\n", 1)], {"a": (10, 20)}, [_cp("a", 20)], True)
        assert len(s.cache) == 3            # 3 batches, no checkpoint row yet: diskcache's own count
        assert s.read(1) == b"body-one\n" and decode_body(s.read(3) or b"", True) == b"body-three\n"
        s.ack(1)
        s.ack(2)                            # carries a=10, but batch 3 carries a newer one: one delete
        assert len(s.cache) == 1 and s.cache.get(1) is None
        s.ack(3)                            # the newest checkpoint of "a" moves to its own row
        assert list(s.cache.iterkeys()) == ["c:a"] and rows.unpack_checkpoint(s.cache.get("c:a"))["offset"] == 20
        # many files' checkpoints in one commit: still one row
        many = [_cp(f"inc{i}", i) for i in range(300)]
        s.commit([(b"body-four\n", 1)], {}, many, False)
        assert len(s.cache) == 2
        s.close()
        s = Spool(str(tmp_path))
        assert sorted(s.pending) == [4] and s.next_seq == 5
        assert s.checkpoints["a"].offset == 20 and len(s.checkpoints) == len(many) + 1
        assert s.checkpoints["inc7"].offset == 7
    finally:
        s.close()


def test_a_failing_row_writes_nothing_of_the_commit(tmp_path: Path) -> None:
    s = Spool(str(tmp_path))
    try:
        s.commit([(b"x\n", 1)], {"a": (0, 5)}, [_cp("a", 5)], False)
        # test-only fault injection: the second batch of the next commit is refused
        s.cache._sql("CREATE TRIGGER refuse BEFORE INSERT ON Cache WHEN NEW.key = 3"
                     " BEGIN SELECT RAISE(ABORT, 'refused'); END")
        with pytest.raises(sqlite3.IntegrityError):
            s.commit([(b"y\n", 1), (b"z\n", 1)], {"a": (5, 9), "b": (0, 3)}, [_cp("a", 9), _cp("b", 3)], False)
        assert sorted(s.pending) == [1] and s.checkpoints["a"].offset == 5 and "b" not in s.checkpoints
        s.close()
        s = Spool(str(tmp_path))
        assert sorted(s.pending) == [1] and s.checkpoints["a"].offset == 5 and "b" not in s.checkpoints
    finally:
        s.close()


def test_a_commit_that_fails_at_commit_leaves_the_spool_writable(tmp_path: Path) -> None:
    """A full disk fails the COMMIT (the WAL is written then), and SQLite may leave the transaction
    open, which diskcache does not roll back: every later write failed to begin. A deferred
    foreign key fails a COMMIT the same way (and keeps the transaction open, by SQLite's rule)."""
    s = Spool(str(tmp_path))
    try:
        s.commit([(b"x\n", 1)], {"a": (0, 5)}, [_cp("a", 5)], False)
        s.cache._sql("CREATE TABLE IF NOT EXISTS Parent(id INTEGER PRIMARY KEY)")
        s.cache._sql("CREATE TABLE IF NOT EXISTS Child(p INTEGER REFERENCES Parent(id) DEFERRABLE INITIALLY DEFERRED)")
        s.cache._sql("CREATE TRIGGER dangle AFTER INSERT ON Cache WHEN NEW.key = 2 BEGIN INSERT INTO Child VALUES (7); END")
        s.cache.reset("sqlite_foreign_keys", 1, update=False)      # this connection only
        with pytest.raises(sqlite3.IntegrityError, match="FOREIGN KEY"):
            s.commit([(b"y\n", 1), (b"w\n", 1)], {"a": (5, 9)}, [_cp("a", 9)], False)
        assert sorted(s.pending) == [1]
        (meta, _), = s.commit([(b"z\n", 1)], {"a": (5, 9)}, [_cp("a", 9)], False)    # a new connection
        assert meta.seq == 2
        s.close()
        s = Spool(str(tmp_path))
        assert sorted(s.pending) == [1, 2] and s.read(2) == b"z\n" and s.checkpoints["a"].offset == 9
    finally:
        s.close()


def _write_lines(path: Path, start: int, n: int) -> None:
    with open(path, "ab") as f:
        f.write(b"".join(b"line %d\n" % i for i in range(start, start + n)))


async def test_records_queue_behind_a_busy_spool_thread_in_read_order(tmp_path: Path) -> None:
    log = tmp_path / "app.log"
    rig = Rig(tmp_path, [str(tmp_path / "*.log")], queue=SPOOLED)
    p = rig.p
    busy, release = threading.Event(), threading.Event()

    def occupy() -> None:
        busy.set()
        release.wait(10)

    try:
        _write_lines(log, 0, 10)
        await p.rescan()
        await p.open_waiting()
        blocker = asyncio.ensure_future(rig.spool._call(occupy))
        await asyncio.to_thread(busy.wait, 10)
        for k in range(WRITES_BEHIND):
            if k:
                _write_lines(log, 10 * k, 10)
            assert p.read_round()
            await asyncio.wait_for(p.commit(wait=False), 2)    # handed over without waiting for the disk
        assert p.committing and len(p.writer.writing()) == WRITES_BEHIND
        _write_lines(log, 100, 5)
        assert p.read_round()
        third = asyncio.ensure_future(p.commit(wait=False))
        for _ in range(5):
            await asyncio.sleep(0)
        assert not third.done()             # beyond WRITES_BEHIND the reader waits
        # status still counts what is handed over but not written as not shipped
        (row,) = p.file_status()
        assert row["offset"] == 0 and row["queued_offset"] == log.stat().st_size
        release.set()
        await blocker
        await asyncio.wait_for(third, 5)
        await p.commit()
        assert not p.committing
        seqs = sorted(p.outbox.pending)
        assert len(seqs) == WRITES_BEHIND + 1 and seqs == list(range(seqs[0], seqs[0] + len(seqs)))
        await rig.collect()
        expected = [f"line {i}" for k in range(WRITES_BEHIND) for i in range(10 * k, 10 * k + 10)]
        assert sorted(rig.messages()) == sorted(expected + [f"line {i}" for i in range(100, 105)])
        (cp,) = await rig.checkpoints()
        assert cp.offset == log.stat().st_size
    finally:
        release.set()
        await rig.close()


async def test_a_failed_write_stops_the_records_behind_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log = tmp_path / "app.log"
    rig = Rig(tmp_path, [str(tmp_path / "*.log")], queue=SPOOLED)
    p = rig.p
    busy, release = threading.Event(), threading.Event()
    real = rig.spool._spool.commit
    calls: list[int] = []

    def failing_first(*args):
        calls.append(sum(n for _, n in (args[0]() if callable(args[0]) else args[0])))
        if len(calls) == 1:
            busy.set()
            release.wait(10)
            raise OSError(5, "Input/output error")
        return real(*args)

    monkeypatch.setattr(rig.spool._spool, "commit", failing_first)
    try:
        _write_lines(log, 0, 10)
        await p.rescan()
        await p.open_waiting()
        assert p.read_round()
        await p.commit(wait=False)
        await asyncio.to_thread(busy.wait, 10)
        _write_lines(log, 10, 10)
        assert p.read_round()
        await p.commit(wait=False)          # queued behind the write that is about to fail
        release.set()
        with pytest.raises(OSError):
            await p.commit()
        assert calls == [10]                # the second record never reached the spool
        contents = await rig.spool.contents()
        assert contents.pending == ()
        assert all(cp.offset == 0 for cp in contents.checkpoints)
    finally:
        release.set()
        await rig.close()


@pytest.mark.parametrize("interval_s", [0.02, 0.0])
async def test_caught_up_a_partial_record_leaves_at_most_once_per_flush_min_interval(
        tmp_path: Path, interval_s: float) -> None:
    """A writer appending line by line: the first line goes at once, the next ones wait for the
    end of flush_min_interval after it (then go together), never for flush_interval."""
    log = tmp_path / "app.log"
    rig = Rig(tmp_path, [str(tmp_path / "*.log")], queue=SPOOLED)
    rig.p.pipeline.limits = dataclasses.replace(rig.p.pipeline.limits, flush_min_interval_s=interval_s)
    p = rig.p
    try:
        _write_lines(log, 0, 1)
        await p.rescan()
        await p.open_waiting()
        assert p.read_round() and p.should_commit()       # nothing left recently: at once
        await p.commit()
        await rig.collect()
        _write_lines(log, 1, 1)
        assert p.read_round()
        assert p.should_commit() is (interval_s == 0)     # a record left just now
        rig.clock.advance(interval_s / 2)
        _write_lines(log, 2, 1)
        assert p.read_round()
        assert p.should_commit() is (interval_s == 0)
        rig.clock.advance(interval_s / 2 + 1e-6)
        assert p.should_commit()                           # the interval is over: both lines go together
        await p.commit()
        await rig.collect()
        assert rig.messages() == ["line 0", "line 1", "line 2"]
        assert p.cfg.output.flush_interval_s > 10 * max(interval_s, 0.01)   # not the flush_interval timer
    finally:
        await rig.close()
