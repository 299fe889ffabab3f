"""The portable watcher: watchdog's observer (its own threads) bridged to the event loop, where
inotify cannot be had (not Linux, or the instance limit reached). Wakes the loop only; the rescan
decides what exists. tail/watch.py's `make_watcher` chooses it."""

from __future__ import annotations

import asyncio
import os
import threading
import warnings
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from shipper.config import InputConfig
from shipper.tail.discovery import LinkTarget
from shipper.tail.watchplan import MAX_PENDING_PATHS, link_watch_targets, links_by_target, translate, watch_targets

if TYPE_CHECKING:
    from watchdog.events import FileSystemEvent
    from watchdog.observers.api import BaseObserver


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
        return translate(out, link_of)

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
                self._link_of = links_by_target(links)
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

