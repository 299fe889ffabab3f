"""SystemClock.wait: an event set in time wins; idle waits (coalesce) end on whole IDLE_TICK_S of
the loop's clock, so several idle timers fire in one wake-up; short or plain waits are not moved."""

from __future__ import annotations

import asyncio

from shipper.clock import IDLE_TICK_S, SystemClock


async def test_coalesced_idle_waits_end_together_on_the_tick() -> None:
    clock = SystemClock()
    loop = asyncio.get_running_loop()
    ends: list[float] = []

    async def idle(timeout_s: float) -> None:
        assert await clock.wait(asyncio.Event(), timeout_s, coalesce=True) is False
        ends.append(loop.time())

    start = loop.time()
    await asyncio.gather(idle(1.0), idle(1.0 + IDLE_TICK_S * 0.3))   # asked to end 0.3 s apart
    for t in ends:
        assert t % IDLE_TICK_S < 0.2                                  # on a tick (a busy machine is late)
        assert 1.0 <= t - start < 1.0 + IDLE_TICK_S + 0.2
    # one wake-up for both, unless the first deadline fell less than 0.3 s before a tick
    assert abs(ends[0] - ends[1]) < 0.2 or abs(abs(ends[0] - ends[1]) - IDLE_TICK_S) < 0.2


async def test_short_and_plain_waits_are_not_moved_and_a_set_event_wins() -> None:
    clock = SystemClock()
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    assert await clock.wait(asyncio.Event(), 0.05, coalesce=True) is False
    assert loop.time() - t0 < 0.5
    t0 = loop.time()
    assert await clock.wait(asyncio.Event(), 0.05) is False
    assert loop.time() - t0 < 0.5
    ev = asyncio.Event()
    loop.call_later(0.02, ev.set)
    t0 = loop.time()
    assert await clock.wait(ev, 5.0, coalesce=True) is True
    assert loop.time() - t0 < 1.0
