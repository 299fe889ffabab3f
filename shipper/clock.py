"""The pipeline's only source of time and sleep. Tests inject a fake clock."""

from __future__ import annotations

import asyncio
import math
import time
from typing import Protocol

# Idle waits of a second or more end on whole seconds of the loop's clock (`wait(..., coalesce=True)`),
# so the reader's fallback look, the status tick and the dead-letter control's look fire in one
# wake-up instead of three (issue 14: an idle daemon's cost is its wake-ups). Up to this much late.
IDLE_TICK_S = 1.0


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

    async def wait(self, event: asyncio.Event, timeout_s: float, coalesce: bool = False) -> bool:
        """event.wait() for at most timeout_s; True if it was set. A timer on the waiting task, where
        asyncio.wait_for (3.11) also makes a Task and a waiter future per call: ~1,000 waits/s here.
        `coalesce` (an idle wait): a timeout of IDLE_TICK_S or more ends on the next whole tick."""
        if event.is_set():
            return True
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        if coalesce and timeout_s >= IDLE_TICK_S:
            deadline = math.ceil(deadline / IDLE_TICK_S) * IDLE_TICK_S
        try:
            async with asyncio.timeout_at(deadline):
                await event.wait()
        except TimeoutError:
            return False
        return True
