"""One fake clock and one recording Events for unit and component tests.

Monotonic time moves only when told or slept; waits with a timeout give real tasks and threads a
moment (a spool write, a scan) and then let the fake time run out, so the reader loop runs under
it at full speed. Every task's timeouts move the one clock; `task_time(name)` is one task's own
timeline (what its sleeps and timed-out waits took), e.g. the reader loop's ("reader"). Wall time is the real clock plus what `advance_wall` added (the pipeline compares
checkpoint times with file mtimes, which the kernel sets). `RecordingEvents.wait_for(name)` awaits
an occurrence instead of sleeping.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from shipper.events import Events

REAL_SLICE_S = 0.002          # how long a fake wait lets real work (threads, sockets) go on first


class FakeClock:
    def __init__(self, start: float = 1_000.0, *, wall: float | None = None) -> None:
        self.mono = start
        self.wall_offset = 0.0
        self._fixed_wall = wall
        self.slept: list[float] = []
        self.waited: list[float] = []
        # per task name, the fake seconds its own sleeps and timed-out waits took: one task's
        # timeline (every task's timeouts move `mono`; only its own move its entry here)
        self.idle_s: dict[str, float] = {}
        self.pokes = 0

    @property
    def now(self) -> float:
        return self.mono

    @now.setter
    def now(self, v: float) -> None:
        self.mono = v

    def monotonic(self) -> float:
        return self.mono

    def time(self) -> float:
        if self._fixed_wall is not None:
            return self._fixed_wall + (self.mono - 1_000.0) + self.wall_offset
        return time.time() + self.wall_offset

    def advance(self, s: float) -> None:
        self.mono += s

    def advance_wall(self, s: float) -> None:
        self.wall_offset += s

    def task_time(self, name: str) -> float:
        """The fake seconds task `name` has spent in sleeps and in waits that timed out."""
        return self.idle_s.get(name, 0.0)

    def _charge(self, s: float) -> None:
        task = asyncio.current_task()
        name = task.get_name() if task is not None else ""
        self.idle_s[name] = self.idle_s.get(name, 0.0) + s

    async def sleep(self, s: float) -> None:
        self.slept.append(s)
        self.advance(s)
        self._charge(s)
        await asyncio.sleep(0)

    def poke(self) -> None:
        """Something outside happened now (the test wrote a file): a wait whose slice runs out while
        it happens is not charged to its task's `task_time` (the event it causes is on its way)."""
        self.pokes += 1

    async def wait(self, event: asyncio.Event, timeout_s: float, coalesce: bool = False) -> bool:
        self.waited.append(timeout_s)
        if event.is_set():
            return True
        pokes = self.pokes
        try:
            await asyncio.wait_for(event.wait(), REAL_SLICE_S)
            return True
        except TimeoutError:
            self.advance(timeout_s)
            if event.is_set():
                return True
            if self.pokes == pokes:      # a poke meanwhile: what woke it was on its way, not waited for
                self._charge(timeout_s)
            return False


class RecordingEvents(Events):
    """Every occurrence, in order: `seen` is a list of (method name, args)."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, tuple[Any, ...]]] = []
        self._waiters: list[tuple[str, asyncio.Future[tuple[Any, ...]]]] = []
        for name in dir(Events):
            if not name.startswith("_"):
                setattr(self, name, self._recorder(name))

    def _recorder(self, name: str) -> Any:
        def record(*args: Any, **kw: Any) -> None:
            got = args + tuple(kw.values())
            self.seen.append((name, got))
            for n, fut in list(self._waiters):
                if n == name and not fut.done():
                    fut.set_result(got)
        return record

    def of(self, name: str) -> list[tuple[Any, ...]]:
        return [a for n, a in self.seen if n == name]

    async def wait_for(self, name: str, timeout_s: float = 10.0, *, after: int | None = None) -> tuple[Any, ...]:
        """The next `name` occurrence (or, with `after=n`, the first beyond the n-th)."""
        if after is not None and len(self.of(name)) > after:
            return self.of(name)[after]
        fut: asyncio.Future[tuple[Any, ...]] = asyncio.get_running_loop().create_future()
        self._waiters.append((name, fut))
        try:
            return await asyncio.wait_for(fut, timeout_s)
        except TimeoutError:
            raise AssertionError(f"timed out after {timeout_s}s waiting for the occurrence {name}") from None
        finally:
            self._waiters = [w for w in self._waiters if w[1] is not fut]
