"""Pure: when a journald input looks at its journal's head, and when journalctl is asked again.
journalctl --follow can miss the last entry of a burst for good (systemd's reader counts an entry
before the writer lists it under its fields, then skips a file whose count is unchanged); so when the
files went quiet, and journalctl too, with a change its output does not cover, the head is compared."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import NamedTuple

from shipper.sources.journald.headers import FileMark, Marks

QUIET_S = 0.5          # the files unchanged and journalctl silent this long: settled
POLL_S = 1.0           # the files' headers looked at this often while the journal is idle...
ACTIVE_POLL_S = 0.25   # ...and this often within ACTIVE_S of a change or an entry printed
ACTIVE_S = 2.0
LOOK_EVERY_S = 2.0     # the head (a journalctl run) at most this often for lag while the files change


class Step(NamedTuple):
    """What one look at the files asks for: `look` at the head (it may have changed), `check` that
    journalctl printed up to it (the files settled with a change its output does not cover)."""

    look: bool
    check: bool


@dataclass(slots=True)
class QuietCheck:
    """The files' marks over time (monotonic seconds) -> Steps. A change is checked once, when it
    has settled: at most one check per quiet episode, and only one that printed entries don't cover."""

    quiet_s: float = QUIET_S
    look_every_s: float = LOOK_EVERY_S
    _marks: Marks | None = None
    _changed_at: float = float("-inf")
    _settled: Marks | None = None          # the marks last checked (None: none yet, every file counts as changed)
    _looked: Marks | None = None           # the marks of the last head look
    _looked_at: float = float("-inf")

    def observe(self, now: float, marks: Marks, busy_at: float, printed: Mapping[str, int]) -> Step:
        """`busy_at`: when journalctl last printed (or was started); `printed`: per sequence-number
        id, the newest seqnum it printed or was started from."""
        if marks != self._marks:
            self._marks = marks
            self._changed_at = now
        check = False
        if marks != self._settled and now - max(self._changed_at, busy_at) >= self.quiet_s:
            settled = self._settled or {}
            changed = [m for k, m in marks.items() if settled.get(k) != m]
            self._settled = marks
            check = any(not is_covered(m, printed) for m in changed)
        look = marks != self._looked and (check or now - self._looked_at >= self.look_every_s)
        if look:
            self._looked, self._looked_at = marks, now
        return Step(look, check)

    def poll_s(self, now: float, busy_at: float) -> float:
        """How long until the next look at the files."""
        active = now - max(self._changed_at, busy_at) < ACTIVE_S or self._marks != self._settled
        return ACTIVE_POLL_S if active else POLL_S


def is_covered(mark: FileMark, printed: Mapping[str, int]) -> bool:
    """Has journalctl printed (or started at or past) this file's newest entry? A lost wake-up holds
    back only the newest entry of a file (any later one wakes journalctl to read it), so then none is."""
    return mark.n_entries == 0 or printed.get(mark.seqnum_id, -1) >= mark.tail_seqnum
