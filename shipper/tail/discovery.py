"""Globs and excludes -> paths; a periodic rescan decides what exists, inotify only wakes us sooner.

inotify (read on the event loop; watchdog where it is not available) can drop events silently, so
a wake-up only shortens the wait before the next look. Never reads file contents.

Symbolic links (Kubernetes' /var/log/containers/*.log point into /var/log/pods): a file is the
target's (dev, inode) and keeps the matched path; the directories of the targets are watched like
the globs' (`resolve_links`, `Watcher.watch(inputs, links)`), since the runtime recreates its file
there at each rotation and no event comes from the link's own directory.
"""

from __future__ import annotations

import asyncio
import ctypes
import errno
import fnmatch
import os
import stat as stat_mod
import struct
import sys
import threading
import warnings
from collections.abc import Container, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from shipper.config import InputConfig
from shipper.tail.opening import Refused, judge_stat
from shipper.tail.scan import Scanner, base_dir


def is_excluded(path: str, excludes: Sequence[str]) -> bool:
    if not excludes:
        return False
    name = os.path.basename(path)
    for ex in excludes:
        if fnmatch.fnmatch(path, ex) or ("/" not in ex and fnmatch.fnmatch(name, ex)):
            return True
    return False


def scan_stat(inputs: Sequence[InputConfig], links: set[str] | None = None, *, scanner: Scanner | None = None,
              known: Mapping[str, tuple[int, int]] | None = None,
              reused: set[str] | None = None,
              fresh: Container[str] = (),
              refused: list[Refused] | None = None) -> list[tuple[str, int, os.stat_result]]:
    """Every regular file matched now, with its stat: (path, index of the first input whose globs
    match it, stat). A symlink and its target, or two links to one file, are followed once: the
    identity is (dev, inode), so no realpath walk is needed. The matched paths that are symbolic
    links are added to `links` (an lstat per path, a stat more only for a link: at 10,000 files
    a separate `islink` walk cost as much as the stats). A match its input's `symlinks` rule would
    not follow, or one on /proc, /sys or /dev, is left out and added to `refused` (`opening.judge_stat`:
    a first look, so such files are not opened at every rescan; the open judges what it opened).

    With a `scanner` (the daemon's rescans), directories unchanged since its last scan are not
    listed again, and a file `known` to be open at its path (path -> (dev, inode)) in such a
    directory is not stat'ed again: its entry carries the last scan's stat (the identity holds;
    size and times are the open fd's business) and its path is added to `reused`. A `known` path
    in `fresh` is stat'ed all the same (and its stat kept for the next scan). Without one, a
    scanner of its own walks the globs (`shipper check`): the same bounded walk as the daemon's."""
    out: list[tuple[str, int, os.stat_result]] = []
    paths: set[str] = set()
    seen: set[tuple[int, int]] = set()
    if scanner is None:
        scanner, known = Scanner(), None
    scanner.begin()
    for idx, inp in enumerate(inputs):
        for pattern in inp.paths:
            pattern = os.path.expanduser(pattern)
            for path in scanner.iglob(pattern, inp.symlinks):
                if path in paths or is_excluded(path, inp.exclude):
                    continue
                is_link = False
                st: os.stat_result | None = None
                if known:
                    k = known.get(path)
                    if k is not None and path not in fresh:
                        st = scanner.known_stat(path)
                        if st is not None and (st.st_dev, st.st_ino) != k:
                            st = None
                        elif st is not None and reused is not None:
                            reused.add(path)
                if st is None:
                    try:
                        lst = st = os.lstat(path)
                        is_link = stat_mod.S_ISLNK(st.st_mode)
                        if is_link:
                            st = os.stat(path)
                    except OSError:
                        continue
                    why = judge_stat(path, lst, st, inp.symlinks)
                    if why is not None:
                        if refused is not None:
                            refused.append(why)
                        continue
                if known and not is_link and path in known and stat_mod.S_ISREG(st.st_mode):
                    scanner.note_stat(path, st)     # kept for open files only: they are what may reuse it
                if not stat_mod.S_ISREG(st.st_mode):
                    continue
                key = (st.st_dev, st.st_ino)
                if key in seen:
                    continue
                seen.add(key)
                paths.add(path)
                if is_link and links is not None:
                    links.add(path)
                out.append((path, idx, st))
    scanner.end()
    if refused is not None:
        refused.extend(scanner.refused)
    return out


def glob_bases(inp: InputConfig) -> list[str]:
    """The fixed parts of an input's globs, longest first (`opening.glob_rule`)."""
    return sorted({os.path.normpath(base_dir(os.path.expanduser(p))[0]) for p in inp.paths}, key=len, reverse=True)


def scan(inputs: Sequence[InputConfig], refused: list[Refused] | None = None) -> dict[str, int]:
    """Every regular file matched now: path -> index of the first input whose globs match it."""
    return {path: idx for path, idx, _st in scan_stat(inputs, refused=refused)}


MAX_PENDING_PATHS = 4096


def watch_targets(inputs: Sequence[InputConfig]) -> list[tuple[str, bool]]:
    """(directory, recursive) to watch for these inputs: each glob's base directory, or while it
    does not exist its nearest existing parent, recursively (so its appearance is seen); never /."""
    out = []
    for inp in inputs:
        for pattern in inp.paths:
            d, deep = base_dir(os.path.expanduser(pattern))
            while not os.path.isdir(d) and d != os.sep:
                d, deep = os.path.dirname(d), True
            if d != os.sep:
                out.append((d, deep))
    return out


MAX_LINK_HOPS = 40     # as the kernel's own limit on nested symlinks (ELOOP)


@dataclass(frozen=True, slots=True)
class LinkTarget:
    """A matched path that is a symbolic link, resolved: the file it leads to and the directories
    to watch for it (the final target's, where its writer recreates it after a rotation, and each
    intermediate link's, where a link may be replaced)."""

    path: str                  # the matched path: log.file.path, the link
    target: str                # the file at the end of the chain (realpath)
    dirs: tuple[str, ...]


def resolve_link(path: str) -> LinkTarget | None:
    """The chain of links from `path` to a file; None when `path` is no link, or the chain
    dangles or loops (the rescan, which stats through it, will not see a file there either)."""
    hops: list[str] = []
    cur = path
    for _ in range(MAX_LINK_HOPS):
        try:
            dest = os.readlink(cur)
        except OSError as e:
            if e.errno == errno.EINVAL and hops:
                break                          # not a link: the end of the chain
            return None                        # `path` is no link, or a hop vanished meanwhile
        cur = os.path.join(os.path.dirname(cur), dest)
        hops.append(cur)
    else:
        return None
    try:
        target = os.path.realpath(path, strict=True)
    except (OSError, RuntimeError):
        return None
    dirs = [os.path.dirname(target)]
    for hop in hops[:-1]:
        d = os.path.dirname(os.path.normpath(hop))
        if d not in dirs:
            dirs.append(d)
    return LinkTarget(path, target, tuple(dirs))


def resolve_links(paths: Iterable[str]) -> dict[str, LinkTarget]:
    """The matched paths that are symbolic links, resolved (one lstat per path, readlinks for links)."""
    out: dict[str, LinkTarget] = {}
    for p in paths:
        if os.path.islink(p):
            lt = resolve_link(p)
            if lt is not None:
                out[p] = lt
    return out


def link_watch_targets(links: Iterable[LinkTarget]) -> list[tuple[str, bool]]:
    """(directory, recursive=False) to watch for these links' targets, each once; never /."""
    out: list[tuple[str, bool]] = []
    seen: set[str] = set()
    for lt in links:
        for d in lt.dirs:
            if d != os.sep and d not in seen:
                seen.add(d)
                out.append((d, False))
    return out


def _links_by_target(links: Mapping[str, LinkTarget]) -> dict[str, tuple[str, ...]]:
    """target path -> the matched paths leading to it: a write inotify reports on the target
    is reported on the paths the reader knows the file by."""
    by: dict[str, list[str]] = {}
    for lt in links.values():
        by.setdefault(lt.target, []).append(lt.path)
    return {t: tuple(ps) for t, ps in by.items()}


def _translate(modified: set[str], link_of: Mapping[str, tuple[str, ...]]) -> set[str]:
    if not link_of:
        return modified
    out = set(modified)
    for p in modified:
        out.update(link_of.get(p, ()))
    return out


class Watcher:
    """inotify on the event loop: an fs event sets `wake`, and notes what the reader should look at:
    `scan_wanted` (something was created or moved in: rescan the globs) or the path of a modified
    file (a closed file that grows is reopened without a full rescan). inotify can drop events,
    so the periodic rescan still decides what exists.

    The inotify fd is read by the loop itself (`add_reader`): a write to a watched file costs one
    epoll wake-up of the loop, not a hand-over through watchdog's three threads and the loop's
    self-pipe (about 6% of a core at 200 writes/s). Where inotify is not available (not Linux,
    or the instance limit is reached), `WatchdogWatcher` does the same through watchdog.
    """

    _fd: int

    def __new__(cls, loop: asyncio.AbstractEventLoop, wake: Any) -> Any:
        if cls is Watcher:
            try:
                fd = _inotify_init()
            except OSError:
                return WatchdogWatcher(loop, wake)
            w = super().__new__(cls)
            w._fd = fd
            return w
        return super().__new__(cls)

    def __init__(self, loop: asyncio.AbstractEventLoop, wake: Any) -> None:
        self._loop = loop
        self._wake = wake
        self._lock = threading.Lock()        # watch() runs in a worker thread (with the rescan)
        self._watched: set[str] = set()     # "dir|recursive" keys asked for by watch()
        # watch descriptor -> (the paths the directory was watched by, recursive): one directory
        # reached by two paths (a symlinked directory, two globs) is one watch, and each event is
        # reported under every path, as the globs may have found its files by either
        self._dirs: dict[int, tuple[tuple[str, ...], bool]] = {}
        self._modified: set[str] = set()
        self._link_of: dict[str, tuple[str, ...]] = {}   # symlink target -> matched paths
        self.scan_wanted = False
        self._paused = False
        # why some directory could not be watched (inotify's limits, permissions), None while every
        # one is: then a write may go unnamed, and the reader reads every open file every round
        self.incomplete: str | None = None
        self.dropped = 0     # times events were lost (queue overflow, too many pending paths, a failed read)
        self._rewalk = False
        loop.add_reader(self._fd, self._on_readable)

    names_writes = True
    """Every write to a file under a watched directory comes as an event naming its path (while
    `incomplete` is None): a file read to its end need not be read again until it is named."""

    def _refused(self, d: str, e: OSError) -> None:
        if e.errno not in (errno.ENOENT, errno.ENOTDIR):      # gone meanwhile: nothing there to miss
            self.incomplete = f"{d}: {e.strerror or e}"

    def _add(self, d: str, deep: bool) -> bool:
        """Watch one directory (and, when deep, every directory under it). False if d is not watchable."""
        try:
            wd = _inotify_add_watch(self._fd, d)
        except OSError as e:
            self._refused(d, e)
            return False       # gone meanwhile, or inotify limits reached: the rescan still finds everything
        self._note(wd, d, deep)
        if deep:
            # after the watch is in place: a directory created meanwhile is either seen here or reported
            for root, subdirs, _files in os.walk(d):
                for sub in subdirs:
                    p = os.path.join(root, sub)
                    try:
                        swd = _inotify_add_watch(self._fd, p)
                    except OSError as e:
                        self._refused(p, e)
                        continue
                    self._note(swd, p, True)
        return True

    def _note(self, wd: int, d: str, deep: bool) -> None:
        with self._lock:
            old = self._dirs.get(wd)        # one directory by two paths: one watch, recursive if either is
            if old is None:
                self._dirs[wd] = ((d,), deep)
            else:
                self._dirs[wd] = (old[0] if d in old[0] else (*old[0], d), deep or old[1])

    def _on_readable(self) -> int:
        """Read one buffer of events; how many bytes it held (0: none queued)."""
        try:
            data = os.read(self._fd, _READ_BYTES)
        except BlockingIOError:
            return 0
        except OSError:
            self.scan_wanted = True
            self.dropped += 1
            self._wake.set()
            return 0
        modified: list[str] = []
        new_dirs: list[str] = []
        pos = 0
        n = len(data)
        with self._lock:
            dirs = self._dirs
            while pos + _EVENT_HEAD <= n:
                wd, mask, _cookie, length = _EVENT.unpack_from(data, pos)
                name = data[pos + _EVENT_HEAD:pos + _EVENT_HEAD + length].rstrip(b"\0")
                pos += _EVENT_HEAD + length
                if mask & _IN_Q_OVERFLOW:
                    self.scan_wanted = True
                    self.dropped += 1
                    continue
                where = dirs.get(wd)
                if where is None:
                    continue
                paths, deep = where
                if mask & (_IN_IGNORED | _IN_MOVE_SELF):
                    # gone, or moved away (its events would name paths it is no longer at): watch()
                    # watches whatever is at its paths after the rescan
                    del dirs[wd]
                    for d in paths:
                        self._watched.discard(f"{d}|True")
                        self._watched.discard(f"{d}|False")
                    if mask & _IN_MOVE_SELF:
                        _inotify_rm_watch(self._fd, wd)
                        self.scan_wanted = self._rewalk = True
                    continue
                if mask & (_IN_CREATE | _IN_MOVED_TO):
                    self.scan_wanted = True
                    if mask & _IN_ISDIR and deep:
                        new_dirs.extend(os.path.join(d, os.fsdecode(name)) for d in paths)
                elif mask & _NAMED and not mask & _IN_ISDIR and name:
                    # written, or renamed away or deleted: an open file at that path is looked at
                    fname = os.fsdecode(name)
                    modified.extend(os.path.join(d, fname) for d in paths)
            if modified:
                if len(self._modified) + len(modified) <= MAX_PENDING_PATHS:
                    self._modified.update(modified)
                else:
                    self.scan_wanted = True
                    self.dropped += 1
        for d in new_dirs:
            self._add(d, True)
        self._wake.set()
        return n

    def take_modified(self) -> set[str]:
        """The paths modified since the last call (and forget them); a symlink target's path
        comes with the matched paths that lead to it."""
        with self._lock:
            out, self._modified = self._modified, set()
            link_of = self._link_of
        return _translate(out, link_of)

    def poll(self) -> None:
        """Take everything inotify queued, now (on the loop's thread): before a look that relies on
        it. An event is queued by the write itself, so after `poll` every write that ended before
        it has been named (or `scan_wanted` says some were dropped)."""
        for _ in range(64):
            if self._fd < 0 or self._on_readable() < _READ_BYTES - _EVENT_HEAD - 256:
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
        """Watch the existing base directories of every glob, and the directories of the targets
        of `links` (`resolve_links` of the paths the rescan matched; each call replaces the last
        set). Idempotent: call it after each rescan, so a directory that appears later gets its
        own watch. A watched directory that is removed (a deleted pod's) drops its watch. Any thread."""
        if self._fd < 0:
            return
        extra: list[tuple[str, bool]] = []
        if links is not None:
            extra = link_watch_targets(links.values())
            with self._lock:
                self._link_of = _links_by_target(links)
        with self._lock:
            if self._rewalk:
                # a watched directory moved: wherever it went under the globs is walked again
                # (a watch that exists is kept: inotify gives the same descriptor back)
                self._rewalk = False
                self._watched.clear()
        for d, deep in watch_targets(inputs) + extra:
            key = f"{d}|{deep}"
            with self._lock:
                if key in self._watched:
                    continue
                self._watched.add(key)
            if not self._add(d, deep):
                with self._lock:
                    self._watched.discard(key)

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


def _close_watch_fd(loop: asyncio.AbstractEventLoop, fd: int) -> None:
    if not loop.is_closed():
        loop.remove_reader(fd)
    os.close(fd)


# inotify(7), through libc: no thread of its own, the loop polls the fd
_IN_MODIFY, _IN_ATTRIB, _IN_MOVED_FROM, _IN_MOVED_TO, _IN_CREATE, _IN_DELETE = 0x2, 0x4, 0x40, 0x80, 0x100, 0x200
_IN_MOVE_SELF, _IN_Q_OVERFLOW, _IN_IGNORED, _IN_ONLYDIR, _IN_ISDIR = 0x800, 0x4000, 0x8000, 0x01000000, 0x40000000
_IN_NONBLOCK, _IN_CLOEXEC = os.O_NONBLOCK, os.O_CLOEXEC
_NAMED = _IN_MODIFY | _IN_ATTRIB | _IN_MOVED_FROM | _IN_DELETE     # events that name a file to look at
_WATCH_MASK = _NAMED | _IN_MOVED_TO | _IN_CREATE | _IN_MOVE_SELF | _IN_ONLYDIR
_EVENT = struct.Struct("iIII")       # wd, mask, cookie, len (then len bytes of NUL-padded name)
_EVENT_HEAD = _EVENT.size
_READ_BYTES = 64 * 1024
_libc: Any = None


def _inotify_init() -> int:
    global _libc
    if _libc is None:
        if not sys.platform.startswith("linux"):
            raise OSError(errno.ENOSYS, "inotify is Linux only")
        lib = ctypes.CDLL(None, use_errno=True)
        if not hasattr(lib, "inotify_init1"):
            raise OSError(errno.ENOSYS, "no inotify in libc")
        lib.inotify_init1.argtypes = [ctypes.c_int]
        lib.inotify_add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
        lib.inotify_rm_watch.argtypes = [ctypes.c_int, ctypes.c_int]
        _libc = lib
    fd = _libc.inotify_init1(_IN_NONBLOCK | _IN_CLOEXEC)
    if fd < 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))
    return int(fd)


def _inotify_rm_watch(fd: int, wd: int) -> None:
    _libc.inotify_rm_watch(fd, wd)     # EINVAL when the kernel removed it already: nothing to do


def _inotify_add_watch(fd: int, path: str) -> int:
    wd = _libc.inotify_add_watch(fd, os.fsencode(path), _WATCH_MASK)
    if wd < 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e), path)
    return int(wd)


class WatchdogWatcher:
    """The portable fallback of `Watcher`: bridges watchdog (its own threads) to the event loop: an fs event sets `wake`, and notes what
    the reader should look at: `scan_wanted` (something was created or moved in: rescan the globs)
    or the path of a modified file (a closed file that grows is reopened without a full rescan).
    inotify can drop events, so the periodic rescan still decides what exists."""

    def __init__(self, loop: asyncio.AbstractEventLoop, wake: asyncio.Event) -> None:
        self._loop = loop
        self._wake = wake
        self._observer: Any = None
        self._pending = threading.Event()
        self._watched: set[str] = set()
        self._lock = threading.Lock()
        self._modified: set[str] = set()
        self._link_of: dict[str, tuple[str, ...]] = {}
        self.scan_wanted = False
        self.incomplete: str | None = None
        self.dropped = 0

    names_writes = False
    """watchdog's events are not relied on to name every write: every open file is read every round."""

    def poll(self) -> None:
        """See `Watcher.poll`: watchdog's threads deliver events as they come."""

    def _poke(self) -> None:
        self._pending.clear()
        self._wake.set()

    def _on_event(self, event: Any) -> None:
        # called on watchdog's thread; coalesce bursts into one wake-up per loop turn
        kind = event.event_type
        if kind == "modified" and not event.is_directory:
            with self._lock:
                if len(self._modified) < MAX_PENDING_PATHS:
                    self._modified.add(os.fsdecode(event.src_path))
                else:
                    self.scan_wanted = True
        elif kind in ("created", "moved"):
            self.scan_wanted = True
        if not self._pending.is_set():
            self._pending.set()
            try:
                self._loop.call_soon_threadsafe(self._poke)
            except RuntimeError:
                pass  # loop closed during shutdown

    def take_modified(self) -> set[str]:
        """The paths modified since the last call (and forget them), as `Watcher.take_modified`."""
        with self._lock:
            out, self._modified = self._modified, set()
            link_of = self._link_of
        return _translate(out, link_of)

    def pause(self) -> None:
        """Nothing to stop: watchdog's threads keep queueing events (the reader ignores wake-ups meanwhile)."""

    def resume(self) -> None:
        """See `pause`."""

    def drain(self) -> None:
        """See `pause`: the events were taken as they came."""

    def watch(self, inputs: Sequence[InputConfig], links: Mapping[str, LinkTarget] | None = None) -> None:
        """Schedule watches on the existing base directories of every glob and on the directories
        of the targets of `links`, as `Watcher.watch` (idempotent: call it after each rescan)."""
        # watchdog's inotify thread warns when a directory created under a recursive watch is
        # registered twice (a benign race it resolves itself); as an error it would kill that thread
        warnings.filterwarnings("ignore", message="Callback with id", category=RuntimeWarning)
        try:
            from watchdog.events import (
                DirCreatedEvent,
                DirMovedEvent,
                FileCreatedEvent,
                FileModifiedEvent,
                FileMovedEvent,
                FileSystemEventHandler,
            )
            from watchdog.observers import Observer
        except ImportError:  # pragma: no cover - watchdog is a dependency
            return
        if self._observer is None:
            handler = FileSystemEventHandler()
            handler.on_any_event = self._on_event  # type: ignore[method-assign]
            self._handler = handler
            # our own opens and closes are no news: ask inotify only for what can matter
            self._filter = [FileCreatedEvent, FileModifiedEvent, FileMovedEvent, DirCreatedEvent, DirMovedEvent]
            self._observer = Observer()
            self._observer.daemon = True
            self._observer.start()
        extra: list[tuple[str, bool]] = []
        if links is not None:
            extra = link_watch_targets(links.values())
            with self._lock:
                self._link_of = _links_by_target(links)
        for d, deep in watch_targets(inputs) + extra:
            key = f"{d}|{deep}"
            if key in self._watched:
                continue
            try:
                self._observer.schedule(self._handler, d, recursive=deep, event_filter=self._filter)
                self._watched.add(key)
            except OSError:
                pass  # inotify limits reached: the rescan still finds everything

    def stop(self) -> None:
        if self._observer is not None:
            self._observer.stop()
            self._observer.join(timeout=5)
            self._observer = None
            self._watched.clear()

