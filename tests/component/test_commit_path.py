"""The commit path on a real spool: records handed to the spool thread while the reader reads on.

The reader may queue WRITES_BEHIND records behind the one being written; they are written in the
order they were read, a failed write stops every record behind it (their checkpoints would skip
its lines), and the spool's single-statement rows read back through diskcache like `set`'s.
"""

from __future__ import annotations

import asyncio
import dataclasses
import sqlite3
import threading
from pathlib import Path

import pytest

from shipper.model import Checkpoint
from shipper.codec import decode_body
from shipper.spool.store import ROWS_PER_STATEMENT, Spool
from shipper.spool.writer import WRITES_BEHIND
from tests.support.pipeline_rig import Rig


def _cp(inc: str, offset: int) -> Checkpoint:
    return Checkpoint(inc, "/var/log/a.log", 1, 100, 16, "fp", offset)


def test_spool_rows_read_back_through_diskcache_like_set(tmp_path: Path) -> None:
    s = Spool(str(tmp_path))
    try:
        s.commit([(b"body-one\n", 1), (b"body-two\n", 1)], {"a": (0, 10)}, [_cp("a", 10)], False)
        s.commit([(b"body-three\n", 1)], {"a": (10, 20)}, [_cp("a", 20)], True)   # the checkpoint row is updated
        assert len(s.cache) == 7            # 3 bodies + 3 metas + 1 checkpoint: diskcache's own count
        assert s.cache.get(1) == b"body-one\n"
        assert decode_body(s.cache.get(3), True) == b"body-three\n"
        assert s.cache.get("m:2")["covers"] == {"a": (0, 10)}
        assert s.cache.get("c:a")["offset"] == 20
        s.ack(1)
        s.ack(2)
        assert len(s.cache) == 3 and s.cache.get(1) is None and s.cache.get("m:1") is None
        # many files' checkpoints in one commit: several statements, one transaction
        many = [_cp(f"inc{i}", i) for i in range(ROWS_PER_STATEMENT * 2 + 5)]
        s.commit([(b"body-four\n", 1)], {}, many, False)
        s.close()
        s = Spool(str(tmp_path))
        assert sorted(s.pending) == [3, 4] and s.next_seq == 5
        assert s.checkpoints["a"].offset == 20 and len(s.checkpoints) == len(many) + 1
        assert s.checkpoints["inc7"].offset == 7
        assert len(s.cache) == 5 + len(many)
    finally:
        s.close()


def test_a_failing_statement_writes_nothing_of_the_record(tmp_path: Path) -> None:
    s = Spool(str(tmp_path))
    try:
        s.commit([(b"x\n", 1)], {"a": (0, 5)}, [_cp("a", 5)], False)
        s.cache._sql("CREATE TRIGGER refuse BEFORE INSERT ON Cache WHEN NEW.key = 'c:b'"
                     " BEGIN SELECT RAISE(ABORT, 'refused'); END")
        with pytest.raises(sqlite3.IntegrityError):
            s.commit([(b"y\n", 1)], {"a": (5, 9), "b": (0, 3)}, [_cp("a", 9), _cp("b", 3)], False)
        s.close()
        s = Spool(str(tmp_path))
        assert sorted(s.pending) == [1] and s.checkpoints["a"].offset == 5 and "b" not in s.checkpoints
    finally:
        s.close()


def _write_lines(path: Path, start: int, n: int) -> None:
    with open(path, "ab") as f:
        f.write(b"".join(b"line %d\n" % i for i in range(start, start + n)))


async def test_records_queue_behind_a_busy_spool_thread_in_read_order(tmp_path: Path) -> None:
    log = tmp_path / "app.log"
    rig = Rig(tmp_path, [str(tmp_path / "*.log")])
    p = rig.p
    busy, release = threading.Event(), threading.Event()

    def occupy() -> None:
        busy.set()
        release.wait(10)

    try:
        _write_lines(log, 0, 10)
        await p.rescan()
        await p.open_waiting()
        blocker = asyncio.ensure_future(rig.spool.call(occupy))
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
    rig = Rig(tmp_path, [str(tmp_path / "*.log")])
    p = rig.p
    busy, release = threading.Event(), threading.Event()
    real = rig.spool.spool.commit
    calls: list[int] = []

    def failing_first(*args):  # type: ignore[no-untyped-def]
        calls.append(sum(n for _, n in args[0]))
        if len(calls) == 1:
            busy.set()
            release.wait(10)
            raise OSError(5, "Input/output error")
        return real(*args)

    monkeypatch.setattr(rig.spool.spool, "commit", failing_first)
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
    rig = Rig(tmp_path, [str(tmp_path / "*.log")])
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
