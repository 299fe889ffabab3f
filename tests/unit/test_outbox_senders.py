"""The outbox's idle senders (issue 14): a batch wakes one idle sender, first come first woken; a
sender coming back from a request takes a waiting batch without waiting; a cancelled sender's
wake goes to the next one; `wake_all` wakes every one (reading is done)."""

from __future__ import annotations

import asyncio

import pytest

from shipper.events import Events
from shipper.model import BatchMeta
from shipper.ship.outbox import Outbox


def batch(seq: int) -> tuple[BatchMeta, bytes]:
    return BatchMeta(seq, 1, 10, 10, False, {"a": (seq * 10, seq * 10 + 10)}), b"x" * 10


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_a_batch_wakes_one_idle_sender_in_the_order_they_came() -> None:
    ob = Outbox(1 << 20, 4, Events())
    waits = [ob.wait_for_batch() for _ in range(3)]
    ob.add([batch(1)])
    await settle()
    assert [w.done() for w in waits] == [True, False, False]
    ob.add([batch(2), batch(3)])
    await settle()
    assert all(w.done() for w in waits)
    assert [ob.take()[0].seq for _ in range(3)] == [1, 2, 3]


async def test_no_idle_sender_no_wake_lost() -> None:
    """Batches added while every sender is busy wait in the outbox: a sender looks at it first."""
    ob = Outbox(1 << 20, 4, Events())
    ob.add([batch(1)])
    late = ob.wait_for_batch()      # a sender that did not look first would wait here
    await settle()
    assert not late.done() and len(ob) == 1


async def test_a_cancelled_sender_passes_its_wake_on() -> None:
    ob = Outbox(1 << 20, 4, Events())
    first, second = ob.wait_for_batch(), ob.wait_for_batch()
    ob.add([batch(1)])              # wakes `first`, whose sender is then cancelled before it runs
    assert first.done() and not second.done()
    ob.pass_wake_on(first)
    assert second.done()
    third = ob.wait_for_batch()
    ob.pass_wake_on(third)          # not woken: it just leaves the line
    ob.add([batch(2)])
    assert not third.done()


async def test_wake_all_wakes_every_idle_sender() -> None:
    ob = Outbox(1 << 20, 4, Events())
    waits = [ob.wait_for_batch() for _ in range(4)]
    ob.wake_all()
    assert all(w.done() for w in waits)


async def test_restore_wakes_as_many_senders_as_batches() -> None:
    ob = Outbox(1 << 20, 4, Events())
    waits = [ob.wait_for_batch() for _ in range(3)]
    ob.restore([batch(1)[0], batch(2)[0]])
    assert [w.done() for w in waits] == [True, True, False]


@pytest.mark.parametrize("senders", [1, 4])
async def test_senders_take_every_batch_once_and_wait_without_waking(senders: int) -> None:
    """Senders shaped like Delivery.worker: every batch taken once, in order, and an idle sender
    wakes only for a batch (counted), never by itself."""
    ob = Outbox(1 << 20, senders, Events())
    taken: list[int] = []
    wakes = 0
    done = False

    async def sender() -> None:
        nonlocal wakes
        while True:
            while not len(ob):
                if done:
                    return
                w = ob.wait_for_batch()
                try:
                    await w
                except asyncio.CancelledError:
                    ob.pass_wake_on(w)
                    raise
                wakes += 1
            meta, _ = ob.take()
            taken.append(meta.seq)
            await asyncio.sleep(0.001)        # the request
            ob.done()
            ob.acked(meta, 1)

    tasks = [asyncio.create_task(sender()) for _ in range(senders)]
    await settle()
    assert wakes == 0
    for seq in range(1, 41):
        ob.add([batch(seq)])
        if seq % 3 == 0:
            await asyncio.sleep(0.002)
    async with asyncio.timeout(10):
        while len(taken) < 40:
            await asyncio.sleep(0.001)
    assert taken == list(range(1, 41))
    assert wakes <= 40
    done = True
    ob.wake_all()
    async with asyncio.timeout(10):
        await asyncio.gather(*tasks)
