"""Rotation recovery: orphans (unfinished incarnations no glob shows: their content looked for among
the path's rotated siblings) and successors (files created and rotated away while we did not look).
The looks run off the loop (look.py); this keeps their state."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from shipper.events import Events
from shipper.model import Checkpoint
from shipper.tail import identity, look
from shipper.tail.catalog import Catalog
from shipper.tail.fileset import Candidate, FileSet, Key

MTIME_SLACK_S = 0.05          # file mtimes come from a coarser clock than time.time()


class Recovery:
    def __init__(self, catalog: Catalog, files: FileSet, events: Events,
                 finish: Callable[[Checkpoint], None], input_for: Callable[[str], int | None]) -> None:
        self.catalog = catalog
        self.files = files
        self.events = events
        self._finish = finish
        self._input_for = input_for
        self._orphan_seen: dict[str, tuple[str, int, int, int]] = {}   # inc -> where it was last found, unchanged
        self._orphan_paths: dict[str, str] = {}
        self._successor_paths: dict[str, tuple[float, int]] = {}
        # the paths the last rescan saw a file at, and its wall time; the same for the rescan before
        self._seen: tuple[float, set[str]] = (0.0, set())
        self._seen_prev: tuple[float, set[str]] = (0.0, set())
        self.vanished: set[str] = set()             # known paths found empty (looked around once)
        self.dirty = False                          # an inode now held by a new incarnation: look again

    # ---------------------------------------------------------------- orphans

    def remember_orphan(self, inc: str, path: str, inode: int, size: int, mtime_ns: int) -> None:
        """It lies at `path` unchanged: not looked for again until that file changes."""
        self._orphan_seen[inc] = (path, inode, size, mtime_ns)
        self._orphan_paths[path] = inc

    def forget_orphan(self, inc: str) -> None:
        seen = self._orphan_seen.pop(inc, None)
        if seen is not None and self._orphan_paths.get(seen[0]) == inc:
            del self._orphan_paths[seen[0]]

    def changed(self, path: str) -> bool:
        """inotify says `path` was written: if an orphan was remembered there, look for it again."""
        inc = self._orphan_paths.get(path)
        if inc is None:
            return False
        self.forget_orphan(inc)
        return True

    def forgotten(self, cp: Checkpoint) -> None:
        """Its checkpoint is gone from the store."""
        if self.catalog.holds_path(cp.path, cp.incarnation) or not self.catalog.at_path(cp.path):
            self.vanished.discard(cp.path)
        self.forget_orphan(cp.incarnation)

    async def resolve_orphans(self, seen: dict[Key, str]) -> None:
        """Find the unfinished incarnations that no source reads and no glob shows, and queue the
        sibling that holds their rest; also the siblings written at their path while we did not
        look. An incarnation found nowhere is finished (and its unread bytes reported)."""
        files = self.files
        open_incs = files.incarnations_open()
        holders: dict[Key, str | None] = {k: p.incarnation for k, p in files.parked.items()}
        for k, f in files.open.items():
            holders[k] = f.checkpoint.incarnation
        todo: list[Checkpoint] = []
        for cp in self.catalog:
            if cp.finished or cp.incarnation in open_incs:
                continue
            key = (cp.dev, cp.inode)
            if key in files.waiting:
                continue           # identified when it is opened
            if key in seen and holders.get(key) == cp.incarnation:
                continue           # parked where the globs see it
            todo.append(cp)
        if not todo:
            return
        results = await asyncio.to_thread(look.locate, todo, dict(self._orphan_seen))
        for res in results:
            if res is None:
                continue
            cp, found, sibs = res
            if cp.finished or self.catalog.get(cp.incarnation) is not cp:
                continue
            idx = self._input_for(cp.path)
            if idx is None:
                self.events.file_closed(cp.path, cp.inode, cp.offset, "no input matches it any more")
                self._finish(cp)
                continue
            if found is None and any(s.in_progress for s in sibs):
                continue        # a .gz still being written may hold its rest: looked for at the next rescan
            if found is None:
                lost = max(0, cp.size - cp.offset)
                if lost:
                    self.events.bytes_lost(cp.path, cp.inode, lost, "file gone before it was read to its end")
                self.events.file_closed(cp.path, cp.inode, cp.offset, "gone")
                self._finish(cp)
            else:
                kind, sib = found
                key = (sib.dev, sib.inode)
                if key in files.open or key in files.waiting:
                    pass
                elif kind == "renamed" and sib.size <= cp.offset:
                    self.remember_orphan(cp.incarnation, sib.path, sib.inode, sib.size, sib.mtime_ns)
                elif kind == "copy" and sib.size <= cp.offset:
                    self._finish(cp)          # the copy holds nothing we have not read
                else:
                    files.waiting[key] = Candidate(sib.path, idx, key, kind, cp=cp)
            self._queue_successors(cp.path, cp.updated, idx, sibs, seen)

    # ---------------------------------------------------------------- successors

    def lost_sight_of(self, path: str, idx: int) -> None:
        """A new incarnation appears at a path we knew: whatever was created there and rotated away
        since we last looked may have been seen by no one. Look among the rotated siblings for
        files changed since then that no checkpoint knows (after the rescan, off the loop)."""
        prev = self.catalog.at_path(path)
        if not prev:
            return
        at, paths = self._seen_prev
        since = at if path in paths else max(c.updated for c in prev)
        old = self._successor_paths.get(path)
        self._successor_paths[path] = (since if old is None else min(since, old[0]), idx)

    def look_again_for(self, cand: Candidate) -> None:
        """A successor not taken now: the next rescan looks among that path's rotated siblings again."""
        if cand.why == "successor" and cand.doc_path is not None:
            self._successor_paths.setdefault(cand.doc_path, (cand.since, cand.input_idx))

    @property
    def wants_successors(self) -> bool:
        return bool(self._successor_paths)

    async def find_successors(self, seen: dict[Key, str]) -> None:
        """For each path that got a new incarnation after we had lost sight of it, queue the
        rotated siblings written in between."""
        todo, self._successor_paths = self._successor_paths, {}
        listed = await asyncio.to_thread(look.list_siblings, {p: v[0] for p, v in todo.items()}, MTIME_SLACK_S)
        for path, sibs in listed.items():
            since, idx = todo[path]
            self._queue_successors(path, since, idx, sibs, seen)

    def _queue_successors(self, path: str, since: float, idx: int, sibs: list[identity.Sibling],
                          seen: dict[Key, str]) -> None:
        files = self.files
        for sib in sibs:
            key = (sib.dev, sib.inode)
            if sib.mtime <= since - MTIME_SLACK_S or key in seen or key in files.open or key in files.waiting:
                continue
            if sib.in_progress:
                # gzip is still writing it: its first bytes, which tell a known incarnation's copy
                # from a file no one saw, are not there yet; looked at again after the next rescan
                self._successor_paths.setdefault(path, (since, idx))
                continue
            if self.catalog.lookup(key, sib.head, None if sib.compressed else sib.size) is not None or \
                    self.catalog.copy_of(sib.path, sib.head, key) is not None:
                continue
            files.waiting[key] = Candidate(sib.path, idx, key, "successor", doc_path=path, since=since)

    # ---------------------------------------------------------------- after a rescan

    def after_scan(self, scan_started: float, seen_paths: set[str], first: bool) -> list[str]:
        """Record which known paths the rescan saw; return the known paths to look around once:
        all of them after a downtime (first scan), else those found empty for the first time.

        Set operations, not a loop over the known paths: with a thousand files parked this ran
        after every rescan and was a third of an idle daemon's Python time."""
        self._seen_prev, self._seen = self._seen, (scan_started, seen_paths)
        known = self.catalog.path_set()
        newly = known - seen_paths
        if self.vanished:
            newly -= self.vanished
            self.vanished -= seen_paths
        self.vanished |= newly
        return list(known) if first else list(newly)
