"""SystemClock.wait: an event set in time wins; idle waits (coalesce) end on whole IDLE_TICK_S of
the loop's clock, so several idle timers fire in one wake-up; short or plain waits are not moved."""

from __future__ import annotations

import asyncio

import pytest

from shipper.clock import IDLE_EARLY_S, IDLE_TICK_S, SystemClock, idle_tick


async def test_coalesced_idle_waits_end_together_on_the_tick() -> None:
    clock = SystemClock()
    loop = asyncio.get_running_loop()
    ends: list[float] = []
    asked: list[float] = []

    async def idle(timeout_s: float) -> None:
        assert await clock.wait(asyncio.Event(), timeout_s, coalesce=True) is False
        ends.append(loop.time())
        asked.append(timeout_s)

    start = loop.time()
    await asyncio.gather(idle(1.0), idle(1.0 + IDLE_TICK_S * 0.3))   # asked to end 0.3 of a tick apart
    for t, timeout_s in zip(ends, asked, strict=True):
        assert t % IDLE_TICK_S < 0.2                                  # on a tick (a busy machine is late)
        assert timeout_s - IDLE_EARLY_S <= t - start < timeout_s + IDLE_TICK_S + 0.2
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


@pytest.mark.parametrize("period", [IDLE_TICK_S, 3 * IDLE_TICK_S])
def test_a_periodic_idle_wait_rearmed_just_after_its_tick_keeps_its_period(period: float) -> None:
    # woken a little after tick T (the loop is never exactly on time), the next wait of `period`
    # ends on T + period, not a tick later: every periodic idle task stays on the same ticks
    t = 50 * IDLE_TICK_S
    for late in (0.0001, 0.003, IDLE_EARLY_S * 0.9):
        assert idle_tick(t + late + period) == t + period
    # further past the tick it is the next one (at most IDLE_TICK_S late, never early by more
    # than IDLE_EARLY_S)
    assert idle_tick(t + period + 0.3) == t + period + IDLE_TICK_S
    for deadline in (t + 0.01, t + 0.5, t + IDLE_TICK_S - 0.01, t + 1.234):
        end = idle_tick(deadline)
        assert end % IDLE_TICK_S == 0
        assert deadline - IDLE_EARLY_S <= end < deadline + IDLE_TICK_S
