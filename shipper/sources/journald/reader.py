"""journalctl --follow as an asyncio child: bounded reads of its stdout, entries decoded, resumed
from a cursor, gaps reported once, the child restarted with backoff; faults go to Events. Keeps
nothing on disk (the cursor comes from the spool); decisions are cursor.py's and entries.py's."""

from __future__ import annotations

import asyncio
import random
import subprocess
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass

import orjson

from shipper.clock import Clock, SystemClock
from shipper.config import InputConfig
from shipper.events import Events
from shipper.ship.backoff import Backoff
from shipper.sources.journald.cursor import (
    OUTPUT_FIELDS,
    Cursor,
    Gap,
    JournalLag,
    SeqnumTracker,
    StartAt,
    classify_exit,
    follow_argv,
    journal_key,
    journal_lag,
    parse_cursor,
    probe_argv,
    resume_gap,
    same_entry,
)
from shipper.sources.journald.entries import JournalEntry, LineSplitter, decode_entry
from shipper.sources.journald.probe import (
    JOURNALCTL,
    JournalDirRefused,
    child_env,
    cursor_of,
    journal_directory,
    read_head,
)

_STDERR_KEEP = 4096


@dataclass(frozen=True, slots=True)
class JournalReaderConfig:
    """A journald input's reader settings, in seconds and bytes."""

    directory: str | None = None
    units: tuple[str, ...] = ()
    start_at: StartAt = "beginning"
    max_message_bytes: int = 1024 * 1024      # MESSAGE is cut here and flagged, as a file line at max_line_bytes
    executable: str = JOURNALCTL
    chunk_bytes: int = 256 * 1024             # one read of the child's stdout
    max_entry_bytes: int = 64 * 1024 * 1024   # a JSON line longer than this is skipped (and counted)
    restart_initial_s: float = 0.5
    restart_max_s: float = 30.0
    output_fields: tuple[str, ...] | None = OUTPUT_FIELDS   # None: every field (more JSON to print and parse)

    @property
    def key(self) -> str:
        return journal_key(self.directory, self.units)

    @classmethod
    def from_input(cls, inp: InputConfig, executable: str = JOURNALCTL) -> JournalReaderConfig:
        if inp.journald is None:
            raise ValueError("not a journald input")
        return cls(directory=inp.journald.directory, units=inp.journald.units, start_at=inp.start_at,
                   max_message_bytes=inp.max_line_bytes, executable=executable)


class JournalReader:
    """Entries of one journald input, in journal order, each handed out once per process.

    `position` is the cursor stored with the last committed events (None: never read; then
    `start_at` decides). `read()` waits for the next entries and is safe to cancel (nothing
    is consumed that is not returned later). The child is restarted from the last entry handed
    out, inclusively, when it dies; a stored cursor the journal no longer holds is reported as
    a gap (`JournalEvents.journal_gap`) and reading continues from the oldest entry after it.
    """

    def __init__(self, cfg: JournalReaderConfig, *, position: str | None = None, clock: Clock | None = None,
                 events: Events | None = None, rng: random.Random | None = None) -> None:
        self.cfg = cfg
        self.key = cfg.key
        self.clock: Clock = clock or SystemClock()
        self.events = events or Events()
        self._rng = rng or random.Random()
        self._backoff = Backoff(cfg.restart_initial_s, cfg.restart_max_s)
        self._stored_text = position
        self._last: Cursor | None = None          # the last entry handed out
        self._expect: Cursor | None = None        # the entry the current child should start with
        self._from_oldest = False                 # the stored cursor was unusable: start at the oldest entry
        self._tracker = SeqnumTracker() if not cfg.units else None
        self._splitter = LineSplitter(cfg.max_entry_bytes)
        self._proc: asyncio.subprocess.Process | None = None
        self._stderr: deque[bytes] = deque()
        self._stderr_task: asyncio.Task[None] | None = None
        self._raw: deque[bytes] = deque()         # lines read, not yet decoded
        self._ready: list[JournalEntry] = []      # entries decoded, not yet handed out
        self._attempt = 0                         # consecutive child exits without output
        self._delay_s = 0.0                       # to wait before the next child
        self._started = False
        self._closed = False
        self._rereading = False                   # the child is being ended to be started again at once
        self._from: Cursor | None = None          # the entry the current child started from
        # per sequence-number id, the newest seqnum journalctl printed (or a child started from)
        self.printed: dict[str, int] = {}
        self.started_at = float("-inf")           # monotonic: when the current child was started
        # start_at end without a stored cursor: the journal's newest entry when reading began.
        # The pipeline may commit it at once (a position without events), so that a restart
        # of the daemon before the first entry arrives resumes here instead of at a new end.
        self.start_position: Cursor | None = None
        self.restarts = 0
        self.rereads = 0
        self.gaps = 0
        self.entries_lost = 0
        self.skipped = 0
        self.entries_read = 0

    @property
    def last_cursor(self) -> Cursor | None:
        """The cursor of the last entry handed out by `read()`."""
        return self._last

    @property
    def position(self) -> Cursor | None:
        """Where journalctl stands: the last entry handed out, else the one the child started from."""
        return self._last if self._last is not None else self._from

    @property
    def pid(self) -> int | None:
        """The child journalctl's pid while it runs (tests kill it)."""
        return self._proc.pid if self._proc is not None and self._proc.returncode is None else None

    # ------------------------------------------------------------ reading

    async def read(self) -> list[JournalEntry]:
        """The next entries (at least one), as soon as the child printed them. [] once closed."""
        while not self._closed:
            if self._raw:
                await self._decode()
            if self._ready:
                out, self._ready = self._ready, []
                self._last = out[-1].cursor
                self.entries_read += len(out)
                return out
            proc = self._proc
            if proc is None:
                await self._start_child()
                continue
            assert proc.stdout is not None
            chunk = await proc.stdout.read(self.cfg.chunk_bytes)
            if not chunk:
                await self._child_ended(proc)
                continue
            lines, dropped = self._splitter.feed(chunk)
            for _ in range(dropped):
                self._skip(f"entry over {self.cfg.max_entry_bytes} bytes")
            if lines:
                self._attempt = 0
                self._raw.extend(lines)
        return []

    async def entries(self) -> AsyncIterator[list[JournalEntry]]:
        """`read()` as an async iterator, until closed."""
        while True:
            batch = await self.read()
            if not batch:
                return
            yield batch

    def _skip(self, reason: str) -> None:
        self.skipped += 1
        self.events.journal_entry_skipped(self.key, reason)

    def _gap(self, gap: Gap) -> None:
        self.gaps += 1
        self.entries_lost += gap.lost_entries or 0
        self.events.journal_gap(self.key, gap)

    async def _decode(self) -> None:
        """Raw lines -> entries in `_ready`, one line at a time so a cancellation (during a probe)
        leaves every line either decoded or still queued."""
        raw = self._raw
        loads = orjson.loads
        max_msg = self.cfg.max_message_bytes
        tracker = self._tracker
        while raw:
            try:
                obj = loads(raw[0])
            except orjson.JSONDecodeError:
                raw.popleft()
                self._skip("invalid JSON")
                continue
            entry = decode_entry(obj, max_msg)
            if isinstance(entry, str):
                raw.popleft()
                self._skip(entry)
                continue
            c = entry.cursor
            expect = self._expect
            if expect is not None:
                if same_entry(c, expect):
                    raw.popleft()                 # resumed inclusively: this one was read before
                    self._expect = None
                    continue
                # the first entry is not the one resumed from: was it vacuumed? Without a unit
                # filter this entry says it; with one, the unfiltered journal is asked
                first = c if not self.cfg.units else await self._first_at(expect)
                gap = resume_gap(expect, first)
                self._expect = None
                if gap is not None:
                    self._gap(gap)
                if tracker is not None:
                    tracker.seed(c)
            elif tracker is not None:
                gap = tracker.observe(c)
                if gap is not None:
                    self._gap(gap)
            raw.popleft()
            self._ready.append(entry)
            self._note_printed(c)

    def _note_printed(self, c: Cursor) -> None:
        printed = self.printed
        if c.seqnum > printed.get(c.seqnum_id, -1):
            if len(printed) > 256 and c.seqnum_id not in printed:
                printed.clear()
            printed[c.seqnum_id] = c.seqnum

    # ------------------------------------------------------------ the child

    async def _start_child(self) -> None:
        if self._delay_s > 0:
            await self.clock.sleep(self._delay_s)
            self._delay_s = 0.0
        if self._closed:
            return
        resume = self._resume_cursor()
        if resume is None and not self._started and not self._from_oldest and self.cfg.start_at == "end":
            # from now on: the newest entry stands for "read" (as if it were the stored cursor),
            # so a restart of the child before anything arrives still starts here; an empty
            # journal starts at its beginning
            resume = await self.head()
            if resume is not None:
                self._stored_text = resume.text
                self.start_position = resume
        self._started = True
        self._expect = resume
        self._from = resume
        if resume is not None:
            self._note_printed(resume)
        def argv_at(directory: str | None) -> list[str]:
            return follow_argv(self.cfg.executable, directory, self.cfg.units,
                               None if resume is None else resume.text, "beginning", self.cfg.output_fields)

        argv = argv_at(self.cfg.directory)          # as logged: the directory as configured
        self._splitter = LineSplitter(self.cfg.max_entry_bytes)   # a new child: no partial line
        self._stderr = deque()
        try:
            with journal_directory(self.cfg.directory) as (where, fds):
                proc = await asyncio.create_subprocess_exec(
                    *argv_at(where), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                    env=child_env(), pass_fds=fds)
        except OSError as e:
            self._schedule_restart(None, "failed", str(e))
            return
        if self._closed:                          # closed while it was being started
            proc.kill()
            await proc.communicate()
            return
        self._proc = proc
        self.started_at = self.clock.monotonic()
        self._stderr_task = asyncio.ensure_future(self._drain_stderr(proc))
        self.events.journal_started(self.key, None if resume is None else resume.text, argv)

    def _resume_cursor(self) -> Cursor | None:
        # read() starts a child only once every line of the last one was decoded and handed out
        if self._last is not None:
            return self._last
        if self._from_oldest or self._stored_text is None:
            return None
        stored = parse_cursor(self._stored_text)
        if stored is None:
            self._cursor_unusable(self._stored_text)
        return stored

    def _cursor_unusable(self, text: str) -> None:
        """A cursor journalctl cannot seek to: report it once, continue from the oldest entry
        (what was shipped before comes again under the same _ids: 409s, no duplicates)."""
        self._gap(Gap("cursor_invalid", text, None, None, None))
        self._from_oldest = True
        self._stored_text = None
        self._last = None

    async def _drain_stderr(self, proc: asyncio.subprocess.Process) -> None:
        assert proc.stderr is not None
        kept = 0
        while True:
            data = await proc.stderr.read(4096)
            if not data:
                return
            self._stderr.append(data)
            kept += len(data)
            while kept > _STDERR_KEEP and len(self._stderr) > 1:
                kept -= len(self._stderr.popleft())

    def _stderr_text(self) -> str:
        return b"".join(self._stderr)[-_STDERR_KEEP:].decode("utf-8", "replace").strip()

    async def _child_ended(self, proc: asyncio.subprocess.Process) -> None:
        rc = await proc.wait()
        if self._closed:
            return
        if self._stderr_task is not None:
            await self._stderr_task
            self._stderr_task = None
        self._proc = None
        if self._rereading:                       # ended by reread(): started again at once
            self._rereading = False
            return
        err = self._stderr_text()
        kind = classify_exit(rc, err)
        if kind == "cursor_invalid" and self._expect is not None:
            self._cursor_unusable(self._expect.text)
            self._expect = None
        self._schedule_restart(rc, kind, err)

    def _schedule_restart(self, rc: int | None, kind: str, err: str) -> None:
        self._attempt += 1
        self.restarts += 1
        self._delay_s = self._backoff.delay(self._attempt, self._rng)
        self.events.journal_reader_exited(self.key, rc, kind, err, self._attempt, self._delay_s)

    def reread(self) -> bool:
        """journalctl holds back an entry it should have printed (a lost wake-up: quiet.py): end the
        child; the next one starts at once, without backoff, from the last entry handed out
        (inclusively), and prints what this one held back. False when no child runs."""
        proc = self._proc
        if proc is None or proc.returncode is not None or self._closed:
            return False
        self._rereading = True
        self.rereads += 1
        self.restarts += 1
        proc.kill()
        return True

    async def _first_at(self, cursor: Cursor) -> Cursor | None:
        """The first entry at or after `cursor` in the unfiltered journal (None: none)."""
        try:
            with journal_directory(self.cfg.directory) as (where, fds):
                proc = await asyncio.create_subprocess_exec(
                    *probe_argv(self.cfg.executable, where, cursor.text), stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=child_env(), pass_fds=fds)
        except JournalDirRefused:
            return None
        try:
            assert proc.stdout is not None
            try:
                line = await proc.stdout.readline()
            except ValueError:                    # a line over the stream's limit: no cursor from it
                line = b""
        finally:
            if proc.returncode is None:
                proc.kill()
            await proc.wait()
        return cursor_of(line)

    async def head(self) -> Cursor | None:
        """The newest entry this input matches (None: none); for lag."""
        return await read_head(self.cfg.executable, self.cfg.directory, self.cfg.units)

    async def lag(self, position: Cursor | None) -> JournalLag:
        """How far `position` (e.g. the committed cursor) is behind the journal's head."""
        return journal_lag(await self.head(), position)

    async def open(self) -> None:
        """Start the child now rather than at the first `read()`: with start_at end and no stored
        cursor, "from now on" is fixed here (`start_position`)."""
        if self._proc is None and not self._started and not self._closed:
            await self._start_child()

    def kill(self) -> None:
        """Stop at once, without waiting (the loop is going away; `close()` is the orderly way)."""
        self._closed = True
        proc, self._proc = self._proc, None
        if proc is not None and proc.returncode is None:
            try:
                proc.kill()
            except ProcessLookupError:
                pass

    async def close(self) -> None:
        """Stop the child (if any) and wait for it."""
        self._closed = True
        proc, self._proc = self._proc, None
        if proc is not None and proc.returncode is None:
            proc.terminate()
            try:
                await asyncio.wait_for(proc.wait(), 5.0)
            except TimeoutError:
                proc.kill()
                await proc.wait()
        if self._stderr_task is not None:
            self._stderr_task.cancel()
            try:
                await self._stderr_task
            except asyncio.CancelledError:
                pass
            self._stderr_task = None

