"""The pipeline's only source of time and sleep. Tests inject a fake clock."""

from __future__ import annotations

import asyncio
import time
from typing import Protocol


class Clock(Protocol):
    def monotonic(self) -> float: ...
    def time(self) -> float: ...
    async def sleep(self, seconds: float) -> None: ...
    async def wait(self, event: asyncio.Event, timeout_s: float) -> bool: ...


class SystemClock:
    def monotonic(self) -> float:
        return time.monotonic()

    def time(self) -> float:
        return time.time()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)

    async def wait(self, event: asyncio.Event, timeout_s: float) -> bool:
        """event.wait() for at most timeout_s; True if it was set. A timer on the waiting task, where
        asyncio.wait_for (3.11) also makes a Task and a waiter future per call: ~1,000 waits/s here."""
        if event.is_set():
            return True
        try:
            async with asyncio.timeout(timeout_s):
                await event.wait()
        except TimeoutError:
            return False
        return True
