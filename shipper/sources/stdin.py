"""Stdin as a source (`shipper pipe`): bounded non-blocking reads -> lines -> the input's documents.
One stream incarnation with a fresh id per run, stream offsets, no checkpoint (a stream cannot be
resumed); a pipe wakes the loop through its reader callback, a regular file is read in chunks."""

from __future__ import annotations

import asyncio
import os
import stat
from collections.abc import Mapping

from shipper.clock import Clock
from shipper.config import InputConfig
from shipper.events import Events
from shipper.model import Draft, FileStatus, Line
from shipper.parse.document import DocBuilder
from shipper.sources.base import Drafts, DropCounter, Progress, Room, lowest_unshipped
from shipper.tail import identity
from shipper.tail.lines import LineSplitter

STDIN_PATH = "-"              # log.file.path of stdin events
CHUNK_BYTES = 256 * 1024


class StdinSource:
    def __init__(self, inp: InputConfig, index: str, host_name: str, writer: Drafts, events: Events,
                 clock: Clock, fd: int = 0) -> None:
        self.fd = fd
        self.writer = writer
        self.events = events
        self.clock = clock
        self.builder = DocBuilder(inp, index, host_name)
        self.drops = DropCounter(self.builder, "stdin", events)
        self.splitter = LineSplitter(0, inp.max_line_bytes)
        self.incarnation = identity.new_incarnation()
        st = os.fstat(fd)
        self.is_file = stat.S_ISREG(st.st_mode)
        # `shipper pipe < big.log`: the size is known, so progress has an end and an ETA
        self.start_offset = os.lseek(fd, 0, os.SEEK_CUR) if self.is_file else 0
        self.size: int | None = st.st_size - self.start_offset if self.is_file else None
        self.bytes_read = 0
        self.eof = False
        self.read_total = 0
        self._was_blocking = True
        self._watching = False
        self._interrupted = False

    @property
    def exhausted(self) -> bool:
        return self.eof

    @property
    def watching(self) -> bool:
        """False: the reader loop's poll keeps its pace while a pipe is read."""
        return False

    async def start(self, wake: asyncio.Event) -> None:
        if self.is_file:
            return
        self._was_blocking = os.get_blocking(self.fd)
        os.set_blocking(self.fd, False)
        try:
            asyncio.get_running_loop().add_reader(self.fd, wake.set)
            self._watching = True
        except (OSError, ValueError, PermissionError):
            # /dev/null and other files epoll refuses: plain reads, which never block for long there
            os.set_blocking(self.fd, self._was_blocking)
            self.is_file = True

    async def tick(self, now: float) -> None:
        return None

    def read_round(self, room: Room, now_wall: float, now_mono: float) -> Progress:
        if self.eof:
            return Progress(False, False)
        draft = self.writer.draft
        left = max(4096, room.max_bytes - draft.nbytes)
        try:
            chunk = os.read(self.fd, min(CHUNK_BYTES, left))
        except BlockingIOError:
            return Progress(False, False)
        except OSError:
            chunk = b""
        if not chunk:
            self.eof = True
            self._take(self.splitter.flush(), now_wall, now_mono)   # at its end, the last line without newline counts
            self._unwatch()
            return Progress(False, False)
        self.bytes_read += len(chunk)
        self._take(self.splitter.feed(chunk), now_wall, now_mono)
        more = self.is_file or len(chunk) == min(CHUNK_BYTES, left)
        return Progress(True, more)

    def _take(self, lines: list[Line], now_wall: float, now_mono: float) -> None:
        """Parse lines into the draft and extend the range this incarnation covers."""
        draft = self.writer.draft
        if draft.empty():
            draft.started = now_mono
        if lines:
            n0 = len(draft.parts)
            draft.nbytes += self.builder.build(self.incarnation, STDIN_PATH, lines, now_wall, draft.parts)
            draft.events += len(draft.parts) - n0
            self.drops.report()
            self.read_total += len(lines)
            self.events.lines_read(STDIN_PATH, len(lines), 0)
        end = self.splitter.offset
        if self.incarnation in draft.covers:
            draft.covers[self.incarnation][1] = end
        elif lines:
            draft.cover(self.incarnation, lines[0][0], end)

    def flush_due(self, now_mono: float) -> None:
        return None

    async def check(self, now_mono: float) -> None:
        return None

    def next_deadline(self) -> float | None:
        return None

    def pause_watch(self) -> None:
        return None

    def resume_watch(self) -> None:
        return None

    def drain_watch(self) -> None:
        return None

    def interrupt(self) -> None:
        """A stop signal: what was read is queued, the rest of stdin is not ours (a line cut by an
        interrupt is incomplete, so the partial last line is not taken)."""
        self._interrupted = True
        self.eof = True
        self._unwatch()

    async def stop(self) -> None:
        self._unwatch()

    def _unwatch(self) -> None:
        if self._watching:
            self._watching = False
            try:
                asyncio.get_running_loop().remove_reader(self.fd)
            except (OSError, ValueError, RuntimeError):
                pass
            try:
                os.set_blocking(self.fd, self._was_blocking)   # leave a terminal or shared pipe as we found it
            except OSError:
                pass

    def close(self) -> None:
        self._unwatch()

    def status(self, shipped: Mapping[str, int], writing: list[Draft]) -> list[FileStatus]:
        """Stdin as a row of `shipper status`: offsets are stream offsets."""
        queued = self.splitter.offset
        acked = lowest_unshipped(self.incarnation, queued, shipped, [*writing, self.writer.draft])
        size = self.size if self.size is not None else self.bytes_read
        return [FileStatus(STDIN_PATH, None, self.incarnation, acked, queued, size, max(0, size - acked),
                           "closed" if self.eof else "reading")]

    def bytes_at_risk(self) -> int:
        return 0

    def steady_key(self) -> None:
        return None

    def journal_status(self, shipped: Mapping[str, int], writing: list[Draft]) -> None:
        return None
