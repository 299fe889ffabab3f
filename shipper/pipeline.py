"""The running pipeline: sources -> draft -> draft writer -> spool -> outbox -> senders, composed, and
the one loop that reads. Reading, committing and sending overlap; `start()` returns when every input
is open, `stop(timeout_s)` hands over the last lines; a task that dies stops them all (one TaskGroup)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Any

from shipper.clock import Clock
from shipper.config import Config
from shipper.control import DeadLetterControl
from shipper.delivery import Delivery
from shipper.errors import SpoolFullError
from shipper.events import Events
from shipper.model import FileStatus, JournalStatus, PipelineStatus
from shipper.ship import batching
from shipper.ship import bulk as bulkproto
from shipper.ship.outbox import Outbox
from shipper.ship.sender import Sender
from shipper.sources.base import Room, Source
from shipper.spool.aio import AsyncSpool
from shipper.spool.contents import SpoolContents
from shipper.spool.keeper import MEMORY_MAX_BYTES, Keeper
from shipper.spool.writer import DiskWait, DraftWriter

log = logging.getLogger("shipper.pipeline")

POLL_S = 0.25                 # fallback look at open files when inotify said nothing
# Quiet and every source watched (inotify wakes the reader on each write): the fallback look
# backs off, doubling from POLL_S up to this, so an idle daemon wakes about once in 2 s, not 4
# times a second. The first read after a wake-up goes back to POLL_S.
IDLE_POLL_S = 2.0


class Pipeline:
    """While one draft is written on the spool thread the loop keeps reading into the next, and a
    batch goes out as soon as a request slot is free, but when caught up at most one partial
    draft per `flush_min_interval`. `flush_interval` only bounds how long a partial draft waits
    while every slot is busy."""

    def __init__(self, cfg: Config, spool: AsyncSpool, contents: SpoolContents, sender: Sender,
                 events: Events, clock: Clock) -> None:
        out = cfg.output
        self.cfg = cfg
        self.spool = spool
        self.sender = sender
        self.events = events
        self.clock = clock
        self.wake = asyncio.Event()
        self.outbox = Outbox(cfg.queue.max_bytes, out.max_in_flight, events)
        self.outbox.restore(contents.pending)
        self.disk = DiskWait(events, clock)
        with_ids = out.document_id == "auto"
        # the file is the first queue (issue 46): what goes out from memory, what is spilled. Memory
        # holds no more than the queue may: a spill of all of it keeps the queue within its bound.
        self.keeper = Keeper(cfg.queue.spool, cfg.queue.spill_after_s, self.outbox, spool, self.disk, events, clock,
                             memory_max_bytes=min(MEMORY_MAX_BYTES, cfg.queue.max_bytes))
        self.writer = DraftWriter(spool, batching.group_parts if with_ids else batching.group_without_ids,
                                   self.outbox.add, self.disk, clock,
                                   max_events=out.bulk_max_events, max_bytes=out.bulk_max_bytes,
                                   gzip=out.compression == "gzip", wake=self.wake, keeper=self.keeper)
        self.keeper.writer = self.writer
        self.delivery = Delivery(self.outbox, sender, spool, self.disk, events, clock, self._all_handed_over,
                                 self.keeper, max_events=out.bulk_max_events, max_bytes=out.bulk_max_bytes)
        self.delivery.on_ack = self._on_ack
        self.control = DeadLetterControl(
            cfg.state_dir, spool, self.disk, events, clock,
            lambda items: bulkproto.dead_letter_bodies(items, out.bulk_max_events, out.bulk_max_bytes, with_ids),
            out.compression == "gzip", lambda batches: self.outbox.add(batches, cache=False))
        self.limits = batching.Limits(out.bulk_max_events, out.bulk_max_bytes, out.flush_interval_s,
                                      out.flush_min_interval_s, out.max_in_flight)
        self.room = Room(out.bulk_max_events, out.bulk_max_bytes, int(out.bulk_max_events * batching.FULL_ENOUGH))
        self.sources: list[Source] = []
        self.ready = asyncio.Event()       # the first read round found every input (files: the first scan)
        self.stopping = asyncio.Event()
        self.reading_done = False          # the final draft is handed over: idle senders may return
        self._read_done = asyncio.Event()
        # the last read round stopped with more to read (a file behind, or the draft full): the
        # draft keeps filling to its limits instead of leaving at once (fewer, fuller requests)
        self.backlog = False
        self._poll_s = POLL_S              # the fallback look's current interval (see IDLE_POLL_S)
        # A steady writer: the watchers stay paused from one read round to the next while rounds
        # keep finding lines, and the reader reads again when flush_min_interval ends (a timer),
        # taking what inotify queued meanwhile; the first round that finds nothing watches again.
        self._held = False
        self._main: asyncio.Task[None] | None = None
        self._stop_control = asyncio.Event()

    def add_source(self, source: Source) -> None:
        self.sources.append(source)

    # ---------------------------------------------------------------- lifecycle

    async def start(self) -> None:
        """Start the tasks; return once every input is open (or raise what stopped the reader)."""
        self._main = asyncio.create_task(self._run(), name="pipeline")
        ready = asyncio.create_task(self.ready.wait())
        await asyncio.wait({ready, self._main}, return_when=asyncio.FIRST_COMPLETED)
        ready.cancel()
        if self._main.done():
            self._main.result()

    @property
    def failed(self) -> BaseException | None:
        """What ended the pipeline's tasks, if one of them died."""
        m = self._main
        if m is None or not m.done() or m.cancelled():
            return None
        return m.exception()

    @property
    def running(self) -> bool:
        return self._main is not None and not self._main.done()

    async def _run(self) -> None:
        async with asyncio.TaskGroup() as tg:
            tg.create_task(self._reader(), name="reader")
            tg.create_task(self.control.run(self._stop_control), name="dead-letter-requests")
            tg.create_task(self._deliver(), name="delivery")

    async def _deliver(self) -> None:
        """The senders, and the keeper's timer beside them: once every sender returned (reading done,
        everything delivered), the keeper writes the last checkpoints and returns too."""
        delivered = asyncio.Event()
        async with asyncio.TaskGroup() as tg:
            tg.create_task(self.keeper.run(delivered, self.writer.flush), name="keeper")
            try:
                async with asyncio.TaskGroup() as senders:
                    for i in range(self.cfg.output.max_in_flight):
                        senders.create_task(self.delivery.worker(), name=f"sender-{i}")
            finally:
                delivered.set()
                self.keeper.changed.set()

    async def stop(self, timeout_s: float, force: asyncio.Event | None = None) -> bool:
        """Stop reading, hand over the last lines with their offsets, deliver for at most timeout_s
        (or until `force`), then cancel what is left and close the files. True if all was delivered."""
        self.stopping.set()
        self.wake.set()               # the reader may be waiting for the next write
        # issue 19: one deadline for everything, a full disk included (a write waiting out a full
        # disk gives up at it; what it held moved no checkpoint and is read again at the next start)
        self.disk.give_up_at = self.clock.monotonic() + max(timeout_s, 0.0)
        # asyncio.wait's timeouts run on the loop's own clock: the rest of the deadline is taken
        # there too (under a test's fake clock, idle waits move the injected time in jumps)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(timeout_s, 0.0)
        main = self._main
        delivered = False
        if main is not None and not main.done():
            waits: set[asyncio.Future[Any]] = {main}
            forced = asyncio.ensure_future(force.wait()) if force is not None else None
            if forced is not None:
                waits.add(forced)
            # the reader's final commit may wait out a full disk: shutdown_timeout bounds it
            reading = asyncio.ensure_future(self._read_done.wait())
            await asyncio.wait({reading, *waits}, timeout=max(timeout_s, 0.0) + 5.0,
                               return_when=asyncio.FIRST_COMPLETED)
            reading.cancel()
            if not main.done():
                await asyncio.wait(waits, timeout=max(0.0, deadline - loop.time()),
                                   return_when=asyncio.FIRST_COMPLETED)
            if forced is not None:
                forced.cancel()
            delivered = main.done() and not main.cancelled() and main.exception() is None
            if not main.done():
                main.cancel()
            await asyncio.gather(main, return_exceptions=True)
        if not delivered:
            await self._settle()
        for s in self.sources:
            s.close()
        return delivered

    async def _settle(self) -> None:
        """Stopped before everything was acknowledged: what went out from memory is written to the
        queue (a restart sends it from there, as it would have been after spill_after), with the
        checkpoints that may move. A full disk gives up at the stop's deadline: then those events
        are read again from their files at the next start."""
        try:
            await self.keeper.settle(self.writer.flush)
        except Exception as e:
            log.error("in-flight events not written at stop; they are read again at the next start",
                      extra={"error": str(e)})

    def _all_handed_over(self) -> bool:
        done = self.reading_done and self.writer.draft.empty() and not self.writer.committing
        if done:
            self._stop_control.set()
        return done

    def _on_ack(self) -> None:
        if not self.writer.draft.empty():
            self.wake.set()     # a draft held back for a free slot may go now (nothing else waits on an ack)

    # ---------------------------------------------------------------- committing

    def should_commit(self) -> bool:
        w = self.writer
        d = w.draft
        return batching.should_commit(
            batching.DraftState(d.events, d.nbytes, d.started, d.empty()), self.limits, self.clock.monotonic(),
            backlog=self.backlog, committing=w.committing, in_flight=self.outbox.in_flight,
            outbox_empty=not len(self.outbox), last_commit_at=w.last_commit_at)

    # ---------------------------------------------------------------- the reader loop

    async def _reader(self) -> None:
        try:
            for s in self.sources:
                await s.start(self.wake)
            await self._read_until_stopped()
        finally:
            await self._finish_reading()

    async def _read_until_stopped(self) -> None:
        """Tick, read, commit; sleep only when there is nothing to read, until inotify, a write to
        the outbox or the poll tick wakes us. The one place the reader waits is `clock.wait`."""
        last_check = float("-inf")
        ob = self.outbox
        while not self.stopping.is_set():
            now = self.clock.monotonic()
            for s in self.sources:
                await s.tick(now)
            self.ready.set()
            if ob.is_full():
                # backpressure: reading pauses (the files are the buffer), what was read still goes
                ob.pause()
                if self.should_commit():
                    await self.writer.commit()
                await self.clock.wait(ob.space, POLL_S * 4)
                continue
            ob.resume()
            self.wake.clear()
            now_wall, now = self.clock.time(), self.clock.monotonic()
            progressed, backlog = False, False
            for s in self.sources:
                p = s.read_round(self.room, now_wall, now)
                progressed, backlog = progressed or p.read, backlog or p.backlog
                s.flush_due(now)
            self.backlog = backlog
            if progressed:
                self._poll_s = POLL_S
            elif self._held:
                self._watch_again()
            if self.should_commit():
                await self.writer.commit(wait=False)    # written on the spool thread while we read on
            now = self.clock.monotonic()
            if not progressed or now - last_check >= self._poll_s:
                for s in self.sources:
                    await s.check(now)
                last_check = now
            if progressed and backlog:
                await asyncio.sleep(0)       # more to read: let senders and acks run between chunks
                continue
            if all(s.exhausted for s in self.sources) and self.sources and self.writer.draft.empty():
                await self.clock.wait(self.stopping, POLL_S)
                continue
            await self._idle(now)

    async def _idle(self, now: float) -> None:
        """Every source read got less than it asked for (at its end): the next bytes come with a
        wake-up (or the poll tick), so no second read at the end before waiting."""
        out = self.cfg.output
        timeout = self._poll_s
        pace = self.writer.last_commit_at + out.flush_min_interval_s - now
        if self._held:
            if pace > 0 and not self.stopping.is_set():
                await self._read_again_in(pace)
                return
            self._watch_again()
        d = self.writer.draft
        if not d.empty():
            timeout = min(timeout, max(0.005, d.started + out.flush_interval_s - now))
            if pace > 0:
                timeout = min(timeout, pace)      # held back by the gap only: goes when it ends
        for s in self.sources:
            dl = s.next_deadline()
            if dl is not None:
                timeout = min(timeout, max(0.005, dl - now))
        woken = await self.clock.wait(self.wake, timeout, coalesce=timeout >= self._poll_s)
        if not woken and timeout >= self._poll_s and self.sources \
                and all(s.watching for s in self.sources):
            self._poll_s = min(IDLE_POLL_S, self._poll_s * 2)   # a quiet poll tick: look less often
        if woken:
            pace = self.writer.last_commit_at + out.flush_min_interval_s - self.clock.monotonic()
            if pace > 0 and not self.stopping.is_set():
                # written to within flush_min_interval of the last draft: read it all when the
                # interval ends, not write by write (the watchers' events merge in the kernel)
                for s in self.sources:
                    s.pause_watch()
                self._held = True
                await self._read_again_in(pace)

    async def _read_again_in(self, delay_s: float) -> None:
        """Held: sleep out the gap, then take what the paused watchers queued (still paused)."""
        try:
            await self.clock.sleep(delay_s)
        except BaseException:
            self._watch_again()
            raise
        for s in self.sources:
            s.drain_watch()

    def _watch_again(self) -> None:
        self._held = False
        for s in self.sources:
            s.resume_watch()

    async def _finish_reading(self) -> None:
        """Stopping: take the last complete lines with their offsets and hand over one final draft.
        A full disk must not hold the stop past shutdown_timeout: a draft not written moved no
        checkpoint, so its lines are simply read again at the next start."""
        try:
            for s in self.sources:
                await s.stop()
            if self.disk.give_up_at is None:
                self.disk.give_up_at = self.clock.monotonic() + self.cfg.shutdown_timeout_s
            try:
                await self.writer.commit()
            except SpoolFullError:
                log.error("final commit abandoned: state_dir is full; the lines are read again at the next start")
        finally:
            self.reading_done = True
            self._read_done.set()
            self.outbox.wake_all()

    # ---------------------------------------------------------------- status

    _rows_key: tuple[Any, ...] | None = None
    _rows: tuple[tuple[FileStatus, ...], tuple[JournalStatus, ...], int] = ((), (), 0)

    def _source_rows(self, extra: Sequence[Source]) -> tuple[tuple[FileStatus, ...], tuple[JournalStatus, ...], int]:
        """Every source's status rows (files, journals); the last ones again (the same tuples)
        while nothing they show can have moved: every source steady (`steady_key`, all its files
        quiet; a journald source never is), the same opens, closes and checkpoint moves (a draft's
        ranges move only with them), no change in the queue, no draft being written. An idle
        daemon with 1,000 files then makes no row per tick. With the rows: the sources' bytes at
        risk (steady, no file is renamed, deleted or a copy, so they are the same too)."""
        writing = self.writer.writing()
        key: tuple[Any, ...] | None = None
        if not extra and not writing:
            keys = [s.steady_key() for s in self.sources]
            if all(k is not None for k in keys):
                key = (*keys, self.outbox.changes)
                if key == self._rows_key:
                    return self._rows
        shipped = self.outbox.shipped_offsets()
        rows = tuple(row for s in [*self.sources, *extra] for row in s.status(shipped, writing))
        journald = tuple(j for s in self.sources if (j := s.journal_status(shipped, writing)) is not None)
        risk = sum(s.bytes_at_risk() for s in self.sources)
        self._rows_key, self._rows = key, (rows, journald, risk)
        return self._rows

    def snapshot(self, extra: Sequence[Source] = ()) -> PipelineStatus:
        files, journald, at_risk = self._source_rows(extra)
        ob = self.outbox
        snd = self.sender
        return PipelineStatus(
            files=files, queue_events=ob.queue_events, queue_bytes=ob.queue_bytes,
            dead_letters=self.spool.dead_letters, output_up=snd.up, last_error=snd.last_error,
            last_success=snd.last_success, hosts=tuple(h.label for h in snd.client.hosts),
            bytes_at_risk=at_risk,
            read_total=sum(s.read_total for s in self.sources), shipped_total=ob.shipped_total,
            paused=ob.paused, in_flight=ob.in_flight,
            drained=ob.queue_events == 0 and ob.memory_events == 0 and self.writer.draft.empty()
            and not self.writer.committing and not ob.in_flight, journald=journald,
            memory_events=ob.memory_events, memory_bytes=ob.memory_bytes, spool=self.cfg.queue.spool)
