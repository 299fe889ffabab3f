"""The watchers: inotify on the event loop (watchdog where inotify cannot be had) turned into
wake-ups and the paths a reader should look at. They only wake the loop: inotify can drop events,
so the rescan decides what exists. What to watch comes from the globs and links (watchplan.py),
walked off the loop (dirwalk.py); watchdog's fallback is watch_fallback.py."""

from __future__ import annotations

import asyncio
import errno
import os
import stat as stat_mod
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from shipper.config import InputConfig
from shipper.tail import inotify
from shipper.tail.dirwalk import GONE, Walk, open_child, open_dir
from shipper.tail.discovery import LinkTarget
from shipper.tail.watch_fallback import WatchdogWatcher
from shipper.tail.watchplan import (
    MAX_PENDING_PATHS,
    Glob,
    GlobTable,
    Item,
    glob_root,
    link_watch_targets,
    links_by_target,
    translate,
)

__all__ = ["MAX_PENDING_PATHS", "InotifyWatcher", "WatchdogWatcher", "Watcher", "link_watch_targets",
           "make_watcher"]


class Watcher(Protocol):
    """What a file source asks of its watcher. `scan_wanted`: something was created or moved in,
    or events were lost (the source rescans and clears it); `incomplete`: why some directory could
    not be watched (None while all are); `dropped`: how often events were lost."""

    scan_wanted: bool
    incomplete: str | None
    dropped: int

    @property
    def names_writes(self) -> bool:
        """Every write to a watched file comes as an event naming it (while `incomplete` is None)."""
        ...

    def take_modified(self) -> set[str]: ...
    def poll(self) -> None: ...
    def pause(self) -> None: ...
    def resume(self) -> None: ...
    def drain(self) -> None: ...
    def watch(self, inputs: Sequence[InputConfig], links: Mapping[str, LinkTarget] | None = None) -> None: ...
    def stop(self) -> None: ...


def make_watcher(loop: asyncio.AbstractEventLoop, wake: asyncio.Event) -> Watcher:
    """The inotify watcher, or watchdog's where inotify is not available (not Linux, or the
    instance limit is reached)."""
    try:
        fd = inotify.init()
    except OSError:
        return WatchdogWatcher(loop, wake)
    return InotifyWatcher(loop, wake, fd)


# The most inotify watches one watcher adds: the watches are root's (`fs.inotify.max_user_watches`,
# shared by every service of the user: systemd, other daemons), and whoever can write a watched
# directory can make directories. A quarter of the host's limit leaves the rest to them; 8,192 (the
# kernel's own default limit before 5.11) is more directories than a log tree has. Past it the
# watcher is `incomplete`: the reader reads every open file every round and the rescan finds every
# file, so nothing is lost, only the wake-up on a write in a directory not watched.
MAX_WATCHES = 8192


def watch_limit(max_user_watches: str = "/proc/sys/fs/inotify/max_user_watches") -> int:
    """The bound on the watches one watcher adds: MAX_WATCHES or a quarter of the host's limit."""
    try:
        with open(max_user_watches) as f:
            host = int(f.read())
    except (OSError, ValueError):
        return MAX_WATCHES
    return max(1, min(MAX_WATCHES, host // 4))


@dataclass(frozen=True, slots=True)
class _Dir:
    """A watched directory: the paths it was reached by (one directory by two paths, a symlinked
    one or two globs', is one watch, and each event is reported under every path, as the globs may
    have found its files by either), its items (watchplan.py), its (dev, inode)."""

    paths: tuple[str, ...]
    items: frozenset[Item]
    key: tuple[int, int]
    descends: bool              # a directory made in it may be one to watch


class InotifyWatcher:
    """inotify on the event loop: an fs event sets `wake`, and notes what the reader should look at:
    `scan_wanted` (something was created or moved in: rescan the globs) or the path of a modified
    file (a closed file that grows is reopened without a full rescan). inotify can drop events,
    so the periodic rescan still decides what exists.

    The inotify fd is read by the loop itself (`add_reader`): a write to a watched file costs one
    epoll wake-up of the loop, not a hand-over through watchdog's three threads and the loop's
    self-pipe (docs/development.md has the cost). Where inotify is not available (not Linux, or
    the instance limit is reached), `make_watcher` gives a `WatchdogWatcher` instead.

    What is watched (SPEC, Trust boundaries): each glob's fixed part and the directories below it
    that a glob can match files in (watchplan.py: no deeper than its parts, a `**` MAX_DEPTH
    levels), entered as dirwalk.py opens them (no link `symlinks` would not follow), at most
    `max_watches` of them. The loop never walks a directory: a directory made under a watched one
    is noted, and the next rescan's `watch` (in the rescan's worker thread) watches and walks it.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, wake: asyncio.Event, fd: int,
                 max_watches: int | None = None) -> None:
        self._fd = fd
        self._loop = loop
        self._wake = wake
        self._lock = threading.Lock()        # watch() runs in a worker thread (with the rescan)
        self._table = GlobTable()
        self._watched: set[str] = set()     # "dir|what" keys of the roots watch() walked
        self._link_roots: list[str] = []    # the directories of the last links' targets
        self._dirs: dict[int, _Dir] = {}    # watch descriptor -> its directory
        self._made: list[tuple[int, str]] = []   # (wd, name): directories made since, for the next watch()
        self.max_watches = watch_limit() if max_watches is None else max_watches
        self._modified: set[str] = set()
        self._link_of: dict[str, tuple[str, ...]] = {}   # symlink target -> matched paths
        self.scan_wanted = False
        self._paused = False
        # why some directory could not be watched (inotify's limits, permissions, the bound), None
        # while every one is: then a write may go unnamed, and the reader reads every open file every round
        self.incomplete: str | None = None
        self.dropped = 0     # times events were lost (queue overflow, too many pending paths, a failed read)
        self._rewalk = False
        self._why: str | None = None       # this watch()'s refusal (the walk's thread only)
        self._by_fd = os.path.isdir("/proc/self/fd")   # a watch added to what was opened, not to a path
        loop.add_reader(self._fd, self._on_readable)

    names_writes = True
    """Every write to a file under a watched directory comes as an event naming its path (while
    `incomplete` is None): a file read to its end need not be read again until it is named."""

    @property
    def watches(self) -> int:
        """How many directories are watched now."""
        with self._lock:
            return len(self._dirs)

    def _add(self, paths: tuple[str, ...], fd: int, st: os.stat_result, items: frozenset[Item]) -> bool | None:
        """dirwalk's `Adder`: the directory open at `fd` watched (the kernel's answer says whether it
        was already: one inode, one watch descriptor)."""
        try:
            wd = inotify.add_watch(self._fd, f"/proc/self/fd/{fd}" if self._by_fd else paths[0])
        except OSError as e:
            if e.errno not in (errno.ENOENT, errno.ENOTDIR):      # gone meanwhile: nothing there to miss
                self._why = f"{paths[0]}: {e.strerror or e}"
            return False
        with self._lock:
            old = self._dirs.get(wd)
            if old is None:
                if len(self._dirs) >= self.max_watches:
                    inotify.rm_watch(self._fd, wd)
                    self._why = (f"{paths[0]}: not watched, more than {self.max_watches} directories would be "
                                 "(the bound on inotify watches)")
                    return None
                self._dirs[wd] = _Dir(paths, items, (st.st_dev, st.st_ino), self._table.descends(items))
            else:
                merged = items | old.items
                got = old.paths + tuple(p for p in paths if p not in old.paths)
                self._dirs[wd] = _Dir(got, merged, (st.st_dev, st.st_ino), self._table.descends(merged))
        return True

    def _on_readable(self) -> int:
        """Read one buffer of events; how many bytes it held (0: none queued)."""
        try:
            data = os.read(self._fd, inotify.READ_BYTES)
        except BlockingIOError:
            return 0
        except OSError:
            self.scan_wanted = self._rewalk = True
            self.dropped += 1
            self._wake.set()
            return 0
        modified: list[str] = []
        pos = 0
        n = len(data)
        with self._lock:
            dirs = self._dirs
            while pos + inotify.EVENT_HEAD <= n:
                wd, mask, _cookie, length = inotify.EVENT.unpack_from(data, pos)
                name = data[pos + inotify.EVENT_HEAD:pos + inotify.EVENT_HEAD + length].rstrip(b"\0")
                pos += inotify.EVENT_HEAD + length
                if mask & inotify.IN_Q_OVERFLOW:
                    # lost events may have been directories made: the next watch() walks everything again
                    self.scan_wanted = self._rewalk = True
                    self.dropped += 1
                    continue
                where = dirs.get(wd)
                if where is None:
                    continue
                if mask & (inotify.IN_IGNORED | inotify.IN_MOVE_SELF):
                    # gone, or moved away (its events would name paths it is no longer at): watch()
                    # watches whatever is at its paths after the rescan
                    del dirs[wd]
                    self._forget_roots(where.paths)
                    if mask & inotify.IN_MOVE_SELF:
                        inotify.rm_watch(self._fd, wd)
                        self.scan_wanted = self._rewalk = True
                    elif self.incomplete is not None and len(dirs) < self.max_watches:
                        self.scan_wanted = self._rewalk = True      # room again: walk for what was not watched
                    continue
                if mask & (inotify.IN_CREATE | inotify.IN_MOVED_TO):
                    if where.descends:
                        # a directory (or a link, maybe to one) made or moved in where a glob may
                        # match below: watched and walked by the next rescan's watch(), before it
                        # lists, off the loop; too many to note: that watch() walks everything again
                        if len(self._made) < self.max_watches:
                            self._made.append((wd, os.fsdecode(name)))
                        else:
                            self._rewalk = True
                    if where.descends or not mask & inotify.IN_ISDIR:
                        self.scan_wanted = True     # no file can match in a directory made deeper
                elif mask & inotify.NAMED and not mask & inotify.IN_ISDIR and name:
                    # written, or renamed away or deleted: an open file at that path is looked at
                    fname = os.fsdecode(name)
                    modified.extend(os.path.join(d, fname) for d in where.paths)
            if modified:
                if len(self._modified) + len(modified) <= MAX_PENDING_PATHS:
                    self._modified.update(modified)
                else:
                    self.scan_wanted = True
                    self.dropped += 1
        self._wake.set()
        return n

    def _forget_roots(self, paths: tuple[str, ...]) -> None:
        for d in paths:
            prefix = d + "|"
            for key in [k for k in self._watched if k.startswith(prefix)]:
                self._watched.discard(key)
    def take_modified(self) -> set[str]:
        """The paths modified since the last call (and forget them); a symlink target's path
        comes with the matched paths that lead to it."""
        with self._lock:
            out, self._modified = self._modified, set()
            link_of = self._link_of
        return translate(out, link_of)

    def poll(self) -> None:
        """Take everything inotify queued, now (on the loop's thread): before a look that relies on
        it. An event is queued by the write itself, so after `poll` every write that ended before
        it has been named (or `scan_wanted` says some were dropped)."""
        for _ in range(64):
            if self._fd < 0 or self._on_readable() < inotify.READ_BYTES - inotify.EVENT_HEAD - 256:
                return
        self.scan_wanted = True      # a flood: the rescan looks at everything anyway

    def pause(self) -> None:
        """Stop reading inotify for a while (on the loop's thread): events wait in the kernel, where
        repeats of the same event merge, and are read at `resume`."""
        if self._fd >= 0 and not self._paused:
            self._loop.remove_reader(self._fd)
            self._paused = True

    def resume(self) -> None:
        if self._fd >= 0 and self._paused:
            self._loop.add_reader(self._fd, self._on_readable)
        self._paused = False

    def drain(self) -> None:
        """While paused: read what inotify queued meanwhile, now, without watching again (a steady
        writer's reads then cost no wake-up per write, nor an epoll registration per read round).
        All of it: a quiet file's event must not wait behind a busy directory's."""
        if self._paused:
            self.poll()

    def watch(self, inputs: Sequence[InputConfig], links: Mapping[str, LinkTarget] | None = None) -> None:
        """Watch the existing base directories of every glob and the directories below them a glob
        can match files in, the directories made since the last call, and the directories of the
        targets of `links` (`resolve_links` of the paths the rescan matched; each call replaces
        the last set). Idempotent: the rescan calls it before it lists (a directory made meanwhile
        is then either listed by the rescan or reported) and after. A watched directory that is
        removed (a deleted pod's) drops its watch. Blocking: any thread but the loop's."""
        if self._fd < 0:
            return
        table = self._table
        roots: dict[str, set[Item]] = {}
        for inp in inputs:
            for pattern in inp.paths:
                d, g, level = glob_root(pattern, inp.symlinks)
                if d not in ("", os.sep):
                    roots.setdefault(d, set()).update(table.closure([(table.index(g), 0, level)]))
        todo = [(f"{d}|{sorted(items)}", d, frozenset(items)) for d, items in roots.items()]
        with self._lock:
            if links is not None:
                self._link_of = links_by_target(links)
                self._link_roots = [d for d, _deep in link_watch_targets(links.values())]
            rewalk, self._rewalk = self._rewalk, False
            if rewalk:
                # events were lost, or a watched directory moved: wherever the globs lead is walked
                # again (a watch that exists is kept: inotify gives the same descriptor back)
                self._watched.clear()
                self._made.clear()
            made, self._made = self._made, []
        only = frozenset(table.closure([(table.index(Glob((), "none")), 0, 0)]))
        todo += [(f"{d}|False", d, only) for d in self._link_roots]
        self._why = None
        walk = Walk(table, self._add)
        for key, d, items in todo:
            with self._lock:
                if key in self._watched:
                    continue
                self._watched.add(key)
            got = open_dir(d)
            if got is None:
                with self._lock:
                    self._watched.discard(key)
                continue
            walk.visit((d,), got[0], got[1], items)
            if walk.stopped:
                break
        by_wd: dict[int, dict[str, None]] = {}
        for wd, name in made:
            by_wd.setdefault(wd, {})[name] = None        # each parent opened once, each name once
        for wd, names in by_wd.items():
            if walk.stopped:
                break
            self._walk_made(walk, wd, names)
        why = self._why or walk.why
        if rewalk:
            self.incomplete = why
        elif why is not None and self.incomplete is None:
            self.incomplete = why

    def _walk_made(self, walk: Walk, wd: int, names: Iterable[str]) -> None:
        """Watch the directories `names` made in the watched `wd`, and walk them: opened in the very
        directory the watch is on (its inode checked), never by a path looked at before."""
        with self._lock:
            where = self._dirs.get(wd)
        if where is None:
            return
        got = open_dir(where.paths[0])
        if got is None:
            return
        fd, st = got
        try:
            if (st.st_dev, st.st_ino) != where.key:
                return                   # moved meanwhile: its IN_MOVE_SELF makes the next watch() walk again
            for name in names:
                sub = self._table.step(where.items, name)
                if walk.stopped:
                    return
                if not sub:
                    continue
                try:
                    mode = os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode
                    is_link = stat_mod.S_ISLNK(mode)
                    child = open_child(fd, name, is_link, self._table, sub) \
                        if is_link or stat_mod.S_ISDIR(mode) else None     # most are files: nothing to watch
                except OSError as e:
                    if e.errno not in GONE:
                        walk.why = f"{os.path.join(where.paths[0], name)}: {e.strerror or e}"
                    continue
                if child is not None:
                    walk.visit(tuple(os.path.join(p, name) for p in where.paths), child[0], child[1], sub)
        finally:
            os.close(fd)

    def stop(self) -> None:
        """Stop watching (any thread: the fd is taken off the loop on the loop's own thread)."""
        fd, self._fd = self._fd, -1
        if fd < 0:
            return
        try:
            on_loop = asyncio.get_running_loop() is self._loop
        except RuntimeError:
            on_loop = False
        if on_loop or self._loop.is_closed():
            _close_watch_fd(self._loop, fd)
            return
        done = threading.Event()

        def close() -> None:
            _close_watch_fd(self._loop, fd)
            done.set()

        try:
            self._loop.call_soon_threadsafe(close)
        except RuntimeError:       # the loop closed meanwhile
            os.close(fd)
            return
        done.wait(5)
        with self._lock:
            self._dirs.clear()
            self._watched.clear()
            self._made.clear()


def _close_watch_fd(loop: asyncio.AbstractEventLoop, fd: int) -> None:
    if not loop.is_closed():
        loop.remove_reader(fd)
    os.close(fd)
