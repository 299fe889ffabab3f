"""The checkpoint keeper: batches sent from memory, their acks, spills to the queue, checkpoint flushes.
It performs what spool/window.py decides: every write goes through the draft writer (`Transactions`),
in turn, with the checkpoints the window plans for it; batches reach the senders through the outbox.
It reads no file and sends nothing; with `queue.spool: always` every draft is spooled as before.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Literal, Protocol

from shipper.clock import Clock
from shipper.events import Events
from shipper.model import BatchMeta, Checkpoint, DeadLetter, Draft
from shipper.spool.aio import AsyncSpool
from shipper.spool.made import Made
from shipper.spool.window import Route, SpoolMode, Window, route, spill_due
from shipper.spool.writer import DiskWait

# Request bodies (as sent) out from memory only: beyond this the reader waits for an ack, or for
# the spill that `spill_after` brings. At least one draft always fits.
MEMORY_MAX_BYTES = 8 * 1024 * 1024
# Checkpoints moved by acks are written in one small transaction (two SQLite pages, copied back
# later): at most every CHECKPOINT_EVERY_S once CHECKPOINT_BYTES of requests were acknowledged since
# the last, else after CHECKPOINT_IDLE_S, so a trickle does not cost a write a second. A kill -9
# reads again at most that much more than was in flight; the _ids make the re-sends harmless.
CHECKPOINT_EVERY_S = 1.0
CHECKPOINT_IDLE_S = 10.0
CHECKPOINT_BYTES = 1024 * 1024

SpillReason = Literal["late", "file_gone", "stop"]


class Transactions(Protocol):
    """The draft writer, as the keeper hands it writes: each handed over now, in turn."""

    @property
    def spooling(self) -> bool: ...
    def spill(self, made: Callable[[], list[Made]], checkpoints: list[Checkpoint],
              answered: Callable[[list[tuple[BatchMeta, bytes]]], None]) -> asyncio.Future[None]: ...


class Outgoing(Protocol):
    """The outbox, as the keeper feeds it."""

    queue_events: int
    def add_memory(self, batches: list[tuple[BatchMeta, bytes]]) -> None: ...
    def spilled(self, moved: list[tuple[BatchMeta, BatchMeta]]) -> None: ...


@dataclass(slots=True)
class _Flight:
    """A batch sent from memory: its negative seq is its name until it is spilled."""

    draft: int
    meta: BatchMeta
    body: bytes
    state: Literal["memory", "spilling", "spooled"] = "memory"
    spooled: BatchMeta | None = None     # its row in the queue, once spilled
    acked: bool = False                  # delivered while its spill was being written


class Keeper:
    def __init__(self, mode: SpoolMode, spill_after_s: float, outbox: Outgoing, spool: AsyncSpool, disk: DiskWait,
                 events: Events, clock: Clock, memory_max_bytes: int = MEMORY_MAX_BYTES) -> None:
        self.mode = mode
        self.spill_after_s = spill_after_s
        self.memory_max_bytes = memory_max_bytes
        self.outbox = outbox
        self.spool = spool
        self.disk = disk
        self.events = events
        self.clock = clock
        self.window = Window()
        self.writer: Transactions | None = None
        self._flights: dict[int, _Flight] = {}
        self._seq = 0                               # the last negative seq given
        self._doomed: set[str] = set()              # incarnations whose files are going away
        self._unstored: dict[str, Checkpoint] = {}  # new incarnations not in the state dir yet, at their start
        self._spills: set[asyncio.Future[None]] = set()
        self._flushed_at = float("-inf")
        self._acked_bytes = 0                       # requests acknowledged from memory since the last flush
        self._wake_at = float("inf")                # when the timer task looks next (inf: when told)
        self.changed = asyncio.Event()              # the timer task looks now
        self.room = asyncio.Event()                 # memory freed (an ack) or spilled
        self.spilled_total = 0

    # ---------------------------------------------------------------- drafts

    def route(self, draft: Draft) -> Route:
        writer = self.writer
        durable = bool(self._doomed) and any(inc in self._doomed for inc in draft.covers)
        spooled = self.outbox.queue_events > 0 or bool(self._spills) or (writer is not None and writer.spooling)
        return route(self.mode, durable=durable, spooled=spooled, memory_bytes=self.window.memory_bytes,
                     draft_bytes=draft.nbytes, memory_max_bytes=self.memory_max_bytes)

    def add(self, draft: Draft, memory: bool) -> int:
        """A draft handed over (`Window.add`): memory, or to the spool with the next record."""
        return self.window.add(draft.covers, draft.checkpoints, memory=memory, now=self.clock.monotonic(),
                               nbytes=draft.nbytes, events=draft.events)

    async def wait_for_room(self) -> None:
        """Memory is full: until an ack frees some, or the oldest is spilled (at most spill_after).
        A wake-up from before the wait only makes the caller look once more."""
        self._look_by(self._spill_deadline())
        await self.room.wait()
        self.room.clear()

    def sent_from_memory(self, did: int, made: list[Made]) -> list[tuple[BatchMeta, bytes]]:
        """A memory draft's bodies are made: its batches, under seqs of their own (negative), to the
        outbox with their bodies. The spill deadline of the oldest is the timer task's to keep."""
        out: list[tuple[BatchMeta, bytes]] = []
        now = self.clock.time()
        for m in made:
            self._seq -= 1
            meta = BatchMeta(self._seq, m.events, m.raw_bytes, len(m.stored), m.gzipped, dict(m.covers), now)
            self._flights[meta.seq] = _Flight(did, meta, m.stored)
            out.append((meta, m.stored))
        self.window.made(did, len(made), sum(len(m.stored) for m in made))
        if out:
            self.outbox.add_memory(out)
        if not made:
            self.checkpoints_moved()
        elif self._doomed and any(inc in self._doomed for m in made for inc in m.covers):
            self.spill("file_gone")
        self._look_by(self._spill_deadline())
        return out

    def plan(self) -> list[Checkpoint]:
        """The checkpoints the transaction handed over now may write (the window's plan); a finished
        incarnation whose file was going away needs no spilling any more."""
        cps = list(self.window.plan().values())
        if self._doomed:
            for cp in cps:
                if cp.finished:
                    self._doomed.discard(cp.incarnation)
        return cps

    def doom(self, incarnation: str) -> None:
        """The file of this incarnation is being deleted or truncated: what of it is out from memory
        goes to the queue now (its descriptor still reads, but a restart could not), and every
        draft that holds its events from now on is spooled."""
        self._doomed.add(incarnation)
        if self.mode == "when_behind" and self.window.holds_memory(incarnation):
            self.spill("file_gone")

    def unstored(self, cp: Checkpoint) -> None:
        """A new incarnation, at its start: its _ids are built from it, so it must be in the state
        dir before any of its events go out from memory (`to_store`). Also a multiline cut made by
        time (`Checkpoint.cuts`), at offset 0: stored, it moves no offset (`carried.merge_cuts`);
        replacing a record not written yet (a new incarnation's start), it keeps that offset."""
        old = self._unstored.get(cp.incarnation)
        if old is not None and old.offset > cp.offset:
            cp = replace(cp, offset=old.offset)
        self._unstored[cp.incarnation] = cp

    def to_store(self, draft: Draft) -> list[Checkpoint]:
        """The new incarnations this draft (going out from memory) holds or moves: their checkpoints
        at their start, for a record written before it is sent. A checkpoint at an incarnation's
        start passes no event of it, so it may be written at any time. (A spooled draft writes them
        with its own record, planned by the window: the writer drops them here too.)"""
        if not self._unstored:
            return []
        return [cp for inc in (*draft.covers, *draft.checkpoints) if (cp := self._unstored.pop(inc, None)) is not None]

    def holds(self, incarnation: str) -> bool:
        """A draft of it is in flight or a checkpoint of it not written yet (not to be forgotten)."""
        return self.window.holds(incarnation)

    # ---------------------------------------------------------------- acks

    async def delivered(self, meta: BatchMeta, dead: list[DeadLetter]) -> BatchMeta:
        """A batch sent from memory is acknowledged (its dead letters, if any, stored first, as data
        the restart needs no file for). Returns the batch the outbox holds it as now."""
        f = self._flights[meta.seq]
        acked_row: int | None = None
        if dead:
            # a seq no row has: the dead letters alone (spool.ack); a spilled one leaves with them
            target = acked_row = f.spooled.seq if f.spooled is not None else meta.seq
            await self.disk.run(lambda: self.spool.ack(target, dead))
        if f.state == "spilling":
            f.acked = True                      # the spill's answer acks its row
            return f.meta
        del self._flights[meta.seq]
        self._acked_bytes += meta.raw_bytes
        if f.state == "spooled":
            assert f.spooled is not None
            if acked_row != f.spooled.seq:
                self.spool.ack_soon(f.spooled.seq)
            return f.spooled
        self.window.acked(f.draft)
        self.room.set()
        self.checkpoints_moved()
        return f.meta

    def checkpoints_moved(self) -> None:
        """Some checkpoint may be written now: the timer task writes it when `_flush_due`."""
        if self.window.has_plan:
            self._look_by(max(self.clock.monotonic(), self._flush_due()))

    def _flush_due(self) -> float:
        wait = CHECKPOINT_EVERY_S if self._acked_bytes >= CHECKPOINT_BYTES else CHECKPOINT_IDLE_S
        return self._flushed_at + wait

    # ---------------------------------------------------------------- spills

    def spill(self, reason: SpillReason) -> asyncio.Future[None] | None:
        """Every batch out from memory (bodies made) goes to the queue in one transaction handed over
        now, with the checkpoints that may move past them; from then on each is a spooled batch."""
        writer = self.writer
        dids = self.window.spill()
        if writer is None or not dids:
            return None
        picked = set(dids)
        flights = [f for f in self._flights.values() if f.state == "memory" and f.draft in picked]
        for f in flights:
            f.state = "spilling"
        self.spilled_total += sum(f.meta.events for f in flights)
        self.events.spilled(reason, len(flights), sum(f.meta.events for f in flights))
        self.room.set()
        written: list[_Flight] = []

        def made() -> list[Made]:
            # at each attempt (a full disk is waited out): those not acknowledged meanwhile
            written[:] = [f for f in flights if not f.acked]
            return [Made(f.body, f.meta.raw_bytes, f.meta.events, f.meta.gzipped, f.meta.covers) for f in written]

        fut = writer.spill(made, self.plan(), lambda out: self._spilled(flights, written, out))
        self._spills.add(fut)
        fut.add_done_callback(self._spills.discard)
        return fut

    def _spilled(self, flights: list[_Flight], written: list[_Flight], out: list[tuple[BatchMeta, bytes]]) -> None:
        for f in flights:
            if f.acked and f not in written:     # acknowledged before the attempt that was written
                del self._flights[f.meta.seq]
        moved: list[tuple[BatchMeta, BatchMeta]] = []
        for f, (meta, _stored) in zip(written, out, strict=True):
            f.state, f.spooled = "spooled", meta
            if f.acked:
                del self._flights[f.meta.seq]
                self.spool.ack_soon(meta.seq)
            else:
                moved.append((f.meta, meta))
                f.body = b""            # the queue has it; a sender out with it holds its own
        self.outbox.spilled(moved)

    def _spill_deadline(self) -> float | None:
        at = self.window.oldest_at()
        return None if at is None else at + self.spill_after_s

    # ---------------------------------------------------------------- the timer task

    def _look_by(self, when: float | None) -> None:
        if when is not None and when < self._wake_at:
            self._wake_at = when
            self.changed.set()

    async def run(self, done: asyncio.Event, flush: Callable[[list[Checkpoint]], asyncio.Future[None]]) -> None:
        """Spill what waited `spill_after` for its ack, and write the checkpoints acks moved when
        `_flush_due` (`flush` hands a checkpoint-only write to the writer). Ends once
        `done` is set (everything delivered), after the last checkpoints are written."""
        last: asyncio.Future[None] | None = None
        while True:
            now = self.clock.monotonic()
            if spill_due(self.window.oldest_at(), now, self.spill_after_s):
                self.spill("late")
            finished = done.is_set()
            if self.window.has_plan and (finished or now >= self._flush_due()):
                self._flushed_at, self._acked_bytes = now, 0
                last = flush(self.plan())
            if finished:
                if self._spills:
                    await asyncio.gather(*self._spills)
                    continue        # their checkpoints may have moved others'
                if last is not None:
                    await last
                return
            due = [t for t in (self._spill_deadline(),
                               self._flush_due() if self.window.has_plan else None)
                   if t is not None]
            self._wake_at = min(due) if due else float("inf")
            self.changed.clear()
            if due:
                await self.clock.wait(self.changed, max(0.0, self._wake_at - now))
            else:
                await self.changed.wait()

    async def settle(self, flush: Callable[[list[Checkpoint]], asyncio.Future[None]]) -> None:
        """Stopping before everything was acknowledged: what is out from memory goes to the queue (a
        restart sends it from there) and the checkpoints that may move are written."""
        fut = self.spill("stop")
        if fut is not None:
            await fut
        if self.window.has_plan:
            await flush(self.plan())
