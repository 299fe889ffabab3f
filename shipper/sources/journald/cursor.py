"""Pure: where a journal read stands: cursors, the `_id` an entry gets, the key its cursor is
stored under, gaps (entries vacuumed before they were read), lag, journalctl's argv and exits.
No I/O, no entries decoded (entries.py); the child is reader.py's."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple

from shipper.model import JournalGap

StartAt = Literal["beginning", "end"]
GapReason = Literal["vacuumed", "cursor_invalid", "seqnum_jump"]
Gap = JournalGap              # entries lost before they were read (a value of model.py: Events tells it); reason: GapReason

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
    # journalctl's own order (s i b m t x) is the fast path (one entry at a time)
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


def is_behind(head: Cursor | None, position: Cursor | None) -> bool:
    """Is `head` (the journal's newest matching entry) newer than `position` (the last one journalctl
    printed, or the one it started from)? Within a sequence by seqnum, across sequences by realtime."""
    if head is None:
        return False
    if position is None or head.seqnum_id != position.seqnum_id:
        return position is None or (head.realtime_us or 0) > (position.realtime_us or 0)
    return head.seqnum > position.seqnum


def doc_id(c: Cursor) -> str:
    """The entry's `_id`: `j-<seqnum id>-<seqnum>`. Deterministic (a re-read entry is a 409); file
    ids are `<12 hex>-<offset>`, so the two never collide."""
    return f"j-{c.seqnum_id}-{c.seqnum}"


def journal_key(directory: str | None, units: Sequence[str]) -> str:
    """The name a journald input's cursor is stored under: its journal and its unit filter."""
    key = "journald:" + (directory or "system")
    return key + ("?" + ",".join(sorted(set(units))) if units else "")


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
