"""Acks folded into the next record write (issue 14): `Spool.commit_acking` drops delivered
batches in the same transaction that stores the next ones, exactly as `ack` would (a checkpoint a
dropped batch carries moves to its own row unless the new batch carries a newer one), and
`AsyncSpool.ack_soon` hands a plain ack to the next commit, or writes it on its own after the
linger, and always before `contents()`, `flush()` and `close()` return. Real state dirs; what
a reopened spool reads is the oracle.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

from shipper.model import Checkpoint
from shipper.spool import AsyncSpool, Spool
from shipper.spool import aio as aio_mod
from tests.support.fake_clock import FakeClock


def cp(inc: str, offset: int, **kw: Any) -> Checkpoint:
    return Checkpoint(inc, f"/var/log/{inc}.log", 1, 100, 16, "fp", offset, **kw)


def body(n: int, tag: str = "x") -> bytes:
    return b"".join(b'{"create":{"_index":"i","_id":"%s-%d"}}\n{"n":%d}\n' % (tag.encode(), i, i) for i in range(n))


def reopened(path: Path) -> tuple[list[int], dict[str, int]]:
    s = Spool(str(path))
    try:
        c = s.contents()
        return [m.seq for m in c.pending], {k.incarnation: k.offset for k in c.checkpoints}
    finally:
        s.close()


def test_commit_acking_drops_the_acked_and_stores_the_new_in_one_write(tmp_path: Path) -> None:
    s = Spool(str(tmp_path))
    try:
        s.commit([(body(2), 2)], {"a": (0, 20)}, [cp("a", 20)], False)
        s.commit([(body(2, "b"), 2)], {"b": (0, 30)}, [cp("b", 30)], False)
        # 1 carries a=20 and no newer batch does: it moves to its own row; 2 carries b=30, the new
        # batch carries b=60, so no row for b is written (the new batch holds it)
        out = s.commit_acking([(body(3, "c"), 3)], {"b": (30, 60)}, [cp("b", 60)], False, [1, 2, 2, 99])
        assert [m.seq for m, _ in out] == [3]
        assert sorted(s.pending) == [3]
    finally:
        s.close()
    assert reopened(tmp_path) == ([3], {"a": 20, "b": 60})


def test_commit_acking_with_acks_only_and_with_checkpoints_only(tmp_path: Path) -> None:
    s = Spool(str(tmp_path))
    try:
        s.commit([(body(1), 1)], {"a": (0, 10)}, [cp("a", 10)], True)
        s.commit([(body(1), 1)], {"a": (10, 20)}, [cp("a", 20)], True)
        assert s.commit_acking([], {}, [], False, [1]) == []
        assert s.commit_acking([], {"c": (0, 5)}, [cp("c", 5, finished=True)], False, [2]) == []
        assert not s.pending
        assert s.commit_acking([], {}, [], False, [1, 2]) == []        # nothing left to do
    finally:
        s.close()
    assert reopened(tmp_path) == ([], {"a": 20, "c": 5})


async def test_ack_soon_rides_on_the_next_commit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    a = await AsyncSpool.open(str(tmp_path))
    calls: list[list[int]] = []
    real = a._spool.commit_acking

    def spy(*args: Any) -> Any:
        calls.append(list(args[4]))
        return real(*args)

    monkeypatch.setattr(a._spool, "commit_acking", spy)
    try:
        [(m1, _)] = await a.commit([(body(2), 2)], {"a": (0, 20)}, [cp("a", 20)], True)
        a.ack_soon(m1.seq)
        [(m2, _)] = await a.commit([(body(2), 2)], {"a": (20, 40)}, [cp("a", 40)], True)
        assert calls == [[m1.seq]]                  # the ack went with the second record's write
        a.ack_soon(m2.seq)
        c = await a.contents()                      # flushes the waiting ack first
        assert c.pending == () and calls == [[m1.seq], [m2.seq]]
    finally:
        await a.close()
    assert reopened(tmp_path) == ([], {"a": 40})


async def test_a_lingering_ack_is_written_on_its_own(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(aio_mod, "ACK_LINGER_S", 0.05)
    a = await AsyncSpool.open(str(tmp_path))
    try:
        [(m1, _)] = await a.commit([(body(1), 1)], {"a": (0, 10)}, [cp("a", 10)], False)
        a.ack_soon(m1.seq)
        deadline = time.monotonic() + 10
        while m1.seq in a._spool.pending:           # poll the spool thread's view, with a deadline
            assert time.monotonic() < deadline, "the lingering ack was never written"
            await asyncio.sleep(0.01)
    finally:
        await a.close()
    assert reopened(tmp_path) == ([], {"a": 10})


async def test_close_writes_the_acks_still_waiting(tmp_path: Path) -> None:
    a = await AsyncSpool.open(str(tmp_path))
    [(m1, _)] = await a.commit([(body(1), 1)], {"a": (0, 10)}, [cp("a", 10)], False)
    a.ack_soon(m1.seq)
    await a.close()
    assert reopened(tmp_path) == ([], {"a": 10})


def test_commit_acking_keeps_the_margin_for_acks_and_an_ack_alone_still_goes(tmp_path: Path) -> None:
    """Folding acks into a record write must not bypass the full-disk margin (issue 19): without
    room, the new batch is refused (SpoolFullError, nothing written, the acks with it); the acks
    then go alone (what AsyncSpool's linger does), which needs no room."""
    from shipper.errors import SpoolFullError
    from shipper.spool.headroom import REUSE_S, Headroom
    from tests.unit.test_headroom import FakeFs, MiB

    s = Spool(str(tmp_path), headroom=True)
    try:
        fs = FakeFs(16 * MiB, 8 * MiB)
        clock = FakeClock(start=0.0)
        s.headroom = Headroom(str(tmp_path), statvfs=fs.statvfs, clock=clock)
        s.commit([(body(2), 2)], {"a": (0, 20)}, [cp("a", 20)], False)
        fs.free = s.headroom.reserve_bytes + 1024          # less than the margin beyond a batch
        clock.advance(REUSE_S)                                  # the last look is too old to trust
        with pytest.raises(SpoolFullError):
            s.commit_acking([(body(2000, "b"), 2000)], {"a": (20, 40)}, [cp("a", 40)], False, [1])
        assert sorted(s.pending) == [1]                     # nothing written, the ack not either
        assert s.commit_acking([], {}, [], False, [1]) == []
        assert s.pending == {}
    finally:
        s.close()
    assert reopened(tmp_path) == ([], {"a": 20})
