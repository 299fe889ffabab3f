"""The only reader of the time and the only sleeper: `Clock` (monotonic and wall time, sleeps,
coalesced idle waits), `SystemClock` for the daemon; tests inject tests/support/fake_clock.py's."""

from __future__ import annotations

import asyncio
import math
import time
from typing import Protocol

# Idle waits of COALESCE_MIN_S or more end on whole IDLE_TICK_S of the loop's clock (`wait(...,
# coalesce=True)`), so the reader's fallback look, the status tick and the dead-letter control's
# look fire in one wake-up every IDLE_TICK_S instead of one each (issue 14: an idle daemon's cost
# is its wake-ups). Up to IDLE_TICK_S late. A deadline less than IDLE_EARLY_S past a tick ends on
# that tick: a periodic wait re-armed just after the tick that woke it (2 s from 10.001) keeps its
# period (12) instead of slipping a tick (14; with 1 s ticks 13, so that 2 s and 1 s periods fell
# on different seconds and the daemon woke every second). Callers that ask "is it due?" allow the
# same IDLE_EARLY_S.
IDLE_TICK_S = 2.0
IDLE_EARLY_S = 0.05
COALESCE_MIN_S = 1.0


class Clock(Protocol):
    def monotonic(self) -> float: ...
    def time(self) -> float: ...
    async def sleep(self, seconds: float) -> None: ...
    async def wait(self, event: asyncio.Event, timeout_s: float, coalesce: bool = False) -> bool: ...


class SystemClock:
    def monotonic(self) -> float:
        return time.monotonic()

    def time(self) -> float:
        return time.time()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)

    def pause(self, seconds: float) -> None:
        """A blocking sleep, for the commands that run no event loop (never on the loop)."""
        time.sleep(seconds)

    async def wait(self, event: asyncio.Event, timeout_s: float, coalesce: bool = False) -> bool:
        """event.wait() for at most timeout_s; True if it was set. A timer on the waiting task, where
        asyncio.wait_for (3.11) also makes a Task and a waiter future per call (the reader waits often).
        `coalesce` (an idle wait): a timeout of COALESCE_MIN_S or more ends on a whole tick (`idle_tick`)."""
        if event.is_set():
            return True
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        if coalesce and timeout_s >= COALESCE_MIN_S:
            deadline = idle_tick(deadline)
        try:
            async with asyncio.timeout_at(deadline):
                await event.wait()
        except TimeoutError:
            return False
        return True


def idle_tick(deadline: float) -> float:
    """The tick a coalesced wait asked to end at `deadline` ends on: the first whole IDLE_TICK_S
    at or after it, or the one just before when that is less than IDLE_EARLY_S earlier."""
    return math.ceil((deadline - IDLE_EARLY_S) / IDLE_TICK_S) * IDLE_TICK_S
