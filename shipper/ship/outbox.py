"""Batches waiting for a sender: the queue's accounting and backpressure. The draft writer adds what
the spool stored, senders take in order and report each ack; only what they take next keeps its
body in memory (a backlog is re-read from the spool), so memory stays flat. Never touches the spool."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Iterable

from shipper.events import Events
from shipper.model import BatchMeta
from shipper.ship.merge import take_count

BODY_CACHE_BYTES = 8 * 1024 * 1024    # batch bodies kept in memory for the senders; beyond: re-read
RESUME_FRACTION = 0.75        # paused reading resumes when the queue is below this share of max_bytes


class Outbox:
    def __init__(self, max_queue_bytes: int, max_in_flight: int, events: Events) -> None:
        self.max_queue_bytes = max_queue_bytes
        self.max_in_flight = max(1, max_in_flight)
        self.events = events
        self._waiting: deque[tuple[BatchMeta, bytes | None]] = deque()
        self.pending: dict[int, BatchMeta] = {}      # every queued batch not yet acked (in flight too)
        self.queue_events = 0       # spooled batches (in the queue on disk) not yet acked
        self.queue_bytes = 0
        self.memory_events = 0      # batches sent from memory (negative seqs) not yet acked nor spilled
        self.memory_bytes = 0
        self.cached_bytes = 0
        self.in_flight = 0
        self.shipped_total = 0
        self.changes = 0            # bumped whenever `pending` changes (what shipped_offsets() says)
        # idle senders, first come first woken: a batch added wakes one of them (`wait_for_batch`)
        self._idle: deque[asyncio.Future[None]] = deque()
        self.space = asyncio.Event()
        self.paused = False

    def __len__(self) -> int:
        return len(self._waiting)

    def restore(self, pending: Iterable[BatchMeta]) -> None:
        """At start: what the spool still holds, in order (bodies are read when sent)."""
        for meta in pending:
            self._queue(meta, None)
        self._wake(len(self._waiting))

    def add(self, batches: list[tuple[BatchMeta, bytes]], *, cache: bool = True) -> None:
        for meta, stored in batches:
            keep = cache and len(self._waiting) < self.max_in_flight and \
                self.cached_bytes + len(stored) <= BODY_CACHE_BYTES
            self._queue(meta, stored if keep else None)
            self.events.events_queued(meta.events, meta.stored_bytes)
        if batches:
            self._wake(len(batches))
            self.events.queue_state(self.queue_events, self.queue_bytes)

    def add_memory(self, batches: list[tuple[BatchMeta, bytes]]) -> None:
        """Batches sent from memory (spool/keeper.py): their bodies are nowhere else."""
        for meta, body in batches:
            self._waiting.append((meta, body))
            self.pending[meta.seq] = meta
            self.memory_events += meta.events
            self.memory_bytes += meta.stored_bytes
        self.changes += 1
        self._wake(len(batches))

    def spilled(self, moved: list[tuple[BatchMeta, BatchMeta]]) -> None:
        """Batches sent from memory are in the queue now, under these seqs: a sender that takes one
        later acks it in the spool; one out already is found by the keeper. Bodies stay where they are."""
        if not moved:
            return
        to = {old.seq: new for old, new in moved}
        for old, new in moved:
            if self.pending.pop(old.seq, None) is not None:
                self.memory_events -= old.events
                self.memory_bytes -= old.stored_bytes
                self.pending[new.seq] = new
                self.queue_events += new.events
                self.queue_bytes += new.stored_bytes
        for i, (meta, body) in enumerate(self._waiting):
            spooled = to.get(meta.seq)
            if spooled is not None:
                # a body stays only where a spooled one would be cached: memory goes flat with the spill
                keep = body is not None and i < self.max_in_flight and \
                    self.cached_bytes + len(body) <= BODY_CACHE_BYTES
                self._waiting[i] = (spooled, body if keep else None)
                if keep and body is not None:
                    self.cached_bytes += len(body)
        self.changes += 1
        self.events.queue_state(self.queue_events, self.queue_bytes)

    # ---------------------------------------------------------------- idle senders

    def wait_for_batch(self) -> asyncio.Future[None]:
        """For an idle sender: done when a batch it may take was added (another sender coming back
        from a request may take it first: look again), or at `wake_all`. A batch wakes one idle
        sender, not all of them, and a sender coming back from an ack takes the next batch
        without waiting (issue 14: one wake-up per batch, where a lock handed from one idle sender
        to the next woke a second one for every batch)."""
        fut = asyncio.get_running_loop().create_future()
        self._idle.append(fut)
        return fut

    def pass_wake_on(self, fut: asyncio.Future[None]) -> None:
        """A sender stops waiting (cancelled): the wake it may have been given goes to the next one."""
        try:
            self._idle.remove(fut)
        except ValueError:           # woken already: that wake is someone else's now
            if fut.done() and not fut.cancelled():
                self._wake(1)

    def wake_all(self) -> None:
        """Every idle sender looks again (reading is done: they may have to return)."""
        self._wake(len(self._idle))

    def _wake(self, n: int) -> None:
        idle = self._idle
        while n > 0 and idle:
            fut = idle.popleft()
            if not fut.done():
                fut.set_result(None)
                n -= 1

    def _queue(self, meta: BatchMeta, body: bytes | None) -> None:
        self._waiting.append((meta, body))
        self.pending[meta.seq] = meta
        self.changes += 1
        self.queue_events += meta.events
        self.queue_bytes += meta.stored_bytes
        if body is not None:
            self.cached_bytes += len(body)

    def take(self) -> tuple[BatchMeta, bytes | None]:
        """The next batch for a sender (which then holds a request slot until `done`)."""
        meta, body = self._waiting.popleft()
        if body is not None and meta.seq > 0:
            self.cached_bytes -= len(body)
        self.in_flight += 1
        return meta, body

    def take_group(self, max_events: int, max_bytes: int) -> list[tuple[BatchMeta, bytes | None]]:
        """The next batch and those behind it that fit with it in one request (`merge.take_count`):
        several only when several wait, which is when every slot was busy (behind). One request
        slot until `done`; each batch is acked on its own."""
        n = take_count((meta for meta, _ in self._waiting), max_events, max_bytes)
        group = [self._waiting.popleft() for _ in range(n)]
        for meta, body in group:
            if body is not None and meta.seq > 0:
                self.cached_bytes -= len(body)
        self.in_flight += 1
        return group

    def done(self) -> None:
        self.in_flight -= 1

    def acked(self, meta: BatchMeta, delivered: int) -> None:
        """The spool dropped the batch: Elasticsearch acknowledged (or dead-lettered) every document."""
        self._forget(meta)
        self.shipped_total += delivered
        self.events.queue_state(self.queue_events, self.queue_bytes)
        if self.paused and self.has_space():
            self.space.set()

    def lost(self, meta: BatchMeta) -> None:
        """The spool no longer holds it (cannot happen: one transaction writes body and metadata)."""
        self._forget(meta)

    def _forget(self, meta: BatchMeta) -> None:
        if self.pending.pop(meta.seq, None) is not None:
            self.changes += 1
            if meta.seq < 0:
                self.memory_events -= meta.events
                self.memory_bytes -= meta.stored_bytes
            else:
                self.queue_events -= meta.events
                self.queue_bytes -= meta.stored_bytes

    # ---------------------------------------------------------------- backpressure

    def is_full(self) -> bool:
        """Reading pauses at queue.max_bytes and resumes below RESUME_FRACTION of it, so a slow
        output does not flip reading on and off at every ack."""
        return self.queue_bytes >= self.max_queue_bytes or (self.paused and not self.has_space())

    def has_space(self) -> bool:
        return self.queue_bytes <= self.max_queue_bytes * RESUME_FRACTION

    def pause(self) -> None:
        if not self.paused:
            self.paused = True
            self.events.backpressure(True, self.queue_bytes)
        self.space.clear()

    def resume(self) -> None:
        if self.paused:
            self.paused = False
            self.events.backpressure(False, self.queue_bytes)

    def shipped_offsets(self) -> dict[str, int]:
        """Per incarnation: the lowest start of a range not yet acknowledged."""
        out: dict[str, int] = {}
        for meta in self.pending.values():
            for inc, (start, _end) in meta.covers.items():
                if inc not in out or start < out[inc]:
                    out[inc] = start
        return out
