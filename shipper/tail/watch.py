"""The watchers: inotify on the event loop (watchdog where inotify cannot be had) turned into
wake-ups and the paths a reader should look at. They only wake the loop: inotify can drop events,
so the rescan decides what exists. What to watch comes from the globs and links (discovery.py)."""

from __future__ import annotations

import asyncio
import errno
import os
import threading
import warnings
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Protocol

from shipper.config import InputConfig
from shipper.tail import inotify
from shipper.tail.discovery import LinkTarget
from shipper.tail.scan import base_dir

if TYPE_CHECKING:
    from watchdog.events import FileSystemEvent
    from watchdog.observers.api import BaseObserver


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


class InotifyWatcher:
    """inotify on the event loop: an fs event sets `wake`, and notes what the reader should look at:
    `scan_wanted` (something was created or moved in: rescan the globs) or the path of a modified
    file (a closed file that grows is reopened without a full rescan). inotify can drop events,
    so the periodic rescan still decides what exists.

    The inotify fd is read by the loop itself (`add_reader`): a write to a watched file costs one
    epoll wake-up of the loop, not a hand-over through watchdog's three threads and the loop's
    self-pipe (docs/development.md has the cost). Where inotify is not available (not Linux, or
    the instance limit is reached), `make_watcher` gives a `WatchdogWatcher` instead.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, wake: asyncio.Event, fd: int) -> None:
        self._fd = fd
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
            wd = inotify.add_watch(self._fd, d)
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
                        swd = inotify.add_watch(self._fd, p)
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
            data = os.read(self._fd, inotify.READ_BYTES)
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
            while pos + inotify.EVENT_HEAD <= n:
                wd, mask, _cookie, length = inotify.EVENT.unpack_from(data, pos)
                name = data[pos + inotify.EVENT_HEAD:pos + inotify.EVENT_HEAD + length].rstrip(b"\0")
                pos += inotify.EVENT_HEAD + length
                if mask & inotify.IN_Q_OVERFLOW:
                    self.scan_wanted = True
                    self.dropped += 1
                    continue
                where = dirs.get(wd)
                if where is None:
                    continue
                paths, deep = where
                if mask & (inotify.IN_IGNORED | inotify.IN_MOVE_SELF):
                    # gone, or moved away (its events would name paths it is no longer at): watch()
                    # watches whatever is at its paths after the rescan
                    del dirs[wd]
                    for d in paths:
                        self._watched.discard(f"{d}|True")
                        self._watched.discard(f"{d}|False")
                    if mask & inotify.IN_MOVE_SELF:
                        inotify.rm_watch(self._fd, wd)
                        self.scan_wanted = self._rewalk = True
                    continue
                if mask & (inotify.IN_CREATE | inotify.IN_MOVED_TO):
                    self.scan_wanted = True
                    if mask & inotify.IN_ISDIR and deep:
                        new_dirs.extend(os.path.join(d, os.fsdecode(name)) for d in paths)
                elif mask & inotify.NAMED and not mask & inotify.IN_ISDIR and name:
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


class WatchdogWatcher:
    """The portable fallback of `InotifyWatcher`: bridges watchdog (its own threads) to the event loop: an fs event sets `wake`, and notes what
    the reader should look at: `scan_wanted` (something was created or moved in: rescan the globs)
    or the path of a modified file (a closed file that grows is reopened without a full rescan).
    inotify can drop events, so the periodic rescan still decides what exists."""

    def __init__(self, loop: asyncio.AbstractEventLoop, wake: asyncio.Event) -> None:
        self._loop = loop
        self._wake = wake
        self._observer: BaseObserver | None = None
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
        """See `InotifyWatcher.poll`: watchdog's threads deliver events as they come."""

    def _poke(self) -> None:
        self._pending.clear()
        self._wake.set()

    def _on_event(self, event: FileSystemEvent) -> None:
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
        """The paths modified since the last call (and forget them), as `InotifyWatcher.take_modified`."""
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
        of the targets of `links`, as `InotifyWatcher.watch` (idempotent: call it after each rescan)."""
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

