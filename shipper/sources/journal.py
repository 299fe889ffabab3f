"""Pure: the systemd journal's vocabulary and the decisions about it, apart from any I/O.

Cursors, entries as `journalctl --output=json --all` prints them, the events (and document
fields) they become, multiline grouping per unit and PID with the position that is safe to
commit, gaps (entries the journal vacuumed before they were read), lag, and journalctl's argv.
The child process that produces the JSON lines is `sources/journald.py`; documents are built
by `parse/document.py` from the `SourceEvent`s made here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple

from shipper.config import MultilineConfig
from shipper.model import FLAG_TRUNCATED, JournalGap
from shipper.parse.document import SourceEvent
from shipper.parse.multiline import MultilineAggregator

StartAt = Literal["beginning", "end"]
GapReason = Literal["vacuumed", "cursor_invalid", "seqnum_jump"]
Gap = JournalGap              # entries lost before they were read (a value of model.py: Events tells it); reason: GapReason

# syslog severities as journald's PRIORITY holds them (0..7), named as syslog(3) names them
PRIORITY_NAMES = ("emerg", "alert", "crit", "err", "warning", "notice", "info", "debug")

# The fields journalctl prints besides the four it always prints (__CURSOR, __REALTIME_TIMESTAMP,
# __MONOTONIC_TIMESTAMP, _BOOT_ID): the ones documents get. Fewer fields, less JSON to print and parse.
OUTPUT_FIELDS = ("MESSAGE", "PRIORITY", "SYSLOG_FACILITY", "SYSLOG_IDENTIFIER", "_HOSTNAME", "_SYSTEMD_UNIT",
                 "_PID")
# A small always-present-or-cheap field for probes that only need the cursor
_PROBE_FIELDS = "_PID"


# ---------------------------------------------------------------- cursors

class Cursor(NamedTuple):
    """A journal cursor: `s=<seqnum id>;i=<seqnum hex>;b=<boot id>;m=<monotonic hex>;t=<realtime hex>;x=<xor hash>`.

    `text` is what journalctl printed (and what resuming passes back); the parsed parts are for
    identity (`s` + `i`) and distances (seqnums, realtime in microseconds). A NamedTuple, as
    `JournalEntry`: immutable, and one per entry costs a third of a frozen dataclass."""

    text: str
    seqnum_id: str
    seqnum: int
    boot_id: str = ""
    monotonic_us: int | None = None
    realtime_us: int | None = None


def parse_cursor(text: str) -> Cursor | None:
    """The parts of a cursor; None when it has no `s=` and `i=` (not a cursor journalctl makes)."""
    if not isinstance(text, str) or not text or len(text) > 512:
        return None
    items = text.split(";")
    # journalctl's own order (s i b m t x) is the fast path (one entry at a time, ~1 us)
    if len(items) == 6:
        s_, i_, b_, m_, t_, _x = items
        if s_[:2] == "s=" and i_[:2] == "i=" and b_[:2] == "b=" and m_[:2] == "m=" and t_[:2] == "t=":
            sid = s_[2:]
            if sid.isalnum() and i_[2:].isalnum() and m_[2:].isalnum() and t_[2:].isalnum():
                try:
                    int(sid, 16)
                    return Cursor(text, sid.lower(), int(i_[2:], 16), b_[2:], int(m_[2:], 16), int(t_[2:], 16))
                except ValueError:
                    return None
    parts: dict[str, str] = {}
    for item in items:
        k, sep, v = item.partition("=")
        if not sep or len(k) != 1:
            return None
        parts[k] = v
    try:
        sid, seq = parts["s"], parts["i"]
        m, t = parts.get("m"), parts.get("t")
        if not all(x.isalnum() for x in (sid, seq, m or "0", t or "0")):
            return None
        int(sid, 16)
        return Cursor(text, sid.lower(), int(seq, 16), parts.get("b", ""), None if m is None else int(m, 16),
                      None if t is None else int(t, 16))
    except (KeyError, ValueError):
        return None


def same_entry(a: Cursor, b: Cursor) -> bool:
    """Do two cursors name the same entry? Its sequence-number id and sequence number say so."""
    return a.seqnum_id == b.seqnum_id and a.seqnum == b.seqnum


def doc_id(c: Cursor) -> str:
    """The entry's `_id`: `j-<seqnum id>-<seqnum>`. Deterministic (a re-read entry is a 409); file
    ids are `<12 hex>-<offset>`, so the two never collide."""
    return f"j-{c.seqnum_id}-{c.seqnum}"


def journal_key(directory: str | None, units: Sequence[str]) -> str:
    """The name a journald input's cursor is stored under: its journal and its unit filter."""
    key = "journald:" + (directory or "system")
    return key + ("?" + ",".join(sorted(set(units))) if units else "")


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
    newlines. Time for the multiline timeout is each entry's own __REALTIME_TIMESTAMP, so a
    re-read after a restart groups exactly as the first read did; `flush_due(now)` (wall time)
    completes groups that went quiet and should be called when the reader has caught up.

    `position` is the cursor that is safe to commit with the events returned so far: every
    entry up to it is in a returned event (a held group's first entry is not; after a restart
    the entries after `position` are read again and, through their `_id`s, give no duplicates).
    """

    def __init__(self, multiline: MultilineConfig | None, max_bytes: int = 10 * 1024 * 1024) -> None:
        self._ml = multiline
        self._max_bytes = max_bytes
        self._aggs: dict[tuple[str | None, int | None], MultilineAggregator] = {}
        self._held: dict[int, JournalEntry] = {}     # local number -> the first entry of a held group
        self._fed: list[tuple[int, Cursor]] = []     # (local number, cursor) of entries since the oldest held
        self._n = 0
        self._position: Cursor | None = None

    @property
    def position(self) -> Cursor | None:
        return self._position

    @property
    def next_deadline(self) -> float | None:
        """The earliest wall time at which `flush_due` completes a held group."""
        dl = [d for d in (a.next_deadline for a in self._aggs.values()) if d is not None]
        return min(dl) if dl else None

    def feed(self, entries: Sequence[JournalEntry]) -> list[JournalEntry]:
        if self._ml is None:
            if entries:
                self._position = entries[-1].cursor
            return list(entries)
        out: list[JournalEntry] = []
        for e in entries:
            n = self._n
            self._n += 1
            key = (e.unit, e.pid)
            agg = self._aggs.get(key)
            if agg is None:
                agg = MultilineAggregator(self._ml.start, self._ml.max_lines, self._ml.timeout_s, self._max_bytes)
                self._aggs[key] = agg
            done = agg.feed((n, n + 1, e.message, e.flags), e.realtime_us / 1e6)
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
        self._advance()
        return out

    def flush(self) -> list[JournalEntry]:
        """Complete every held group (shutdown)."""
        out: list[JournalEntry] = []
        for agg in self._aggs.values():
            out.extend(self._emit(agg.flush()))
        self._aggs.clear()
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


# ---------------------------------------------------------------- gaps and lag

def _seconds(a: Cursor, b: Cursor) -> float | None:
    if a.realtime_us is None or b.realtime_us is None:
        return None
    return round((b.realtime_us - a.realtime_us) / 1e6, 6)


def resume_gap(stored: Cursor, first: Cursor | None) -> Gap | None:
    """Resuming at `stored` (inclusively), the unfiltered journal's first entry at or after it
    was `first`: None when nothing was lost (it is the stored entry, or the very next one),
    else the gap. `first` None: the journal holds nothing at or after the stored cursor's place."""
    if first is None:
        return Gap("vacuumed", stored.text, None, None, None)
    if same_entry(stored, first):
        return None
    if first.seqnum_id == stored.seqnum_id:
        distance = first.seqnum - stored.seqnum
        if distance <= 1:
            return None
        return Gap("vacuumed", stored.text, first.text, distance - 1, _seconds(stored, first))
    return Gap("vacuumed", stored.text, first.text, None, _seconds(stored, first))


class SeqnumTracker:
    """Continuity of an unfiltered read: within one sequence-number id, entries come with
    consecutive seqnums (journald numbers them across rotation), so a jump means entries were
    vacuumed while waiting to be read. Only meaningful without a unit filter."""

    def __init__(self) -> None:
        self._last: dict[str, Cursor] = {}

    def seed(self, c: Cursor) -> None:
        self._last[c.seqnum_id] = c

    def observe(self, c: Cursor) -> Gap | None:
        last = self._last.get(c.seqnum_id)
        if len(self._last) > 256 and last is None:
            self._last.clear()
        self._last[c.seqnum_id] = c
        if last is None or c.seqnum <= last.seqnum + 1:
            return None
        return Gap("seqnum_jump", last.text, c.text, c.seqnum - last.seqnum - 1, _seconds(last, c))


@dataclass(frozen=True, slots=True)
class JournalLag:
    """How far a position is behind the journal's head: `entries` from the seqnum distance
    (with a unit filter, entries of other units in between count too; None: different
    journals, or nothing read yet), `seconds` from the realtime distance."""

    entries: int | None
    seconds: float | None


def journal_lag(head: Cursor | None, position: Cursor | None) -> JournalLag:
    if head is None:
        return JournalLag(0, 0.0)                  # an empty journal: nothing to be behind
    if position is None:
        return JournalLag(None, None)
    entries = max(0, head.seqnum - position.seqnum) if head.seqnum_id == position.seqnum_id else None
    seconds = _seconds(position, head)
    return JournalLag(entries, None if seconds is None else max(0.0, seconds))


# ---------------------------------------------------------------- journalctl's argv

def unit_match(unit: str) -> str:
    """`_SYSTEMD_UNIT=` match for a unit as the config names it; a name without a unit type gets
    `.service`, as `journalctl -u` and systemctl complete it."""
    base = unit.rsplit("@", 1)[-1] if "@" in unit else unit
    if "." not in base:
        unit += ".service"
    return f"_SYSTEMD_UNIT={unit}"


def _base(executable: str, directory: str | None) -> list[str]:
    # --merge: without it, systemd 252's `journalctl --follow` reads only the latest boot (and
    # with --after-cursor skips everything before it); --boot is never passed for the same reason
    argv = [executable, "--merge", "--no-pager", "--output=json"]
    if directory is not None:
        argv.append(f"--directory={directory}")
    return argv


def _matches(units: Sequence[str]) -> list[str]:
    return [unit_match(u) for u in units]


def follow_argv(executable: str, directory: str | None, units: Sequence[str], cursor: str | None,
                start_at: StartAt, fields: Sequence[str] | None = OUTPUT_FIELDS) -> list[str]:
    """The reader: follow the journal from `cursor` inclusively (`--cursor`, never
    `--after-cursor`, which systemd #30288/#38912 make skip an entry), else from the oldest
    entry (`beginning`) or from now on (`end`). `--all`: fields over 4 KiB are null without it."""
    argv = _base(executable, directory) + ["--all", "--follow"]
    if cursor is not None:
        # --no-tail too: --follow alone implies --lines=10, and systemd 252 then prints only ten
        # entries from the cursor before it waits for new ones (the rest would never come)
        argv += [f"--cursor={cursor}", "--no-tail"]
    elif start_at == "end":
        argv.append("--lines=0")
    else:
        argv.append("--no-tail")
    if fields:
        argv.append("--output-fields=" + ",".join(fields))
    return argv + _matches(units)


def head_argv(executable: str, directory: str | None, units: Sequence[str]) -> list[str]:
    """The newest (matching) entry, for lag: one short JSON line, or none for an empty journal."""
    return _base(executable, directory) + ["--lines=1", f"--output-fields={_PROBE_FIELDS}"] + _matches(units)


def probe_argv(executable: str, directory: str | None, cursor: str) -> list[str]:
    """Entries at and after `cursor` in the unfiltered journal (the caller reads the first line)."""
    return _base(executable, directory) + [f"--cursor={cursor}", f"--output-fields={_PROBE_FIELDS}"]


def count_argv(executable: str, directory: str | None, units: Sequence[str], max_entries: int) -> list[str]:
    """The newest `max_entries` matching entries, one short line each (`shipper check` counts them)."""
    return _base(executable, directory) + [f"--lines={max_entries}", f"--output-fields={_PROBE_FIELDS}"] + _matches(units)


ExitKind = Literal["cursor_invalid", "no_permission", "no_directory", "failed"]


def classify_exit(returncode: int | None, stderr: str) -> ExitKind:
    """Why journalctl stopped, from its exit code and what it said."""
    if "Failed to seek to cursor" in stderr:
        return "cursor_invalid"
    if "insufficient permissions" in stderr or "Permission denied" in stderr:
        return "no_permission"
    if "No such file or directory" in stderr and "Failed to open" in stderr:
        return "no_directory"
    return "failed"


def is_partial_view(stderr: str) -> bool:
    """journalctl's hint that this user sees only its own entries, not the system's."""
    return "not seeing messages from other users and the system" in stderr


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


def status_entry(directory: str | None, units: Sequence[str], cursor: str | None,
                 head: Cursor | None, shipped_seqnum: int | None = None) -> dict[str, Any]:
    """One item of `shipper status --json`'s `journald` list (SPEC) for a stopped daemon: the
    input, the committed cursor and how far the acknowledged position (`shipped_seqnum`, the
    seqnum below which every queued entry is acknowledged; None: the cursor's) is behind the
    journal's head. The seconds are known only when everything queued is acknowledged."""
    pos = None if cursor is None else parse_cursor(cursor)
    if pos is not None and shipped_seqnum is not None and shipped_seqnum != pos.seqnum:
        pos = Cursor("", pos.seqnum_id, shipped_seqnum)
    lag = journal_lag(head, pos)
    return {"directory": directory, "units": list(units), "cursor": cursor, "lag_entries": lag.entries,
            "lag_seconds": lag.seconds}
