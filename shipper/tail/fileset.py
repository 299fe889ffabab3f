"""The open-file set under `max_open_files` (Vector's FileServer): files open, waiting for a slot (in
arrival order), or parked (read to the end and closed). One slot stays free for the short looks, so
the cap is never exceeded, not even for an instant. No reading and no deciding: sources/ does both."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Literal, Protocol

from shipper.events import Events
from shipper.model import Checkpoint, Held, Line
from shipper.tail.harvester import Harvester

Key = tuple[int, int]                 # (dev, inode)
MAX_UNREPORTED = 4096                 # unreported files remembered (a bound, not a target)
Role = Literal["live", "copy"]        # live: the file itself (maybe renamed); copy: a rotated copy read to its end
Why = Literal["glob", "renamed", "copy", "gz", "successor"]


class Holder(Protocol):
    """What holds lines back from a checkpoint (the multiline aggregator, the container joiner):
    never checkpoint past `pending_start`. Each call returns what it lets go of (`Held`: events,
    then container records); sources/file_reading.py feeds it and builds what comes out."""

    @property
    def pending_start(self) -> int | None: ...
    @property
    def next_deadline(self) -> float | None:
        """When `release_due` has something to let go of (None: nothing held)."""
        ...
    @property
    def waits_closed(self) -> bool:
        """What it holds may wait while the file is closed (parked for inactivity)."""
        ...
    def hold(self, lines: list[Line], now: float) -> Held: ...
    def release_due(self, now: float) -> Held: ...
    def release(self, tail: list[Line], now: float) -> Held:
        """The file will not grow again: `tail` fed, then everything held."""
        ...
    def replay(self, cuts: list[int] | tuple[int, ...]) -> None:
        """The end offsets where an earlier read completed events by time (`Checkpoint.cuts`):
        this read completes them there too (parse/multiline.py)."""
        ...
    def take_cuts(self) -> list[int]:
        """The end offsets of events completed by time since the last call (to be recorded)."""
        ...


@dataclass(slots=True)
class OpenFile:
    harvester: Harvester
    input_idx: int
    # a MultilineAggregator (multiline) or a ContainerJoiner (docker/cri): `holder`
    _holder: Holder | None = None
    role: Role = "live"
    line_bytes: float = 0.0          # mean line length of the last read (sizes reads to the draft's room)
    # read to its end with nothing new since: read rounds pass it by until inotify names its path
    # (a write, a rename, a deletion) or the periodic full look (`sources/files.py`): `quiet`
    _quiet: bool = False
    # a full check found a change that no inotify event announced (a hard link written elsewhere,
    # a writer in another mount): never quiet again, read every round as before
    unreported: bool = False
    # the FileSet it is open in and its key there: `quiet` and `holder` keep that set's indexes
    # (`FileSet.awake`, `FileSet.holding`) current, so a round need not walk every open file
    _set: FileSet | None = field(default=None, repr=False)
    _key: Key = (0, 0)

    @property
    def quiet(self) -> bool:
        return self._quiet

    @quiet.setter
    def quiet(self, value: bool) -> None:
        self._quiet = value
        fs = self._set
        if fs is not None:
            if value:
                fs.awake.pop(self._key, None)
            else:
                fs.awake[self._key] = self

    @property
    def holder(self) -> Holder | None:
        return self._holder

    @holder.setter
    def holder(self, value: Holder | None) -> None:
        self._holder = value
        fs = self._set
        if fs is not None:
            if value is None:
                fs.holding.pop(self._key, None)
            else:
                fs.holding[self._key] = self

    @property
    def checkpoint(self) -> Checkpoint:
        return self.harvester.checkpoint

    def committed_offset(self) -> int:
        """The offset a checkpoint may record: never past a line still held (partial or multiline)."""
        off = self.harvester.splitter.offset
        if self.holder is not None:
            ps = self.holder.pending_start
            if ps is not None and ps < off:
                off = ps
        return off

    def holds_lines(self) -> bool:
        return self.holder is not None and self.holder.pending_start is not None


@dataclass(slots=True)
class Candidate:
    """A file to open: found by the globs, or where an incarnation's content lives now."""

    path: str
    input_idx: int
    key: Key
    why: Why
    cp: Checkpoint | None = None    # the incarnation it continues
    first_scan: bool = False
    doc_path: str | None = None     # successor: the path its lines were written at
    since: float = 0.0              # successor: changed after this (wall time)


@dataclass(slots=True)
class Parked:
    """A closed file read to its end: reopened when its size or mtime changes."""

    size: int
    mtime_ns: int
    incarnation: str | None
    path: str
    input_idx: int


class FileSet:
    def __init__(self, max_open_files: int, events: Events) -> None:
        self.max_open = max(1, max_open_files)
        self.events = events
        self.open: dict[Key, OpenFile] = {}
        self.waiting: dict[Key, Candidate] = {}        # in arrival order: fair under max_open_files
        self.parked: dict[Key, Parked] = {}
        self._parked_paths: dict[str, Key] = {}
        self._open_paths: dict[str, Key] = {}          # the path each open file was opened at
        # indexes of `open`, kept by OpenFile's setters: the open files not quiet (what a read round
        # or check that passes quiet files by looks at) and those with a holder (whose deadlines
        # `flush_due` and `next_deadline` look at): an idle daemon's rounds cost O(1), not O(files)
        self.awake: dict[Key, OpenFile] = {}
        self.holding: dict[Key, OpenFile] = {}
        self.changes = 0                               # bumped at every open and close
        # files written where no inotify watch sees it (`OpenFile.unreported`), remembered across
        # closes and reopens so that each reopening is read every round at once
        self.unreported: set[Key] = set()

    def add(self, key: Key, f: OpenFile) -> None:
        """A file opened: every open goes through here, so `open_at` knows its path."""
        old = self.open.get(key)
        if old is not None and old is not f:
            self._unindex(key, old)
        self.open[key] = f
        f._set, f._key = self, key
        if not f.quiet:
            self.awake[key] = f
        if f.holder is not None:
            self.holding[key] = f
        self._open_paths[os.path.normpath(f.harvester.path)] = key
        self.changes += 1
        if key in self.unreported:
            f.unreported = True

    def mark_unreported(self, key: Key, f: OpenFile) -> None:
        f.unreported, f.quiet = True, False
        if len(self.unreported) >= MAX_UNREPORTED:
            self.unreported.clear()
        self.unreported.add(key)

    def open_paths(self) -> dict[str, Key]:
        """A copy of (normalised path -> key) of the open files, for the scan thread."""
        return dict(self._open_paths)

    def open_at(self, path: str) -> OpenFile | None:
        """The open file opened at `path` (the name inotify reports a write by), if any."""
        key = self._open_paths.get(os.path.normpath(path))
        return None if key is None else self.open.get(key)

    def _unindex(self, key: Key, f: OpenFile) -> None:
        if f._set is self:
            f._set = None
            if self.awake.get(key) is f:
                del self.awake[key]
            if self.holding.get(key) is f:
                del self.holding[key]
        p = os.path.normpath(f.harvester.path)
        if self._open_paths.get(p) == key:
            del self._open_paths[p]

    # ---------------------------------------------------------------- slots

    @property
    def look_slots(self) -> int:
        """Slots kept for short looks (one at a time: the reader awaits each look)."""
        return 1 if self.max_open > 1 else 0

    def free_slots(self) -> int:
        return self.max_open - self.look_slots - len(self.open)

    def reading(self, incarnation: str) -> bool:
        return any(f.checkpoint.incarnation == incarnation for f in self.open.values())

    def incarnations_open(self) -> set[str]:
        return {f.checkpoint.incarnation for f in self.open.values()}

    def idle(self, now: float) -> list[tuple[float, Key, OpenFile]]:
        """Open live files read to their end, least recently grown first: the ones to close for a
        waiting file. `now` is monotonic; their state is checked by the caller first."""
        out = []
        for key, f in self.open.items():
            h = f.harvester
            if f.role != "live" or h.state not in ("active", "renamed") or not h.at_eof or h.position < h.data_end:
                continue
            if f.holds_lines():
                continue
            out.append((h.last_growth, key, f))
        out.sort(key=lambda t: t[0])
        return out

    # ---------------------------------------------------------------- parking

    def park(self, key: Key, f: OpenFile, reason: str) -> None:
        """Close a file read to its end; it is reopened (by identity) when it changes. A renamed
        file is not remembered here (no glob shows it: its siblings' look finds it)."""
        h = f.harvester
        cp = f.checkpoint
        if h.state == "active":
            self.remember(key, Parked(h.size, h.mtime_ns, cp.incarnation, h.path, f.input_idx))
        self.events.file_parked(h.path, h.inode, cp.offset, reason)
        self.close(key)

    def remember(self, key: Key, p: Parked) -> None:
        """A file not open and read to its end (or not to be read): seen again only when it changes."""
        self.parked[key] = p
        self._parked_paths[p.path] = key

    def unpark(self, key: Key) -> Parked | None:
        p = self.parked.pop(key, None)
        if p is not None and self._parked_paths.get(p.path) == key:
            del self._parked_paths[p.path]
        return p

    def parked_paths(self) -> dict[str, Key]:
        """(normalised path -> key) of the parked files, for the scan thread."""
        return {os.path.normpath(path): key for path, key in self._parked_paths.items()}

    def parked_at(self, path: str) -> Key | None:
        return self._parked_paths.get(path)

    def close(self, key: Key) -> None:
        f = self.open.pop(key, None)
        if f is not None:
            self._unindex(key, f)
            self.changes += 1
            f.harvester.close()

    def close_all(self) -> None:
        for f in self.open.values():
            f._set = None
            f.harvester.close()
        self.open.clear()
        self.awake.clear()
        self.holding.clear()
        self._open_paths.clear()
        self.changes += 1


def disk_stat(fd: int) -> tuple[int, int]:
    """(size, mtime_ns) of an open fd; (-1, -1) when it cannot be stat'ed."""
    try:
        st = os.fstat(fd)
    except OSError:
        return -1, -1
    return st.st_size, st.st_mtime_ns
