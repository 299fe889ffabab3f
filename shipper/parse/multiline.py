"""Pure multiline aggregation: one file's lines in (tail/lines.py, in file order), events (Line
tuples) out to the builder. An event's offset is its first line's, so the caller never checkpoints
past `pending_start`. `now` is passed in; nothing here reads a clock."""

from __future__ import annotations

import re

from shipper.model import FLAG_MULTILINE_CAPPED, Held, Line

__all__ = ["MultilineAggregator"]

_BLANK = b" \t\r"


class MultilineAggregator:
    """Groups lines into events by a start regex; see the module docstring.

    `start` is searched anywhere in a line (anchor it with `^`), in the line's text decoded as
    UTF-8 with replacement. For ASCII lines and a pattern that compiles as bytes a bytes copy
    of the regex is used (same answer, faster), except that there `\\s` does not match the
    rarely seen separator controls \\x1c-\\x1f.

    Cuts (issue 41: no line lost across a kill -9): an event completed by its timeout (or by the
    file's end, or a stop) ends where it ends only because of when its lines came. Its end offset
    goes to `made_cuts`; the reader records it with the checkpoint (`Checkpoint.cuts`) before the
    event goes out. After a restart the file is read again from the checkpoint with those offsets
    given to `replay`: a held event whose last line ends at a recorded cut is complete at once, so
    the re-read groups exactly as the first read (same `_id`s, same texts), with no wait.
    A cut names an event's end, so it holds per stream too (the container joiner's aggregators). A cut by a start line or a cap is in the bytes and needs no record.

    Rules: a line matching `start` begins an event; any other line joins the pending one (or
    begins one when nothing is pending). Blank lines inside an event are kept, trailing ones are
    trimmed from its text (their bytes still count in its end offset), and a blank line with
    nothing pending is no event. Nothing is ever dropped: an event that reaches `max_lines` (or
    `max_bytes`) is emitted with FLAG_MULTILINE_CAPPED, and the lines after it form the next
    event, flagged too.
    """

    def __init__(self, start: str, max_lines: int = 500, timeout_s: float = 1.0,
                 max_bytes: int = 10 * 1024 * 1024, *, records_cuts: bool = True) -> None:
        if max_lines < 1:
            raise ValueError("max_lines must be at least 1")
        self._start = re.compile(start)
        self._start_bytes: re.Pattern[bytes] | None = None
        if start.isascii():
            try:
                self._start_bytes = re.compile(start.encode("ascii"))
            except re.error:
                self._start_bytes = None
        self.max_lines = max_lines
        self.max_bytes = max_bytes
        self.timeout_s = timeout_s
        self._parts: list[bytes] = []
        self._first = 0              # start offset of the pending event's first line
        self._last_end = 0           # end offset of its last line
        self._flags = 0
        self._bytes = 0
        self._last_time = 0.0        # when its last line was fed
        self._replay: set[int] = set()  # recorded cuts: the end offsets of events completed by time
        self._replaying = False         # _replay is not empty (one test a line when it is)
        self.made_cuts: list[int] = []  # cuts this read made by time (the reader records and clears them)
        self.records_cuts = records_cuts  # False: nobody takes them (journald: its offsets are local numbers)

    @property
    def pending_start(self) -> int | None:
        """Offset of the first line of the held event; None when nothing is held."""
        return self._first if self._parts else None

    @property
    def next_deadline(self) -> float | None:
        """When `flush_due` will complete the held event (same time base as `now`)."""
        return self._last_time + self.timeout_s if self._parts else None

    def replay(self, cuts: list[int] | tuple[int, ...]) -> None:
        """Offsets where the first read cut events by time (`Checkpoint.cuts` above where this
        read begins): this read cuts there too."""
        self._replay = set(cuts)
        self._replaying = bool(self._replay)

    def _feed_replaying(self, line: Line, now: float) -> list[Line]:
        self._replaying = False
        out = self.feed(line, now)
        self._replaying = bool(self._replay)
        if self._parts and self._last_end in self._replay:
            self._replay.discard(self._last_end)
            self._replaying = bool(self._replay)
            out.append(self._complete(0))      # the first read cut it here: it goes now, whole
        return out

    def feed(self, line: Line, now: float) -> list[Line]:
        """Take the next line of the file; return the events it completes (oldest first)."""
        if self._replaying:
            return self._feed_replaying(line, now)
        start, end, data, flags = line
        out: list[Line] = []
        if self._parts and now - self._last_time >= self.timeout_s:
            out.append(self._cut())            # as if flush_due had run on time
        parts = self._parts
        if not parts:
            if not data.strip(_BLANK):
                return out
            self._begin(start, end, data, flags, now, 0)
            return out
        if self._is_start(data):
            out.append(self._complete(0))
            self._begin(start, end, data, flags, now, 0)
            return out
        if len(parts) >= self.max_lines or self._bytes + 1 + len(data) > self.max_bytes:
            out.append(self._complete(FLAG_MULTILINE_CAPPED))
            if data.strip(_BLANK):      # a blank line begins no event (nor would it on a re-read from here)
                self._begin(start, end, data, flags, now, FLAG_MULTILINE_CAPPED)
            return out
        parts.append(data)
        self._bytes += 1 + len(data)
        self._last_end = end
        self._flags |= flags
        self._last_time = now
        return out

    def flush_due(self, now: float) -> list[Line]:
        """Complete the held event if its last line is at least `timeout_s` old."""
        if self._parts and now - self._last_time >= self.timeout_s:
            return [self._cut()]
        return []

    def flush(self) -> list[Line]:
        """Complete whatever is held (end of file for good, shutdown)."""
        if self._parts:
            return [self._cut()]
        return []

    # ------------------------------------------------------------ as a file's holder (tail/fileset.Holder)

    waits_closed = False      # a held event is not kept across a close: the file stays open

    def hold(self, lines: list[Line], now: float) -> Held:
        """A batch of the file's lines: the events they complete."""
        evs: list[Line] = []
        for ln in lines:
            evs.extend(self.feed(ln, now))
        return evs, []

    def release_due(self, now: float) -> Held:
        return self.flush_due(now), []

    def release(self, tail: list[Line], now: float) -> Held:
        """The file will not grow again: `tail` (its last line without newline) fed, then all held."""
        evs, _ = self.hold(tail, now)
        return evs + self.flush(), []

    def take_cuts(self) -> list[int]:
        """The cuts made by time since the last call (`made_cuts`), for the reader to record."""
        made, self.made_cuts = self.made_cuts, []
        return made

    # ------------------------------------------------------------ internals

    def _is_start(self, data: bytes) -> bool:
        if not data.strip(_BLANK):
            return False  # a blank line never begins an event
        if self._start_bytes is not None and data.isascii():
            return self._start_bytes.search(data) is not None
        return self._start.search(data.decode("utf-8", "replace")) is not None

    def _begin(self, start: int, end: int, data: bytes, flags: int, now: float,
               extra_flags: int) -> None:
        self._parts = [data]
        self._first = start
        self._last_end = end
        self._flags = flags | extra_flags
        self._bytes = len(data)
        self._last_time = now

    def _cut(self) -> Line:
        """The held event completed by time, not by the bytes: where it ends is a cut to record."""
        if self.records_cuts:
            self.made_cuts.append(self._last_end)
        return self._complete(0)

    def _complete(self, extra_flags: int) -> Line:
        parts = self._parts
        n = len(parts)
        while n > 1 and not parts[n - 1].strip(_BLANK):
            n -= 1
        data = parts[0] if n == 1 else b"\n".join(parts[:n])
        event = (self._first, self._last_end, data, self._flags | extra_flags)
        self._parts = []
        return event
