"""The draft writer: drafts become batches in the spool, in order, with the checkpoints they advance,
handed to the outbox (given in: the spool imports nothing of ship/). Up to WRITES_BEHIND drafts wait
behind the reader; a failed write stops every later one (its checkpoints would skip lines); a full
disk is waited out here (logged once), never dropped."""

from __future__ import annotations

import asyncio
import dataclasses
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from shipper.clock import Clock
from shipper.errors import SpoolFullError
from shipper.events import Events
from shipper.model import BatchMeta, Checkpoint, Draft
from shipper.spool.aio import AsyncSpool, CommitSkipped, WriteOrder

T = TypeVar("T")
Group = Callable[[list[bytes], int, int, dict[int, int]], list[tuple[bytes, int]]]    # ship.batching.group
Deliver = Callable[[list[tuple[BatchMeta, bytes]]], None]             # ship.outbox.Outbox.add

WRITES_BEHIND = 2             # drafts the reader may have handed to the spool thread and not yet seen written
FULL_DISK_RETRY_S = 1.0


class DiskWait:
    """Spool writes that wait out a full disk: logged once per episode, retried, never dropped.
    SQLite rolls a failed transaction back, so the queue stays as it was before the attempt.
    After `give_up_at` (monotonic; set when stopping) the error is raised instead."""

    def __init__(self, events: Events, clock: Clock) -> None:
        self.events = events
        self.clock = clock
        self.full = False
        self.give_up_at: float | None = None

    async def run(self, op: Callable[[], Awaitable[T]]) -> T:
        while True:
            try:
                result = await op()
            except SpoolFullError as e:
                if not self.full and not e.logged:      # headroom logs its own episodes (issue 19)
                    self.full = True
                    self.events.spool_error(str(e))
                if self.give_up_at is not None and self.clock.monotonic() >= self.give_up_at:
                    raise          # stopping: what was not written is read again at the next start
                await self.clock.sleep(FULL_DISK_RETRY_S)
                continue
            if self.full:
                self.full = False
                self.events.info("spool writable again")
            return result


class DraftWriter:
    """Owns the draft sources read into (`draft`), and writes it on `commit()`."""

    def __init__(self, spool: AsyncSpool, group: Group, deliver: Deliver, disk: DiskWait, clock: Clock, *,
                 max_events: int, max_bytes: int, gzip: bool, wake: asyncio.Event) -> None:
        self.spool = spool
        self.group = group
        self.deliver = deliver
        self.disk = disk
        self.clock = clock
        self.max_events = max_events
        self.max_bytes = max_bytes
        self.gzip = gzip
        self.wake = wake
        self.draft = Draft()
        self.last_commit_at = float("-inf")     # when the last draft was handed over (flush_min_interval)
        self.lock = asyncio.Lock()              # held by the draft being written (drafts are written in order)
        self._writes: deque[tuple[Draft, asyncio.Future[None]]] = deque()
        self._turn = 0                          # drafts handed over (AsyncSpool.commit_in_order's turns)
        self._order = WriteOrder()
        self._error: BaseException | None = None
        self.checkpoints_written: list[Callable[[list[Checkpoint]], None]] = []

    @property
    def committing(self) -> bool:
        """A draft is being written (or waits to be): the current draft alone does not show everything read."""
        return bool(self._writes)

    def writing(self) -> list[Draft]:
        """The drafts handed over and not yet in the spool (status counts their lines as read, not queued)."""
        return [d for d, _ in self._writes]

    def stage(self, cp: Checkpoint) -> None:
        """A checkpoint move without lines (a finished or new incarnation): written with the next draft."""
        d = self.draft
        if d.empty():
            d.started = self.clock.monotonic()
        d.checkpoints[cp.incarnation] = dataclasses.replace(cp)

    async def commit(self, wait: bool = True) -> None:
        """Write the draft as batches with its checkpoints (one transaction), then hand them to the outbox.

        With wait=False (the reader) only the hand-over is awaited: grouping, gzip and SQLite run
        on the spool thread while the loop reads on. Drafts are written one at a time, in order
        (each write holds the lock; asyncio's lock is FIFO). wait=True returns when this draft and
        every one before it is in the outbox."""
        if self._error is not None:
            raise self._error
        while len(self._writes) >= WRITES_BEHIND:
            await asyncio.shield(self._writes[0][1])
        draft = self.draft
        if draft.empty():
            if wait and self._writes:
                await asyncio.shield(self._writes[-1][1])
            return
        self.draft = Draft()
        self.last_commit_at = self.clock.monotonic()
        self._turn += 1
        # on the spool thread's queue now, behind the drafts before it: the thread goes from one
        # draft to the next without waiting for the loop to take the answer (issue 14: in a
        # backlog the reader fills the next draft in one round, and meanwhile the thread stood idle)
        first = self._hand_over(draft, self._turn)
        first.add_done_callback(_retrieve)
        task = asyncio.ensure_future(self._write(draft, self._turn, first))
        task.add_done_callback(_retrieve)       # a failure is raised through _error, by every later commit
        self._writes.append((draft, task))
        if wait:
            # shielded: the draft's lines are nowhere else, so a cancelled caller must not cancel
            # its write; it goes on, and the next commit raises its failure
            await asyncio.shield(task)

    def _hand_over(self, draft: Draft, turn: int) -> asyncio.Future[list[tuple[BatchMeta, bytes]]]:
        """The draft's write, queued on the spool thread (`AsyncSpool.commit_in_order`)."""
        covers = {k: (v[0], v[1]) for k, v in draft.covers.items()}
        parts, multi, max_events, max_bytes, group = draft.parts, draft.multi, self.max_events, self.max_bytes, self.group

        def bodies() -> list[tuple[bytes, int]]:
            return group(parts, max_events, max_bytes, multi)     # on the spool thread

        return self.spool.commit_in_order(self._order, turn, bodies, covers, draft.checkpoints.values(), self.gzip)

    async def _write(self, draft: Draft, turn: int, first: asyncio.Future[list[tuple[BatchMeta, bytes]]]) -> None:
        try:
            async with self.lock:
                if self._error is not None:
                    raise self._error       # an earlier draft was not written: neither is this one
                try:
                    await self._store(draft, turn, first)
                except BaseException as e:
                    self._error = e
                    raise
        finally:
            if not first.done():
                first.cancel()      # cancelled before its turn: not written (unless the thread has it already)
            self._writes = deque(w for w in self._writes if w[0] is not draft)
            if not self.draft.empty():
                self.wake.set()     # what was read meanwhile may go now (should_commit held it back)

    async def _store(self, draft: Draft, turn: int, first: asyncio.Future[list[tuple[BatchMeta, bytes]]]) -> None:
        cps = list(draft.checkpoints.values())
        pending: asyncio.Future[list[tuple[BatchMeta, bytes]]] | None = first

        async def attempt() -> list[tuple[BatchMeta, bytes]]:
            nonlocal pending
            fut, pending = pending, None
            if fut is None:
                fut = self._hand_over(draft, turn)       # again: a full disk was waited out
            try:
                return await fut
            except CommitSkipped:
                # the draft before it was not written when its turn came (a full disk, waited out
                # since: we hold the lock, so every draft before this one is done)
                return await self._hand_over(draft, turn)

        # a full disk waits here (logged once): reading pauses with it, the files are the buffer
        batches = await self.disk.run(attempt)
        for hook in self.checkpoints_written:
            hook(cps)
        self.deliver(batches)

    async def forget(self, pick: Callable[[set[str]], list[str]]) -> list[str]:
        """Forget checkpoints in the store, between two drafts' writes: `pick` gets the incarnations
        the current draft moves (never forgotten) and returns those to delete."""
        async with self.lock:
            incs = pick(set(self.draft.checkpoints))
            if not incs:
                return []
            return await self.spool.forget_checkpoints(incs)


def _retrieve(task: asyncio.Future[Any]) -> None:
    """Mark a write's failure as seen (commit() raises it via _error)."""
    if not task.cancelled():
        task.exception()
