"""Pure: the journal's entries as `journalctl --output=json --all` prints them, the events they
become (parse/document.py builds their documents), multiline groups per unit and PID with the
position safe to commit, and the JSON lines cut from journalctl's chunks. No I/O."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

from shipper.config import MultilineConfig
from shipper.model import FLAG_TRUNCATED
from shipper.parse.doc_values import SourceEvent
from shipper.parse.multiline import MultilineAggregator
from shipper.sources.journald.cursor import (
    Cursor,
    doc_id,
    parse_cursor,
)

# syslog severities as journald's PRIORITY holds them (0..7), named as syslog(3) names them
PRIORITY_NAMES = ("emerg", "alert", "crit", "err", "warning", "notice", "info", "debug")


# ---------------------------------------------------------------- entries

class JournalEntry(NamedTuple):
    """One journal entry (or, after multiline grouping, one group of them, named by its first).

    `message` is MESSAGE's bytes (a binary field decoded from its byte array, repeated values
    joined with newlines), cut at the input's max_line_bytes (then `flags` has FLAG_TRUNCATED)."""

    cursor: Cursor
    realtime_us: int
    message: bytes
    flags: int = 0
    hostname: str | None = None
    unit: str | None = None
    pid: int | None = None
    priority: int | None = None
    facility: int | None = None
    identifier: str | None = None


def field_bytes(value: Any) -> bytes | None:
    """A field's value as journalctl's JSON gives it -> bytes. A string is UTF-8 text; an array
    of numbers is a binary field (not UTF-8, or with control characters); an array of values is
    a field the entry has more than once (joined with newlines); null is a field over 4 KiB
    without --all. Never raises."""
    if value is None:
        return None
    if isinstance(value, str):
        return value.encode("utf-8", "surrogatepass")
    if isinstance(value, list):
        if all(type(x) is int for x in value):
            try:
                return bytes(value)
            except ValueError:
                return ",".join(str(x) for x in value).encode()
        parts = [field_bytes(x) for x in value]
        return b"\n".join(p for p in parts if p is not None)
    if isinstance(value, (int, float, bool)):
        return str(value).encode()
    return None


def field_text(value: Any) -> str | None:
    """A field meant to be one short text (unit, host name): the first of repeated values."""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and value and not all(type(x) is int for x in value):
        return field_text(value[0])
    b = field_bytes(value)
    return None if b is None else b.decode("utf-8", "replace")


_MAX_INT = 2 ** 63 - 1


def field_int(value: Any, lo: int = 0, hi: int = _MAX_INT) -> int | None:
    text = field_text(value)
    if text is None:
        return None
    text = text.strip()
    if not text.isdigit():
        return None
    n = int(text)
    return n if lo <= n <= hi else None


def _text(value: Any) -> str | None:
    return value if type(value) is str else field_text(value)


def _int(value: Any, lo: int, hi: int) -> int | None:
    if type(value) is str and value.isdigit() and value.isascii():
        n = int(value)
        return n if lo <= n <= hi else None
    return field_int(value, lo, hi)


def decode_entry(obj: Any, max_message_bytes: int) -> JournalEntry | str:
    """One parsed JSON line of `journalctl --output=json` -> the entry, or a reason text when it
    cannot be one (no cursor: it could never be resumed from, so it is skipped)."""
    if type(obj) is not dict:
        return "not a JSON object"
    get = obj.get
    raw_cursor = get("__CURSOR")
    cursor = parse_cursor(raw_cursor) if type(raw_cursor) is str else None
    if cursor is None:
        return "no valid __CURSOR"
    realtime = _int(get("__REALTIME_TIMESTAMP"), 0, _MAX_INT)
    if realtime is None:
        realtime = cursor.realtime_us if cursor.realtime_us is not None else 0
    m = get("MESSAGE")
    msg = m.encode("utf-8", "surrogatepass") if type(m) is str else field_bytes(m) or b""
    flags = 0
    if len(msg) > max_message_bytes:
        msg = msg[:max_message_bytes]
        flags = FLAG_TRUNCATED
    return JournalEntry(cursor, realtime, msg, flags, _text(get("_HOSTNAME")), _text(get("_SYSTEMD_UNIT")),
                        _int(get("_PID"), 1, _MAX_INT), _int(get("PRIORITY"), 0, 7),
                        _int(get("SYSLOG_FACILITY"), 0, 23), _text(get("SYSLOG_IDENTIFIER")))


def source_event(entry: JournalEntry) -> SourceEvent:
    """The document-builder's view of an entry (SPEC, journald): `@timestamp` from
    __REALTIME_TIMESTAMP unless the parsed MESSAGE has its own time, `host.name` (_HOSTNAME),
    `systemd.unit`, `process.pid`, `log.syslog.priority` and, unless the line gives one,
    `log.level` from PRIORITY; also `log.syslog.appname` (SYSLOG_IDENTIFIER) and
    `log.syslog.facility.code` (SYSLOG_FACILITY), as Filebeat's journald input names them."""
    added: dict[str, Any] = {}
    if entry.unit is not None:
        added["systemd"] = {"unit": entry.unit}
    if entry.pid is not None:
        added["process"] = {"pid": entry.pid}
    syslog: dict[str, Any] = {}
    log: dict[str, Any] = {}
    if entry.priority is not None:
        syslog["priority"] = entry.priority
        log["level"] = PRIORITY_NAMES[entry.priority]
    if entry.facility is not None:
        syslog["facility"] = {"code": entry.facility}
    if entry.identifier is not None:
        syslog["appname"] = entry.identifier
    if syslog:
        log["syslog"] = syslog
    if log:
        added["log"] = log
    return SourceEvent(doc_id(entry.cursor), entry.message, entry.flags, entry.realtime_us / 1e6, added,
                       entry.hostname or None)


# ---------------------------------------------------------------- multiline per unit and PID

class JournalAssembler:
    """Entries in journal order -> events, grouped per (unit, PID) when multiline is configured.

    A group is named by its first entry (cursor, `_id`, fields); its lines are joined with
    newlines. The multiline timeout runs on shipper's own clock: `now` (monotonic) is when the
    entries were read, and `flush_due(now)` completes a group whose last entry was read `timeout`
    ago, whatever the entries' stamps say (a stepped clock or a skewed sender via journal-remote
    stamps them hours ahead). The entries' own __REALTIME_TIMESTAMPs also end a group: a gap of
    `timeout` between two entries of one unit and PID splits them even when they are read at
    once, so a re-read after a restart cuts where the first read did when the clocks are sane.

    `position` is the cursor that is safe to commit with the events returned so far: every
    entry up to it is in a returned event (a held group's first entry is not; after a restart
    the entries after `position` are read again and, through their `_id`s, give no duplicates).
    """

    def __init__(self, multiline: MultilineConfig | None, max_bytes: int = 10 * 1024 * 1024) -> None:
        self._ml = multiline
        self._max_bytes = max_bytes
        self._aggs: dict[tuple[str | None, int | None], MultilineAggregator] = {}
        self._last_realtime_s: dict[tuple[str | None, int | None], float] = {}   # a held group's last entry's stamp
        self._held: dict[int, JournalEntry] = {}     # local number -> the first entry of a held group
        self._fed: list[tuple[int, Cursor]] = []     # (local number, cursor) of entries since the oldest held
        self._n = 0
        self._position: Cursor | None = None

    @property
    def position(self) -> Cursor | None:
        return self._position

    @property
    def next_deadline(self) -> float | None:
        """The earliest time (the monotonic `now` of `feed`) at which `flush_due` completes a held group."""
        dl = [d for d in (a.next_deadline for a in self._aggs.values()) if d is not None]
        return min(dl) if dl else None

    def feed(self, entries: Sequence[JournalEntry], now: float) -> list[JournalEntry]:
        """Entries in journal order, read at `now` (monotonic) -> the events they complete."""
        if self._ml is None:
            if entries:
                self._position = entries[-1].cursor
            return list(entries)
        out: list[JournalEntry] = []
        timeout_s = self._ml.timeout_s
        last_realtime_s = self._last_realtime_s
        for e in entries:
            n = self._n
            self._n += 1
            key = (e.unit, e.pid)
            agg = self._aggs.get(key)
            if agg is None:
                # no cuts recorded: an entry's number here is local to this run (issue 41's journald
                # case, a group cut on shipper's clock re-read with its late entry, is still open)
                agg = MultilineAggregator(self._ml.start, self._ml.max_lines, timeout_s, self._max_bytes,
                                          records_cuts=False)
                self._aggs[key] = agg
            realtime_s = e.realtime_us / 1e6
            if agg.pending_start is not None and realtime_s - last_realtime_s[key] >= timeout_s:
                out.extend(self._emit(agg.flush()))
            last_realtime_s[key] = realtime_s
            done = agg.feed((n, n + 1, e.message, e.flags), now)
            if agg.pending_start == n:
                self._held[n] = e
            self._fed.append((n, e.cursor))
            out.extend(self._emit(done))
        self._advance()
        return out

    def flush_due(self, now: float) -> list[JournalEntry]:
        out: list[JournalEntry] = []
        for key, agg in list(self._aggs.items()):
            out.extend(self._emit(agg.flush_due(now)))
            if agg.pending_start is None:
                del self._aggs[key]
                del self._last_realtime_s[key]
        self._advance()
        return out

    def flush(self) -> list[JournalEntry]:
        """Complete every held group (shutdown)."""
        out: list[JournalEntry] = []
        for agg in self._aggs.values():
            out.extend(self._emit(agg.flush()))
        self._aggs.clear()
        self._last_realtime_s.clear()
        self._advance()
        return out

    def _emit(self, events: list[tuple[int, int, bytes, int]]) -> list[JournalEntry]:
        out = []
        for start, _end, data, flags in events:
            first = self._held.pop(start)
            out.append(JournalEntry(first.cursor, first.realtime_us, data, flags, first.hostname, first.unit,
                                    first.pid, first.priority, first.facility, first.identifier))
        return out

    def _advance(self) -> None:
        """Move `position` to the last entry before the oldest held group's first entry."""
        low = min(self._held) if self._held else None
        fed = self._fed
        k = 0
        while k < len(fed) and (low is None or fed[k][0] < low):
            k += 1
        if k:
            self._position = fed[k - 1][1]
            del fed[:k]


# ---------------------------------------------------------------- JSON lines from chunks

class LineSplitter:
    """Chunks of journalctl's stdout -> complete lines (JSON output escapes newlines in values,
    so a newline always ends an entry). A line over `max_bytes` is dropped whole and counted,
    so one huge entry cannot take the memory; nothing is ever copied more than twice."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._parts: list[bytes] = []
        self._len = 0
        self._skipping = False

    def feed(self, chunk: bytes) -> tuple[list[bytes], int]:
        """-> (complete lines, lines dropped for their size)."""
        dropped = 0
        nl = chunk.rfind(b"\n")
        if nl < 0:
            self._hold(chunk)
            return [], 0
        first_nl = chunk.find(b"\n")
        head = chunk[:first_nl]
        lines: list[bytes] = []
        if self._skipping:
            self._skipping = False
            dropped += 1
        elif self._parts:
            if self._len + len(head) > self.max_bytes:
                dropped += 1
            else:
                self._parts.append(head)
                lines.append(b"".join(self._parts))
            self._parts = []
            self._len = 0
        elif len(head) > self.max_bytes:
            dropped += 1
        else:
            lines.append(head)
        if nl > first_nl:
            for line in chunk[first_nl + 1:nl].split(b"\n"):
                if len(line) > self.max_bytes:
                    dropped += 1
                else:
                    lines.append(line)
        self._hold(chunk[nl + 1:])
        return lines, dropped

    def _hold(self, rest: bytes) -> None:
        if not rest or self._skipping:
            return
        if self._len + len(rest) > self.max_bytes:
            self._parts = []
            self._len = 0
            self._skipping = True
            return
        self._parts.append(rest)
        self._len += len(rest)

    @property
    def pending_bytes(self) -> int:
        return self._len
