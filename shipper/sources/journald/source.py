"""The journal as a Source: reader.py's entries -> events in the writer's draft, the cursor of the
last one taken its checkpoint (in the same spool transaction as the events). The reader fills a
bounded buffer in a task of its own; `read_round` never blocks. The files' headers watched (quiet.py):
the head looked at when they changed (lag), journalctl asked again when it holds an entry back."""

from __future__ import annotations

import asyncio
import dataclasses
from collections import OrderedDict, deque
from collections.abc import Mapping

from shipper.clock import Clock
from shipper.config import Config
from shipper.events import Events
from shipper.model import Checkpoint, Draft, FileStatus, JournalStatus
from shipper.parse.document import DocBuilder
from shipper.sources.base import Drafts, DropCounter, Progress, Room, lowest_unshipped
from shipper.sources.journald.cursor import Cursor, is_behind, journal_lag, parse_cursor
from shipper.sources.journald.entries import JournalAssembler, JournalEntry, source_event
from shipper.sources.journald.headers import JournalFiles
from shipper.sources.journald.probe import JOURNALCTL
from shipper.sources.journald.quiet import QuietCheck
from shipper.sources.journald.reader import JournalReader, JournalReaderConfig

MAX_BUFFER_ENTRIES = 8192        # read from the child, not yet in a draft; beyond it the child's pipe fills
MAX_BUFFER_BYTES = 16 * 1024 * 1024
TAKE_CHUNK = 512                 # entries built per call (the draft's room is looked at between chunks)
MIN_TAKE = 64                    # taken even into a full draft, as a file read takes its 4 KiB minimum
POSITIONS_KEPT = 4096            # committed positions remembered to name the acknowledged cursor


def journal_path(directory: str | None) -> str:
    """The readable name a journald input's checkpoint carries as its path."""
    return "journald:" + (directory or "system")


class JournaldSource:
    """One journald input behind the `Source` seam. `checkpoint` is the one the spool holds for
    this input's key (None: never read; then start_at decides)."""

    def __init__(self, cfg: Config, idx: int, checkpoint: Checkpoint | None, writer: Drafts, events: Events,
                 clock: Clock, host_name: str, executable: str = JOURNALCTL) -> None:
        inp = cfg.inputs[idx]
        self.rcfg = JournalReaderConfig.from_input(inp, executable)
        self.key = self.rcfg.key
        self.writer = writer
        self.events = events
        self.clock = clock
        self.builder = DocBuilder(inp, cfg.output.index, host_name)
        self.drops = DropCounter(self.builder, self.key, events)
        self.assembler = JournalAssembler(inp.multiline)
        if checkpoint is None:
            checkpoint = Checkpoint(self.key, journal_path(self.rcfg.directory), 0, 0, 0, "", 0)
        self.cp = checkpoint
        self.reader = JournalReader(self.rcfg, position=checkpoint.cursor, clock=clock, events=events)
        self._buf: deque[JournalEntry] = deque()
        self._buf_bytes = 0
        self.max_buffer_entries = MAX_BUFFER_ENTRIES
        self.max_buffer_bytes = MAX_BUFFER_BYTES
        self._space = asyncio.Event()
        self.is_reading_paused = False           # the buffer is full: the child's pipe fills, journalctl waits
        self._wake: asyncio.Event | None = None
        self._pump: asyncio.Task[None] | None = None
        self._watch: asyncio.Task[None] | None = None
        self._last_arrival = float("-inf")       # monotonic: when the pump last buffered entries
        self._head: Cursor | None = None         # the journal's newest matching entry, as last looked at
        self._head_known = False
        # committed positions by seqnum: `shipped` names the acknowledged one by its seqnum only
        self._positions: OrderedDict[int, Cursor] = OrderedDict()
        stored = parse_cursor(checkpoint.cursor) if checkpoint.cursor else None
        if stored is not None:
            self._positions[stored.seqnum] = stored
        self.read_total = 0

    exhausted = False

    @property
    def buffered(self) -> int:
        """Entries read from the child and not yet taken into a draft."""
        return len(self._buf)

    # ---------------------------------------------------------------- the seam

    async def start(self, wake: asyncio.Event) -> None:
        """Start journalctl (from the stored cursor, or as start_at says), then read it in a task."""
        self._wake = wake
        await self.reader.open()
        sp = self.reader.start_position
        if self.cp.cursor is None and sp is not None:
            # start_at end: "now" is the newest entry at start; committed without events, so a
            # restart before the first entry arrives resumes here instead of at a later end
            self._move(sp, self.clock.time())
            self.writer.stage(self.cp)
        self._pump = asyncio.create_task(self._read_child(), name=f"journal {self.key}")
        self._watch = asyncio.create_task(self._watch_journal(), name=f"journal files {self.key}")

    async def tick(self, now: float) -> None:
        self._raise_if_failed()

    def read_round(self, room: Room, now_wall: float, now_mono: float) -> Progress:
        """Entries from the buffer into the draft while it has room (at least MIN_TAKE)."""
        self._raise_if_failed()
        buf = self._buf
        if not buf:
            return Progress(False, False)
        draft = self.writer.draft
        if draft.empty():
            draft.started = now_mono
        taken = 0
        while buf:
            n = min(len(buf), TAKE_CHUNK, room.max_events - draft.events)
            if n <= 0:
                if taken:
                    break
                n = min(len(buf), MIN_TAKE)
            entries = [buf.popleft() for _ in range(n)]
            self._buf_bytes -= sum(len(e.message) for e in entries)
            self._take(self.assembler.feed(entries, now_mono), now_wall)
            taken += n
            if draft.events >= room.full_events or draft.nbytes >= room.max_bytes:
                break
        self._space.set()
        full = draft.events >= room.full_events or draft.nbytes >= room.max_bytes
        return Progress(True, bool(buf) or full)

    def flush_due(self, now_mono: float) -> None:
        """Held multiline groups whose last entry was read `timeout` ago on our clock, once the
        buffer is taken (a continuation read meanwhile joins its group first). Never by the
        entries' own stamps: one stamped an hour ahead would hold its group for that hour."""
        if self.assembler.next_deadline is None or self._buf:
            return
        events = self.assembler.flush_due(now_mono)
        if events:
            draft = self.writer.draft
            if draft.empty():
                draft.started = now_mono
            self._take(events, self.clock.time())

    async def check(self, now_mono: float) -> None:
        self._raise_if_failed()

    def next_deadline(self) -> float | None:
        return self.assembler.next_deadline

    def pause_watch(self) -> None:
        """Nothing to pause: what arrives meanwhile waits in the buffer."""

    def resume_watch(self) -> None:
        """Nothing to resume (see pause_watch)."""

    def drain_watch(self) -> None:
        """Nothing to drain (see pause_watch)."""

    async def stop(self) -> None:
        """Stop the child; what it printed and the buffer holds goes into the draft (the rest is
        read again after the committed cursor at the next start). Held multiline groups are not
        completed: the committed cursor stays before them, so they are read again whole."""
        for task in (self._watch, self._pump):
            if task is not None and not task.done():
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)   # a failure was raised by read_round
        if self._buf:
            draft = self.writer.draft
            if draft.empty():
                draft.started = self.clock.monotonic()
            entries = list(self._buf)
            self._buf.clear()
            self._buf_bytes = 0
            self._take(self.assembler.feed(entries, self.clock.monotonic()), self.clock.time())
        await self.reader.close()

    def close(self) -> None:
        for task in (self._watch, self._pump):
            if task is not None and not task.done():
                task.cancel()
        self.reader.kill()

    def status(self, shipped: Mapping[str, int], writing: list[Draft]) -> list[FileStatus]:
        """No file rows: a journald input shows in `journal_status` (status' `journald` list)."""
        return []

    def bytes_at_risk(self) -> int:
        return 0

    def steady_key(self) -> None:
        return None

    @property
    def watching(self) -> bool:
        """False: the reader loop's poll keeps its pace while journalctl runs."""
        return False

    # ---------------------------------------------------------------- status

    def journal_status(self, shipped: Mapping[str, int], writing: list[Draft]) -> JournalStatus:
        """The input's row in `shipper status` (`journald`): the queued cursor, the acknowledged
        one, and how far the acknowledged one is behind the journal's newest matching entry."""
        cp = self.cp
        acked = lowest_unshipped(cp.incarnation, cp.offset, shipped, [*writing, self.writer.draft])
        pos = self._positions
        while len(pos) > 1 and next(iter(pos)) != acked and acked in pos:
            pos.popitem(last=False)
        queued = parse_cursor(cp.cursor) if cp.cursor else None
        shipped_cursor = pos.get(acked)
        head = self._newest()
        if head is None:
            lag_entries, lag_s = (0, 0.0) if self._head_known else (None, None)   # known: nothing matches
        elif shipped_cursor is not None:
            lag = journal_lag(head, shipped_cursor)
            lag_entries, lag_s = lag.entries, lag.seconds
        elif queued is not None and queued.seqnum_id == head.seqnum_id:
            lag_entries, lag_s = max(0, head.seqnum - acked), None
        else:
            lag_entries, lag_s = None, None
        r = self.reader
        return JournalStatus(self.key, self.rcfg.directory, self.rcfg.units, cp.cursor,
                             shipped_cursor.text if shipped_cursor is not None else None, lag_entries, lag_s,
                             self.read_total, r.gaps, r.entries_lost, r.restarts)

    def _newest(self) -> Cursor | None:
        """The newer of the last look at the journal's head and the last entry read."""
        head, last = self._head, self.reader.last_cursor
        if last is None:
            return head
        if head is None or (head.seqnum_id == last.seqnum_id and last.seqnum > head.seqnum):
            return last
        return head

    # ---------------------------------------------------------------- inside

    def _take(self, entries: list[JournalEntry], now_wall: float) -> None:
        """Events into the draft, and the position that is safe now with them."""
        draft = self.writer.draft
        if entries:
            n0 = len(draft.parts)
            draft.nbytes += self.builder.build_source([source_event(e) for e in entries], draft.parts, now_wall)
            draft.events += len(draft.parts) - n0
            self.drops.report()
            self.read_total += len(entries)
            self.events.lines_read(self.cp.path, len(entries), 0)
        pos = self.assembler.position
        cp = self.cp
        if pos is not None and pos.text != cp.cursor:
            # the range covered starts at the last position queued; at the very first, just
            # before the first entry taken (the "offset" of an entry is its seqnum)
            if cp.cursor is not None:
                start = cp.offset
            else:
                start = min(entries[0].cursor.seqnum - 1, pos.seqnum) if entries else pos.seqnum
            draft.cover(cp.incarnation, start, pos.seqnum)
            self._move(pos, now_wall)
            draft.checkpoints[cp.incarnation] = dataclasses.replace(cp)

    def _move(self, pos: Cursor, now_wall: float) -> None:
        cp = self.cp
        cp.offset = pos.seqnum
        cp.cursor = pos.text
        cp.updated = now_wall
        self._positions[pos.seqnum] = pos
        self._positions.move_to_end(pos.seqnum)
        while len(self._positions) > POSITIONS_KEPT:
            self._positions.popitem(last=False)

    async def _read_child(self) -> None:
        """The background reader: the child's entries into the buffer until it is full."""
        while True:
            while len(self._buf) >= self.max_buffer_entries or self._buf_bytes >= self.max_buffer_bytes:
                self._space.clear()
                self.is_reading_paused = True
                await self._space.wait()
            self.is_reading_paused = False
            batch = await self.reader.read()
            if not batch:
                return
            self._buf.extend(batch)
            self._buf_bytes += sum(len(e.message) for e in batch)
            self._last_arrival = self.clock.monotonic()
            if self._wake is not None:
                self._wake.set()

    async def _watch_journal(self) -> None:
        """The journal files' headers, once a second while idle (quiet.py): the newest matching entry
        looked at when they changed (lag); once they settled with journalctl silent, an entry newer
        than the last it printed is one it holds back (a lost wake-up), and it is asked again."""
        files = JournalFiles(self.rcfg.directory)
        quiet = QuietCheck()
        reader = self.reader
        while True:
            marks = await asyncio.to_thread(files.marks)
            now = self.clock.monotonic()
            busy_at = now if self.is_reading_paused else max(self._last_arrival, reader.started_at)
            step = quiet.observe(now, marks, busy_at, reader.printed)
            if step.look:
                try:
                    self._head = await reader.head()
                    self._head_known = True
                except OSError:
                    self._head, self._head_known = None, False
            position = reader.position
            if step.check and self._head is not None and is_behind(self._head, position) and reader.reread():
                self.events.journal_reread(self.key, self._head.text, None if position is None else position.text)
            await self.clock.sleep(quiet.poll_s(now, busy_at))

    def _raise_if_failed(self) -> None:
        """A reading task that died stops the pipeline (its TaskGroup) with the error."""
        for task in (self._pump, self._watch):
            if task is not None and task.done() and not task.cancelled():
                exc = task.exception()
                if exc is not None:
                    raise exc
