"""Globs and excludes -> paths; a periodic rescan decides what exists, watchdog only wakes us sooner.

inotify (through watchdog) can drop events silently, so a wake-up only shortens the wait before
the next look. Never reads file contents.
"""

from __future__ import annotations

import asyncio
import fnmatch
import glob
import os
import stat as stat_mod
import threading
import warnings
from typing import Any, Sequence

from shipper.config import InputConfig

_GLOB_CHARS = set("*?[")


def base_dir(pattern: str) -> tuple[str, bool]:
    """The directory prefix of a glob without glob characters, and whether files lie deeper."""
    parts = pattern.split(os.sep)
    fixed: list[str] = []
    for i, part in enumerate(parts[:-1]):
        if _GLOB_CHARS & set(part):
            return os.sep.join(fixed) or os.sep, True
        fixed.append(part)
    return os.sep.join(fixed) or os.sep, False


def is_excluded(path: str, excludes: Sequence[str]) -> bool:
    name = os.path.basename(path)
    for ex in excludes:
        if fnmatch.fnmatch(path, ex) or ("/" not in ex and fnmatch.fnmatch(name, ex)):
            return True
    return False


def scan_stat(inputs: Sequence[InputConfig]) -> list[tuple[str, int, os.stat_result]]:
    """Every regular file matched now, with its stat: (path, index of the first input whose globs
    match it, stat). A symlink and its target, or two links to one file, are followed once: the
    identity is (dev, inode), so no realpath walk is needed."""
    out: list[tuple[str, int, os.stat_result]] = []
    paths: set[str] = set()
    seen: set[tuple[int, int]] = set()
    for idx, inp in enumerate(inputs):
        for pattern in inp.paths:
            for path in glob.iglob(os.path.expanduser(pattern), recursive=True):
                if path in paths or is_excluded(path, inp.exclude):
                    continue
                try:
                    st = os.stat(path)
                except OSError:
                    continue
                if not stat_mod.S_ISREG(st.st_mode):
                    continue
                key = (st.st_dev, st.st_ino)
                if key in seen:
                    continue
                seen.add(key)
                paths.add(path)
                out.append((path, idx, st))
    return out


def scan(inputs: Sequence[InputConfig]) -> dict[str, int]:
    """Every regular file matched now: path -> index of the first input whose globs match it."""
    return {path: idx for path, idx, _st in scan_stat(inputs)}


MAX_PENDING_PATHS = 4096


class Watcher:
    """Bridges watchdog (its own thread) to the event loop: an fs event sets `wake`, and notes what
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
        self.scan_wanted = False

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
        """The paths modified since the last call (and forget them)."""
        with self._lock:
            out, self._modified = self._modified, set()
        return out

    def watch(self, inputs: Sequence[InputConfig]) -> None:
        """Schedule watches on the existing base directories of every glob (idempotent: call it
        after each rescan, so a base directory that appears later gets its own watch)."""
        # watchdog's inotify thread warns when a directory created under a recursive watch is
        # registered twice (a benign race it resolves itself); as an error it would kill that thread
        warnings.filterwarnings("ignore", message="Callback with id", category=RuntimeWarning)
        try:
            from watchdog.events import (DirCreatedEvent, DirMovedEvent, FileCreatedEvent,
                                         FileModifiedEvent, FileMovedEvent, FileSystemEventHandler)
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
        for inp in inputs:
            for pattern in inp.paths:
                d, deep = base_dir(os.path.expanduser(pattern))
                while not os.path.isdir(d) and d != os.sep:
                    d, deep = os.path.dirname(d), True
                key = f"{d}|{deep}"
                if key in self._watched or d == os.sep:
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

