"""The memory path (`queue.spool: when_behind`) on a real spool and real files, stepped in-process.

Drafts go out from memory: nothing but checkpoints is written while acks come; acks out of order
never move a checkpoint past a batch still out; what waits past `spill_after` is spilled to the
queue with the checkpoints that may move, and newer drafts queue behind it until it is empty; a
file deleted with events in flight has them spilled at once; a full memory makes the reader wait;
a batch's dead letters are stored before its checkpoint moves. The rule itself: tests/unit/test_window.py.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

from shipper.config import QueueConfig
from shipper.model import BatchMeta, DeadLetter
from shipper.spool import Spool
from tests.support.pipeline_rig import Rig


def _write_lines(path: Path, start: int, n: int) -> None:
    with open(path, "ab") as f:
        f.write(b"".join(b"line %d\n" % i for i in range(start, start + n)))


def _rig(tmp_path: Path, **kw: Any) -> Rig:
    return Rig(tmp_path, [str(tmp_path / "*.log")], queue=QueueConfig(spool="when_behind", spill_after_s=1.0), **kw)


async def _read_and_hand_over(rig: Rig) -> None:
    """One read round and its draft, handed over and made (the outbox has its batches)."""
    p = rig.p
    assert p.read_round()
    await p.commit()


def _stored(rig: Rig) -> Spool:
    return rig.spool._spool


async def _ack(rig: Rig, meta: BatchMeta, dead: list[DeadLetter] | None = None) -> None:
    """What Delivery does with a batch sent from memory once Elasticsearch answered."""
    p = rig.p
    held = await p.pipeline.keeper.delivered(meta, dead or [])
    p.outbox.done()
    p.outbox.acked(held, meta.events - len(dead or []))


async def test_acked_from_memory_only_the_checkpoint_is_written(tmp_path: Path) -> None:
    log = tmp_path / "app.log"
    rig = _rig(tmp_path)
    try:
        _write_lines(log, 0, 50)
        await rig.step()            # read, hand over, ack, flush
        assert sorted(rig.messages()) == sorted(f"line {i}" for i in range(50))
        s = _stored(rig)
        assert s.pending == {}, "nothing but checkpoints is written while Elasticsearch keeps up"
        (cp,) = await rig.checkpoints()
        assert cp.offset == log.stat().st_size
        assert rig.p.pipeline.snapshot().memory_events == 0
    finally:
        await rig.close()


async def test_a_new_file_is_known_to_the_state_dir_before_any_of_its_events_go_out_from_memory(
        tmp_path: Path) -> None:
    """Its _ids are built from its incarnation: before the first draft holding it goes out, a record
    writes its checkpoint at its start (a kill -9 before the next checkpoint flush would otherwise
    name it anew after the restart, and ship every line again under other _ids). Nothing is queued."""
    log = tmp_path / "app.log"
    rig = _rig(tmp_path)
    p = rig.p
    try:
        _write_lines(log, 0, 10)
        await p.rescan()
        await p.open_waiting()
        await _read_and_hand_over(rig)
        assert [m.seq < 0 for m, _ in p.outbox._waiting] == [True], "out from memory"
        (cp,) = await rig.checkpoints()
        assert cp.offset == 0, "the new incarnation, at its start, written before its batch went out"
        assert _stored(rig).pending == {}
        await rig.collect()
        _write_lines(log, 10, 5)
        await _read_and_hand_over(rig)
        await rig.collect()
        assert sorted(rig.messages()) == sorted(f"line {i}" for i in range(15))
        assert [c.incarnation for c in await rig.checkpoints()] == [cp.incarnation]
    finally:
        await rig.close()


async def test_an_ack_out_of_order_never_moves_the_checkpoint_past_a_batch_still_out(tmp_path: Path) -> None:
    log = tmp_path / "app.log"
    rig = _rig(tmp_path)
    p = rig.p
    try:
        _write_lines(log, 0, 10)
        await p.rescan()
        await p.open_waiting()
        await _read_and_hand_over(rig)
        first_end = log.stat().st_size
        _write_lines(log, 10, 10)
        await _read_and_hand_over(rig)
        (m1, b1), (m2, b2) = p.outbox.take(), p.outbox.take()
        assert m1.seq < 0 and m2.seq < 0 and b1 and b2          # in memory, bodies at hand
        snap = p.pipeline.snapshot()
        assert snap.memory_events == 20 and snap.queue_events == 0
        await _ack(rig, m2)
        await rig.flush_checkpoints()
        assert await rig.checkpoints() == [] or (await rig.checkpoints())[0].offset == 0
        (row,) = p.file_status()
        assert row["offset"] == 0          # shipped: below the first batch still out
        await _ack(rig, m1)
        await rig.flush_checkpoints()
        (cp,) = await rig.checkpoints()
        assert cp.offset == log.stat().st_size > first_end
        assert _stored(rig).pending == {}
    finally:
        await rig.close()


async def test_a_late_batch_is_spilled_with_its_checkpoint_and_newer_ones_queue_behind_it(tmp_path: Path) -> None:
    log = tmp_path / "app.log"
    rig = _rig(tmp_path)
    p = rig.p
    keeper = p.pipeline.keeper
    try:
        _write_lines(log, 0, 10)
        await p.rescan()
        await p.open_waiting()
        await _read_and_hand_over(rig)
        end = log.stat().st_size
        rig.clock.advance(1.0)                  # spill_after passed without an ack
        spill = keeper.spill("late")
        assert spill is not None
        await spill
        s = _stored(rig)
        (seq,) = s.pending
        assert s.pending[seq].covers == {next(iter(s.pending[seq].covers)): (0, end)}
        assert s.checkpoints and next(iter(s.checkpoints.values())).offset == end   # the same transaction
        assert p.outbox.queue_events == 10 and p.outbox.memory_events == 0
        assert len(rig.events.of("spilled")) == 1
        # while the queue holds it, the next draft is queued too (in order, behind it)
        _write_lines(log, 10, 5)
        await _read_and_hand_over(rig)
        assert len(s.pending) == 2 and all(m.seq > 0 for m, _ in list(p.outbox._waiting))
        await rig.collect()
        assert sorted(rig.messages()) == sorted(f"line {i}" for i in range(15))
        await rig.spool.flush()
        assert _stored(rig).pending == {}
        # the queue is empty again: back to memory
        _write_lines(log, 15, 5)
        await _read_and_hand_over(rig)
        assert [m.seq < 0 for m, _ in p.outbox._waiting] == [True]
        await rig.collect()
        (cp,) = await rig.checkpoints()
        assert cp.offset == log.stat().st_size
    finally:
        await rig.close()


async def test_a_spilled_batch_acked_meanwhile_leaves_the_queue(tmp_path: Path) -> None:
    """The request was out when the spill came: its answer acks the queued copy."""
    log = tmp_path / "app.log"
    rig = _rig(tmp_path)
    p = rig.p
    try:
        _write_lines(log, 0, 10)
        await p.rescan()
        await p.open_waiting()
        await _read_and_hand_over(rig)
        meta, _body = p.outbox.take()           # a sender has it
        spill = p.pipeline.keeper.spill("late")
        assert spill is not None
        await _ack(rig, meta)                   # answered before the spill was written
        await spill
        await rig.spool.flush()
        assert _stored(rig).pending == {} and p.outbox.queue_events == 0 and not p.outbox.pending
    finally:
        await rig.close()


async def test_a_deleted_file_has_its_events_in_flight_spilled_at_once(tmp_path: Path) -> None:
    log = tmp_path / "app.log"
    rig = _rig(tmp_path)
    p = rig.p
    try:
        with open(log, "ab") as writer:
            writer.write(b"".join(b"line %d\n" % i for i in range(10)))
            writer.flush()
            await p.rescan()
            await p.open_waiting()
            await _read_and_hand_over(rig)
            assert p.outbox.memory_events == 10
            os.unlink(log)                          # the descriptor still reads; a restart could not
            await p.check_sources()
            await rig.spool.flush()
            await asyncio.sleep(0)
            s = _stored(rig)
            assert sum(m.events for m in s.pending.values()) == 10, "in flight of a deleted file: spilled"
            assert len(rig.events.of("spilled")) == 1
            # what is read of it from now on is queued, not sent from memory
            writer.write(b"".join(b"line %d\n" % i for i in range(10, 15)))
            writer.flush()
            await _read_and_hand_over(rig)
            await rig.spool.flush()
            assert sum(m.events for m in s.pending.values()) == 15
        await rig.collect()
        assert sorted(rig.messages()) == sorted(f"line {i}" for i in range(15))
    finally:
        await rig.close()


async def test_a_full_memory_makes_the_reader_wait_for_an_ack(tmp_path: Path) -> None:
    log = tmp_path / "app.log"
    rig = _rig(tmp_path)
    p = rig.p
    keeper = p.pipeline.keeper
    keeper.memory_max_bytes = 1             # any second draft is beyond it
    try:
        _write_lines(log, 0, 10)
        await p.rescan()
        await p.open_waiting()
        await _read_and_hand_over(rig)
        _write_lines(log, 10, 10)
        assert p.read_round()
        second = asyncio.ensure_future(p.commit())
        for _ in range(10):
            await asyncio.sleep(0)
        assert not second.done(), "memory is full: the reader waits"
        meta, _ = p.outbox.take()
        await _ack(rig, meta)
        await asyncio.wait_for(second, 5)
        await rig.collect()                 # the second draft went out from memory too, after the ack
        assert sorted(rig.messages()) == sorted(f"line {i}" for i in range(10, 20))
        assert _stored(rig).pending == {}
        (cp,) = await rig.checkpoints()
        assert cp.offset == log.stat().st_size
    finally:
        await rig.close()


async def test_dead_letters_of_a_batch_from_memory_are_stored_before_its_checkpoint_moves(tmp_path: Path) -> None:
    log = tmp_path / "app.log"
    rig = _rig(tmp_path)
    p = rig.p
    try:
        _write_lines(log, 0, 3)
        await p.rescan()
        await p.open_waiting()
        await _read_and_hand_over(rig)
        meta, _ = p.outbox.take()
        dead = DeadLetter("logs", "mapper_parsing_exception: x", 400, b'{"message":"line 1"}', 1000.0, "id-1")
        await _ack(rig, meta, [dead])
        assert _stored(rig).dead_letters == 1
        await rig.flush_checkpoints()
        (cp,) = await rig.checkpoints()
        assert cp.offset == log.stat().st_size
    finally:
        await rig.close()
