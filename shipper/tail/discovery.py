"""Globs and excludes -> paths; a periodic rescan decides what exists, watchdog only wakes us sooner.

inotify (through watchdog) can drop events silently, so a wake-up only shortens the wait before
the next look. Never reads file contents.
"""

from __future__ import annotations

import asyncio
import fnmatch
import glob
import os
import threading
from typing import Any, Callable, Sequence

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


def scan(inputs: Sequence[InputConfig]) -> dict[str, int]:
    """Every regular file matched now: path -> index of the first input whose globs match it."""
    found: dict[str, int] = {}
    seen_real: set[str] = set()
    for idx, inp in enumerate(inputs):
        for pattern in inp.paths:
            for path in glob.iglob(os.path.expanduser(pattern), recursive=True):
                if path in found or is_excluded(path, inp.exclude):
                    continue
                try:
                    if not os.path.isfile(path):
                        continue
                    real = os.path.realpath(path)
                except OSError:
                    continue
                # a symlink and its target (or two links to one file) are followed once
                if real in seen_real:
                    continue
                seen_real.add(real)
                found[path] = idx
    return found


class Watcher:
    """Bridges watchdog (its own thread) to the event loop: every fs event sets `wake`, nothing else."""

    def __init__(self, loop: asyncio.AbstractEventLoop, wake: asyncio.Event) -> None:
        self._loop = loop
        self._wake = wake
        self._observer: Any = None
        self._pending = threading.Event()
        self._watched: set[str] = set()

    def _poke(self) -> None:
        self._pending.clear()
        self._wake.set()

    def _on_event(self, _event: object) -> None:
        # called on watchdog's thread; coalesce bursts into one wake-up per loop turn
        if not self._pending.is_set():
            self._pending.set()
            try:
                self._loop.call_soon_threadsafe(self._poke)
            except RuntimeError:
                pass  # loop closed during shutdown

    def watch(self, inputs: Sequence[InputConfig]) -> None:
        """Schedule watches on the existing base directories of every glob (idempotent)."""
        try:
            from watchdog.events import FileSystemEventHandler
            from watchdog.observers import Observer
        except ImportError:  # pragma: no cover - watchdog is a dependency
            return
        if self._observer is None:
            handler = FileSystemEventHandler()
            handler.on_any_event = self._on_event  # type: ignore[method-assign]
            self._handler = handler
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
                    self._observer.schedule(self._handler, d, recursive=deep)
                    self._watched.add(key)
                except OSError:
                    pass  # inotify limits reached: the rescan still finds everything

    def stop(self) -> None:
        if self._observer is not None:
            self._observer.stop()
            self._observer.join(timeout=5)
            self._observer = None
            self._watched.clear()


WakeFn = Callable[[], None]
