"""The draft writer: drafts become batches in the spool (or go out from memory, as the keeper routes
them), in order, with the checkpoints they may move, handed to the outbox (given in: the spool imports
nothing of ship/). Up to WRITES_BEHIND drafts wait behind the reader; a failed write stops every later
one (its checkpoints would skip lines); a full disk is waited out here (logged once), never dropped."""

from __future__ import annotations

import asyncio
import dataclasses
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, TypeVar

from shipper.clock import Clock
from shipper.errors import SpoolFullError
from shipper.events import Events
from shipper.model import BatchMeta, Checkpoint, Draft
from shipper.spool.aio import AsyncSpool, CommitSkipped, WriteOrder
from shipper.spool.made import Bodies, Made
from shipper.spool.window import Route

T = TypeVar("T")
Group = Callable[[list[bytes], int, int, dict[int, int]], Bodies]    # ship.batching.group_parts (or group)
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


class Router(Protocol):
    """The keeper (spool/keeper.py), as the writer asks it where a draft goes and what it may write."""

    def route(self, draft: Draft) -> Route: ...
    async def wait_for_room(self) -> None: ...
    def add(self, draft: Draft, memory: bool) -> int: ...
    def sent_from_memory(self, did: int, made: list[Made]) -> list[tuple[BatchMeta, bytes]]: ...
    def plan(self) -> list[Checkpoint]: ...
    def checkpoints_moved(self) -> None: ...
    def holds(self, incarnation: str) -> bool: ...
    def doom(self, incarnation: str) -> None: ...
    def unstored(self, cp: Checkpoint) -> None: ...
    def to_store(self, draft: Draft) -> list[Checkpoint]: ...


class DraftWriter:
    """Owns the draft sources read into (`draft`), and writes it on `commit()`.

    Every write that moves a checkpoint (a spooled draft, a spill, a checkpoint flush) is a record:
    handed to the spool thread the moment it is planned, with a turn, so records are written in
    the order their checkpoints were planned, and none after one that was not (`commit_in_order`).
    A draft sent from memory is no record: its bodies are made on the spool thread, nothing is
    written, and its checkpoints wait in the keeper's window for its acks."""

    def __init__(self, spool: AsyncSpool, group: Group, deliver: Deliver, disk: DiskWait, clock: Clock, *,
                 max_events: int, max_bytes: int, gzip: bool, wake: asyncio.Event, keeper: Router) -> None:
        self.spool = spool
        self.group = group
        self.deliver = deliver
        self.disk = disk
        self.clock = clock
        self.max_events = max_events
        self.max_bytes = max_bytes
        self.gzip = gzip
        self.wake = wake
        self.keeper = keeper
        self.draft = Draft()
        self.last_commit_at = float("-inf")     # when the last draft was handed over (flush_min_interval)
        self.lock = asyncio.Lock()              # held by the record being written (records are written in order)
        self._writes: deque[tuple[Draft, asyncio.Future[None]]] = deque()
        self._turn = 0                          # records handed over (AsyncSpool.commit_in_order's turns)
        self._order = WriteOrder()
        self._error: BaseException | None = None
        self._spooling = 0                      # records with batches handed over and not yet written
        self.checkpoints_written: list[Callable[[list[Checkpoint]], None]] = []

    @property
    def committing(self) -> bool:
        """A draft is being written (or waits to be): the current draft alone does not show everything read."""
        return bool(self._writes)

    @property
    def spooling(self) -> bool:
        """Batches are on their way into the spool (newer drafts go there too, behind them)."""
        return self._spooling > 0

    def writing(self) -> list[Draft]:
        """The drafts handed over and not yet in the spool (status counts their lines as read, not queued)."""
        return [d for d, _ in self._writes]

    def stage(self, cp: Checkpoint) -> None:
        """A checkpoint move without lines (a finished or new incarnation): written with the next draft."""
        d = self.draft
        if d.empty():
            d.started = self.clock.monotonic()
        d.checkpoints[cp.incarnation] = dataclasses.replace(cp)

    def must_spool(self, incarnation: str) -> None:
        """The file of this incarnation is being deleted or truncated (`Drafts.must_spool`)."""
        self.keeper.doom(incarnation)

    def must_store(self, cp: Checkpoint) -> None:
        """A new incarnation (`Drafts.must_store`): before the first draft that holds it goes out
        from memory, a record writes its checkpoint as it is now (its start)."""
        self.keeper.unstored(dataclasses.replace(cp))

    async def commit(self, wait: bool = True) -> None:
        """Hand the draft over: to the spool as batches with the checkpoints it may move (one
        transaction), or out from memory (the keeper's `route`); then to the outbox.

        With wait=False (the reader) only the hand-over is awaited: grouping, gzip and SQLite run
        on the spool thread while the loop reads on. Drafts are written one at a time, in order
        (each write holds the lock; asyncio's lock is FIFO). wait=True returns when this draft and
        every one before it is in the outbox. Memory full: waits for an ack or the spill."""
        if self._error is not None:
            raise self._error
        while len(self._writes) >= WRITES_BEHIND:
            await asyncio.shield(self._writes[0][1])
        draft = self.draft
        if draft.empty():
            if wait and self._writes:
                await asyncio.shield(self._writes[-1][1])
            return
        where = self.keeper.route(draft)
        while where == "wait":
            await self.keeper.wait_for_room()
            if self._error is not None:
                raise self._error
            where = self.keeper.route(draft)
        self.draft = Draft()
        self.last_commit_at = self.clock.monotonic()
        cps = list(draft.checkpoints.values())
        if where == "memory" and not draft.parts:
            # nothing to send (every line dropped, or a checkpoint move alone): its checkpoints wait
            # for the drafts before it and go with the next write
            self.keeper.add(draft, memory=False)
            self.keeper.checkpoints_moved()
            for hook in self.checkpoints_written:
                hook(cps)
            return
        did = self.keeper.add(draft, memory=where == "memory")
        if where == "memory":
            new = self.keeper.to_store(draft)
            if new:
                # new incarnations: their checkpoints at their start, a record of their own, written
                # before this draft goes out (its send waits for the lock that record holds)
                self.flush(new).add_done_callback(_retrieve)
            made = self.spool.make(self._maker(draft), _covers(draft), self.gzip)
            made.add_done_callback(_retrieve)
            task: asyncio.Future[None] = asyncio.ensure_future(self._send(draft, did, made, cps))
        else:
            # written with this record: the window plans them now. Not a multiline cut's: the plan
            # holds an incarnation's checkpoint back while a draft before it is out from memory, and
            # this record's events must be re-read as they were cut; a record of its own, first
            cuts = [cp for cp in self.keeper.to_store(draft) if cp.cuts]
            if cuts:
                self.flush(cuts).add_done_callback(_retrieve)
            plan = self.keeper.plan()
            turn = self._next_turn()
            # on the spool thread's queue now, behind the drafts before it: the thread goes from one
            # draft to the next without waiting for the loop to take the answer (issue 14: in a
            # backlog the reader fills the next draft in one round, and meanwhile the thread stood idle)
            task = self._record(lambda: self._hand_over(draft, turn, plan), lambda out: self._stored(cps, out), draft)
        task.add_done_callback(_retrieve)       # a failure is raised through _error, by every later commit
        self._writes.append((draft, task))
        if wait:
            # shielded: the draft's lines are nowhere else, so a cancelled caller must not cancel
            # its write; it goes on, and the next commit raises its failure
            await asyncio.shield(task)

    def spill(self, made: Callable[[], list[Made]], checkpoints: list[Checkpoint],
              answered: Callable[[list[tuple[BatchMeta, bytes]]], None]) -> asyncio.Future[None]:
        """A record of batches made already (sent from memory: `made` says which at each attempt)
        and the checkpoints planned with them, handed over now; `answered` gets their rows once
        written. No batches: a checkpoint flush."""
        turn = self._next_turn()
        return self._record(lambda: self.spool.spill_in_order(self._order, turn, made(), checkpoints), answered,
                            None, spools=made is not _none)

    def flush(self, checkpoints: list[Checkpoint]) -> asyncio.Future[None]:
        """The checkpoints the keeper's acks moved, written now (a record of their own)."""
        return self.spill(_none, checkpoints, _nothing)

    def _next_turn(self) -> int:
        self._turn += 1
        return self._turn

    def _maker(self, draft: Draft) -> Callable[[], Bodies]:
        parts, multi, max_events, max_bytes, group = draft.parts, draft.multi, self.max_events, self.max_bytes, self.group

        def bodies() -> Bodies:
            return group(parts, max_events, max_bytes, multi)     # on the spool thread

        return bodies

    def _hand_over(self, draft: Draft, turn: int, plan: list[Checkpoint]) -> asyncio.Future[list[tuple[BatchMeta, bytes]]]:
        """The draft's write, queued on the spool thread (`AsyncSpool.commit_in_order`)."""
        return self.spool.commit_in_order(self._order, turn, self._maker(draft), _covers(draft), plan, self.gzip)

    def _record(self, hand: Callable[[], asyncio.Future[list[tuple[BatchMeta, bytes]]]],
                answered: Callable[[list[tuple[BatchMeta, bytes]]], None], draft: Draft | None,
                spools: bool = True) -> asyncio.Future[None]:
        first = hand()
        first.add_done_callback(_retrieve)
        if spools:
            self._spooling += 1
        return asyncio.ensure_future(self._write(first, hand, answered, draft, spools))

    async def _write(self, first: asyncio.Future[list[tuple[BatchMeta, bytes]]],
                     hand: Callable[[], asyncio.Future[list[tuple[BatchMeta, bytes]]]],
                     answered: Callable[[list[tuple[BatchMeta, bytes]]], None], draft: Draft | None,
                     spools: bool) -> None:
        try:
            async with self.lock:
                if self._error is not None:
                    raise self._error       # an earlier record was not written: neither is this one
                try:
                    answered(await self._store(first, hand))
                except BaseException as e:
                    self._error = e
                    raise
        finally:
            if not first.done():
                first.cancel()      # cancelled before its turn: not written (unless the thread has it already)
            if spools:
                self._spooling -= 1
            if draft is not None:
                self._done(draft)

    def _done(self, draft: Draft) -> None:
        self._writes = deque(w for w in self._writes if w[0] is not draft)
        if not self.draft.empty():
            self.wake.set()     # what was read meanwhile may go now (should_commit held it back)

    async def _store(self, first: asyncio.Future[list[tuple[BatchMeta, bytes]]],
                     hand: Callable[[], asyncio.Future[list[tuple[BatchMeta, bytes]]]]) -> list[tuple[BatchMeta, bytes]]:
        pending: asyncio.Future[list[tuple[BatchMeta, bytes]]] | None = first

        async def attempt() -> list[tuple[BatchMeta, bytes]]:
            nonlocal pending
            fut, pending = pending, None
            if fut is None:
                fut = hand()       # again, the same turn and checkpoints: a full disk was waited out
            try:
                return await fut
            except CommitSkipped:
                # the record before it was not written when its turn came (a full disk, waited out
                # since: we hold the lock, so every record before this one is done)
                return await hand()

        # a full disk waits here (logged once): reading pauses with it, the files are the buffer
        return await self.disk.run(attempt)

    def _stored(self, cps: list[Checkpoint], batches: list[tuple[BatchMeta, bytes]]) -> None:
        for hook in self.checkpoints_written:
            hook(cps)
        self.deliver(batches)

    async def _send(self, draft: Draft, did: int, made: asyncio.Future[list[Made]], cps: list[Checkpoint]) -> None:
        """A draft sent from memory: its bodies, in draft order (the lock), to the keeper and the outbox."""
        try:
            async with self.lock:
                if self._error is not None:
                    raise self._error
                try:
                    self.keeper.sent_from_memory(did, await made)
                except BaseException as e:
                    self._error = e
                    raise
                for hook in self.checkpoints_written:
                    hook(cps)
        finally:
            if not made.done():
                made.cancel()
            self._done(draft)

    async def forget(self, pick: Callable[[set[str]], list[str]]) -> list[str]:
        """Forget checkpoints in the store, between two records' writes: `pick` gets the incarnations
        the current draft moves (never forgotten) and returns those to delete; one with a draft in
        flight or a checkpoint not yet written is kept too."""
        async with self.lock:
            incs = [inc for inc in pick(set(self.draft.checkpoints)) if not self.keeper.holds(inc)]
            if not incs:
                return []
            return await self.spool.forget_checkpoints(incs)


def _covers(draft: Draft) -> dict[str, tuple[int, int]]:
    return {k: (v[0], v[1]) for k, v in draft.covers.items()}


def _nothing(_out: list[tuple[BatchMeta, bytes]]) -> None:
    return None


def _none() -> list[Made]:
    return []


def _retrieve(task: asyncio.Future[Any]) -> None:
    """Mark a write's failure as seen (commit() raises it via _error)."""
    if not task.cancelled():
        task.exception()
