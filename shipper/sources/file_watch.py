"""Which writes the watcher vouches for: while it names every write under the globs, a file read to
its end (quiet) is passed by until its path is named; a full look every FULL_LOOK_S, and the files
found changed but never named, catch the writes no event names. State only; files.py acts on it."""

from __future__ import annotations

import os
from collections.abc import Callable

from shipper.sources.file_reading import FileReader
from shipper.tail import watch
from shipper.tail.fileset import FileSet, Key, OpenFile

# A file read to its end and unchanged is quiet: read rounds and checks pass it by until inotify
# names its path. Every FULL_LOOK_S (each rescan is one) every open file is checked anyway (fstat),
# for writes no event names (a hard link written elsewhere: that file is then read every round).
FULL_LOOK_S = 10.0


class WatchedWrites:
    """`watcher`: the file source's (None until it starts, or where none could be had); `named`:
    paths named since the last tick, for the parked files' recheck (`recheck_due`: some are no
    open file's); `unannounced`: quiet files a full check found changed, unnamed so far."""

    def __init__(self, files: FileSet, reader: FileReader, want_rescan: Callable[[], None]) -> None:
        self.files = files
        self.reader = reader
        self._want_rescan = want_rescan
        self.watcher: watch.Watcher | None = None
        self.watching = False                    # the watcher watches the globs (its first watch worked)
        self.named: set[str] = set()
        self.recheck_due = False
        self.unannounced: dict[int, OpenFile] = {}
        self._drops = 0                          # the watcher's `dropped` when last looked at
        self._scan_drops = 0                     # the same, when the last rescan began
        self._named_lost = False                 # names dropped (too many): the next rescan stats every parked file
        self._dropped_at = float("-inf")         # monotonic: when it was seen to have grown
        self.next_full = 0.0                     # monotonic: the next full look at every open file
        self.full_check = True                   # a full check is due

    def take_recheck(self) -> set[str]:
        """The paths named since the last tick (and forget them): the parked files' recheck."""
        self.take_named()
        named, self.named = self.named, set()
        self.recheck_due = False
        return named

    def poll(self) -> None:
        """Take what the watcher queued, now, before a look that relies on it."""
        w = self.watcher
        assert w is not None
        w.poll()
        self.take_named()

    def check_is_full(self) -> tuple[bool, bool]:
        """For the open files' check: (look at every one, the watcher names every write)."""
        targeted = self.targeted()
        full = self.full_check or not targeted
        self.full_check = False
        if full and targeted:
            self.poll()                 # writes already named are no news to the full check
        return full, targeted

    def targeted(self) -> bool:
        """inotify names every write under the globs: read rounds may pass quiet files by."""
        w = self.watcher
        return w is not None and self.watching and w.names_writes and w.incomplete is None

    def take_named(self) -> list[OpenFile]:
        """The paths inotify named since the last call: an open file at one is not quiet any more
        (returned); the paths are kept for the parked files' recheck at the next tick."""
        w = self.watcher
        if w is None:
            return []
        paths = w.take_modified()
        if not paths:
            return []
        open_at = self.files.open_at
        named = []
        for path in paths:
            f = open_at(path)
            if f is not None:
                f.quiet = False
                named.append(f)
                self.unannounced.pop(id(f), None)
            else:
                self.recheck_due = True      # a parked file (or an orphan's path): the next tick's
        if len(self.named) + len(paths) > watch.MAX_PENDING_PATHS:
            self.named.clear()
            self._named_lost = True
            self._want_rescan()       # too many to recheck one by one: the rescan looks at all
        else:
            self.named.update(paths)
        return named

    def collect_unannounced(self, targeted: bool) -> None:
        """Quiet files a full check found changed: judged at the next read round."""
        found = self.reader.unannounced
        if found:
            if targeted:
                for f in found:
                    self.unannounced[id(f)] = f
            found.clear()

    def judge_unannounced(self, now: float) -> None:
        """Quiet files an earlier full check found changed: inotify queues an event in the write
        itself, so by now (a round later: a write still under way then has returned) every write
        seen then has been named once the queue is read. A file not named was written where no
        watch sees it (a hard link elsewhere, another mount): it is read every round from now on."""
        w = self.watcher
        if w is not None:
            w.poll()
            self.take_named()            # drops the files named from _unannounced
            if w.dropped != self._drops:
                self._drops, self._dropped_at = w.dropped, now
        found, self.unannounced = self.unannounced, {}
        if now - self._dropped_at < 2 * FULL_LOOK_S:
            return      # inotify lost events lately (overflow): their writes are no evidence
        for f in found.values():
            h = f.harvester
            self.files.mark_unreported((h.dev, h.inode), f)

    def full_look(self, now: float) -> bool:
        """Whether this read round reads every open file: only where inotify may not name a write.
        Else quiet files are passed by, and every FULL_LOOK_S the check looks at every open file
        (an fstat shows a write no event named; the file is then read like any other)."""
        if not self.targeted():
            return True
        if now >= self.next_full:
            self.next_full = now + FULL_LOOK_S
            self.full_check = True
        self.take_named()
        return False

    def named_for_scan(self) -> set[str] | None:
        """Every path inotify named since the last look (read now: the rescan relies on it), for
        the rescan to stat afresh; None when some may be missing (too many to keep)."""
        w = self.watcher
        if w is None:
            return None
        w.poll()
        self.take_named()
        named, self.named = self.named, set()
        self.recheck_due = False
        if self._named_lost:
            self._named_lost = False
            return None
        return named

    def known_for_scan(self, named: set[str] | None) -> tuple[dict[str, Key], set[str]]:
        """The files whose last lstat the rescan may reuse where their directory is unchanged, and
        those of them it must stat afresh all the same. Reused: the open ones (their fd tells size
        and times), and the parked ones inotify did not name since the last look, while it names
        every write. Stat'ed afresh: a parked file named, or once written where no event named it
        (`FileSet.unreported`); every parked file after lost events or names; all of them at the
        Scanner's scans that reuse nothing (one in FULL_EVERY), which catch a write no event named
        (a hard link elsewhere, mmap, another host on NFS) within a minute at the default
        scan_interval. Where inotify may not name a write, parked files are not known at all."""
        known = self.files.open_paths()
        fresh: set[str] = set()
        w = self.watcher
        drops = w.dropped if w is not None else 0
        if self.targeted():
            parked = self.files.parked_paths()
            trusted = named is not None and drops == self._scan_drops
            unreported = self.files.unreported
            for path, key in parked.items():
                if path not in known:
                    known[path] = key
                    if not trusted or key in unreported:
                        fresh.add(path)
            if trusted and named:
                fresh.update(p for p in (os.path.normpath(n) for n in named) if p in parked)
        self._scan_drops = drops
        return known, fresh
