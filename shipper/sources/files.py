"""Files as a source: globs -> the open-file set -> lines in the draft, rotation followed by identity.
Composes the tail rooms (discovery, catalog, adopt, recovery, the file set) with file_opening.py,
file_reading.py and file_watch.py; the rescan (globs and stats, off the loop) decides what exists,
the watcher only hurries it. Every look that blocks runs in a thread."""

from __future__ import annotations

import asyncio
import fnmatch
import logging
import os
from collections.abc import Mapping

from shipper.clock import Clock
from shipper.config import Config
from shipper.events import Events
from shipper.model import Checkpoint, Draft, FileStatus
from shipper.sources.base import Drafts, Progress, Room, lowest_unshipped
from shipper.sources.file_opening import FileOpener
from shipper.sources.file_reading import FileReader
from shipper.sources.file_watch import FULL_LOOK_S, WatchedWrites
from shipper.tail import discovery, identity, look, opening, watch
from shipper.tail.catalog import Catalog
from shipper.tail.fileset import Candidate, FileSet, Key
from shipper.tail.opening import Refused
from shipper.tail.recovery import Recovery
from shipper.tail.scan import Scanner

log = logging.getLogger("shipper.tail")

RESCAN_MIN_GAP_S = 0.2        # inotify-triggered rescans (something was created or moved in) at most this often


class FileSource:
    def __init__(self, cfg: Config, checkpoints: tuple[Checkpoint, ...] | list[Checkpoint], writer: Drafts,
                 events: Events, clock: Clock, host_name: str) -> None:
        self.cfg = cfg
        self.events = events
        self.clock = clock
        self.catalog = Catalog(checkpoints)
        self.files = FileSet(cfg.max_open_files, events)
        self.recovery = Recovery(self.catalog, self.files, events, self._finish_cp, self._input_for)
        self.reader = FileReader(cfg, self.catalog, self.files, self.recovery, writer, events, clock, host_name,
                                 self._want_rescan)
        self.opener = FileOpener(cfg, self.catalog, self.files, self.recovery, self.reader, events, clock,
                                 self._input_for, self._want_rescan)
        self.scanned = asyncio.Event()           # set after the first rescan: every matched file is open
        self.first_scan_done = False
        self._path_input: dict[str, int] = {}
        self._rescan_soon = False
        self._last_scan = float("-inf")
        self._next_scan = 0.0
        self._scan_cost_s = 0.0
        self._scan_every = min((i.scan_interval_s for i in cfg.inputs), default=10.0)
        self._clean_every = min(300.0, max(0.5, cfg.clean_removed_after_s / 2))
        self._next_clean = clock.monotonic() + self._clean_every
        self.writes = WatchedWrites(self.files, self.reader, self._want_rescan)   # what the watcher vouches for
        self._link_roots: dict[str, str] = {}    # the last rescan's symlinks (Catalog.note_links)
        self._warned_incomplete = False
        self._scanner = Scanner()                # the rescans' listings of unchanged directories

    exhausted = False

    @property
    def watching(self) -> bool:
        """inotify (or watchdog) wakes the reader on every write: the fallback poll may back off."""
        return self.writes.watcher is not None and self.writes.watching

    # ---------------------------------------------------------------- the seam

    async def start(self, wake: asyncio.Event) -> None:
        loop = asyncio.get_running_loop()
        w = self.writes.watcher = watch.make_watcher(loop, wake)
        try:
            await asyncio.to_thread(w.watch, self.cfg.inputs)
            self.writes.watching = True
        except Exception as e:  # watching is an optimisation; the rescan is the truth
            log.warning("file watching unavailable, relying on rescans", extra={"error": str(e)})

    async def tick(self, now: float) -> None:
        """A full rescan on schedule, or soon after inotify saw something created or moved in; else
        reopen parked files inotify says changed and open what waits; clean old checkpoints."""
        w = self.writes.watcher
        wanted = self._rescan_soon or (w is not None and w.scan_wanted)
        if now >= self._next_scan or (wanted and now >= self._last_scan + self._rescan_gap()):
            if w is not None:
                w.scan_wanted = False
            self._rescan_soon = False
            await self.rescan()
            self.scanned.set()
            self._next_scan = self.clock.monotonic() + self._scan_every
        else:
            if w is not None:
                self._recheck_modified(self.writes.take_recheck())
            if self.files.waiting:
                await self.opener.open_waiting()
        if now >= self._next_clean:
            await self.clean_checkpoints()
            self._next_clean = self.clock.monotonic() + self._clean_every

    def read_round(self, room: Room, now_wall: float, now_mono: float) -> Progress:
        full = self.writes.full_look(now_mono)
        if self.writes.unannounced:
            self.writes.judge_unannounced(now_mono)
        return self.reader.read_round(room, now_wall, now_mono, full)

    def flush_due(self, now_mono: float) -> None:
        self.reader.flush_due(now_mono)

    async def check(self, now_mono: float) -> None:
        full, targeted = self.writes.check_is_full()
        await self.reader.check(now_mono, full)
        self.writes.collect_unannounced(targeted)

    def _rescan_gap(self) -> float:
        # the gap grows with what a rescan costs (docs/development.md), so a directory where files
        # keep appearing cannot keep a core busy globbing; a new file is still found within a second
        return min(1.0, max(RESCAN_MIN_GAP_S, 3 * self._scan_cost_s))

    def next_deadline(self) -> float | None:
        """The next moment a tick has work to do without any event: a held multiline event's
        timeout, the recheck of parked files named since the last tick (now), or the rescan
        inotify asked for once the gap since the last one has passed (an idle wait must end
        then: nothing else would wake it before the next poll tick)."""
        dl = self.reader.next_deadline()
        if self.writes.recheck_due:
            # a path inotify named after this round's tick that is no open file's (a write to a
            # parked file during a rescan, taken by a later look): its recheck is the next
            # tick's, due now, since the wake-up the write caused is spent
            return self.clock.monotonic()
        w = self.writes.watcher
        if self._rescan_soon or (w is not None and w.scan_wanted):
            due = self._last_scan + self._rescan_gap()
            dl = due if dl is None else min(dl, due)
        return dl

    def pause_watch(self) -> None:
        if self.writes.watcher is not None:
            self.writes.watcher.pause()

    def resume_watch(self) -> None:
        if self.writes.watcher is not None:
            self.writes.watcher.resume()

    def drain_watch(self) -> None:
        if self.writes.watcher is not None:
            self.writes.watcher.drain()

    async def stop(self) -> None:
        if self.writes.watcher is not None:
            await asyncio.to_thread(self.writes.watcher.stop)
            self.writes.watcher = None
        await self.reader.read_deleted_to_end()

    def close(self) -> None:
        self.files.close_all()

    @property
    def read_total(self) -> int:
        return self.reader.read_total

    def status(self, shipped: Mapping[str, int], writing: list[Draft]) -> list[FileStatus]:
        out = []
        drafts = [*writing, self.reader.writer.draft]
        targeted = self.writes.targeted()
        if targeted:
            self.writes.poll()       # a file written since is not quiet: its size is looked at
        for f in list(self.files.open.values()):
            h = f.harvester
            cp = f.checkpoint
            size = h.size
            if not h.compressed and h.fd >= 0 and not (targeted and f.quiet):
                # the size the last read saw is stale while reading is paused (backpressure, a full
                # disk): the file's own says how far behind we really are
                try:
                    size = max(size, os.fstat(h.fd).st_size)
                except OSError:
                    pass
            # a hole up to the end (a file extended ahead of its writer) is no lag: nothing to read there
            end = size if h.hole_at is None else h.data_end
            acked = lowest_unshipped(cp.incarnation, cp.offset, shipped, drafts)
            out.append(FileStatus(h.path, h.inode, cp.incarnation, acked, cp.offset, size, max(0, end - acked),
                                  "copy" if f.role == "copy" else h.state))
        return out

    def journal_status(self, shipped: Mapping[str, int], writing: list[Draft]) -> None:
        return None

    def steady_key(self) -> tuple[int, int] | None:
        """While every open file is quiet (inotify names any write): what moves whenever one of
        `status`'s rows may change (opens and closes, checkpoint moves), so the status tick may
        keep the last rows while it stays the same; None when rows must be made afresh."""
        if not self.writes.targeted():
            return None
        self.writes.poll()
        if self.files.awake:
            return None
        return self.files.changes, self.reader.moves

    def bytes_at_risk(self) -> int:
        """Unread bytes that no path names any more: files renamed or deleted while open, and the
        rotated copies being read for a truncated incarnation."""
        return sum(max(0, f.harvester.data_end - f.harvester.position) for f in list(self.files.open.values())
                   if f.role == "copy" or f.harvester.state in ("renamed", "deleted"))

    # ---------------------------------------------------------------- scanning

    @property
    def wants_rescan(self) -> bool:
        """Something seen since the last rescan asks for another one soon (a rotation, a new inode)."""
        return self._rescan_soon

    def _want_rescan(self) -> None:
        self._rescan_soon = True

    def _finish_cp(self, cp: Checkpoint) -> None:
        self.reader.finish_cp(cp)

    def _input_for(self, path: str) -> int | None:
        """The input whose globs match `path` (checkpoints do not record it); None if none does now."""
        idx = self._path_input.get(path)
        if idx is not None:
            return idx
        for i, inp in enumerate(self.cfg.inputs):
            if any(fnmatch.fnmatch(path, os.path.expanduser(p)) for p in inp.paths) and \
                    not discovery.is_excluded(path, inp.exclude):
                self._path_input[path] = i
                return i
        return None

    def _scan_thread(self, known: dict[str, Key], fresh: set[str]) -> tuple[list[tuple[str, int, os.stat_result]], set[str],
                                                                         dict[str, Key], list[Refused]]:
        """The rescan's blocking part: (entries, the paths whose entry is the last scan's stat of a
        file open there, path -> (dev, inode) of every entry, the matches not to be read)."""
        link_paths: set[str] = set()
        reused: set[str] = set()
        refused: list[Refused] = []
        opening.refresh_mounts()          # what lies on /proc, /sys, /dev: a mount may have come since
        # the directories made since the last rescan watched first: one made meanwhile is then either
        # listed below or reported
        self._extend_watch(None)
        entries = discovery.scan_stat(self.cfg.inputs, link_paths, scanner=self._scanner, known=known,
                                      reused=reused, fresh=fresh, refused=refused)
        at = {path: (st.st_dev, st.st_ino) for path, _idx, st in entries}
        # symlinks: rotated copies lie beside their targets; their directories are watched
        links = discovery.resolve_links(link_paths)
        self._link_roots = {identity.rotation_root(lt.target): lt.path for lt in links.values()}
        self._extend_watch(links)         # and the directories of symlinks' targets
        return entries, reused, at, refused

    def _extend_watch(self, links: dict[str, discovery.LinkTarget] | None) -> None:
        if self.writes.watcher is not None:
            try:
                self.writes.watcher.watch(self.cfg.inputs, links)
            except Exception as e:  # watching is an optimisation; the rescan is the truth
                log.debug("file watching not extended", extra={"error": str(e)})

    async def rescan(self) -> None:
        """Glob every input: queue new and changed files for opening, then look for the unfinished
        incarnations the globs no longer show (rotated, compressed, copied), then open what fits."""
        self._last_scan = self.clock.monotonic()
        scan_started = self.clock.time()
        t0 = self.clock.monotonic()
        known, fresh = self.writes.known_for_scan(self.writes.named_for_scan())
        entries, reused, at, refused = await asyncio.to_thread(self._scan_thread, known, fresh)
        self._scan_cost_s = self.clock.monotonic() - t0
        for r in refused:
            self.events.file_refused(r.path, r.reason, r.link, r.rule)
        watcher = self.writes.watcher
        if watcher is not None and watcher.incomplete is not None and not self._warned_incomplete:
            self._warned_incomplete = True
            log.warning("a directory could not be watched; every read round reads every open file",
                        extra={"error": watcher.incomplete})
        if self._link_roots:
            self.catalog.note_links(self._link_roots)
        # open files first: a truncation noticed now gives the new content its incarnation (and
        # fingerprint) before any sibling is judged by content
        await self.reader.check(self.clock.monotonic(), at=at)
        self.writes.collect_unannounced(self.writes.targeted())
        # a full look of its own: the next scheduled one counts from here (scan_interval at its
        # default, 10 s, is FULL_LOOK_S: no look but the rescan's)
        self.writes.next_full = self.clock.monotonic() + FULL_LOOK_S
        for f in list(self.files.open.values()):
            if f.role == "live":
                self.reader.grow_fingerprint(f)    # a young file's content claimed before a copy of it is judged
        first = not self.first_scan_done
        files = self.files
        seen: dict[Key, str] = {}
        for path, idx, st in entries:
            key = (st.st_dev, st.st_ino)
            seen[key] = path
            self._path_input[path] = idx
            if key in files.open:
                continue
            w = files.waiting.get(key)
            if w is not None:
                if w.why == "glob":
                    w.path, w.input_idx = path, idx    # rotated names shift: open it where it is now
                continue
            p = files.parked.get(key)
            # reused: open when the scan began and parked since by the check above (its size is that
            # check's), or parked and not named by inotify since (_known_for_scan); else a changed
            # size or mtime reopens it
            if p is not None and (path in reused or (p.size == st.st_size and p.mtime_ns == st.st_mtime_ns)):
                continue
            files.waiting[key] = Candidate(path, idx, key, "glob", first_scan=first)
        for key in [k for k in files.parked if k not in seen]:
            files.unpark(key)
        if len(self._path_input) > 4 * len(seen) + 1024:
            self._path_input = {path: self._path_input[path] for path in seen.values() if path in self._path_input}
        self.first_scan_done = True
        # after a downtime anything may have been rotated away unseen at any path we knew; later, a
        # known path with no file now (nocreate, or deleted): look once among its siblings
        for path in self.recovery.after_scan(scan_started, set(seen.values()), first):
            found = self._input_for(path)
            if found is not None:
                self.recovery.lost_sight_of(path, found)
        await self.recovery.resolve_orphans(seen)
        await self.opener.open_waiting()
        if self.recovery.dirty:
            # opening showed an inode now held by a new incarnation: find where the old one went now
            self.recovery.dirty = False
            await self.recovery.resolve_orphans(seen)
            await self.opener.open_waiting()
        if self.recovery.wants_successors:
            await self.recovery.find_successors(seen)
            await self.opener.open_waiting()

    async def open_waiting(self) -> None:
        await self.opener.open_waiting()

    def _recheck_modified(self, paths: set[str]) -> None:
        """inotify said these paths were written: reopen parked files that changed."""
        files = self.files
        for path in paths:
            key = files.parked_at(path)
            if key is not None:
                p = files.parked[key]
                try:
                    st = os.stat(path)
                except OSError:
                    continue
                if (st.st_dev, st.st_ino) == key and (st.st_size != p.size or st.st_mtime_ns != p.mtime_ns):
                    files.unpark(key)
                    files.waiting.setdefault(key, Candidate(path, p.input_idx, key, "glob"))
                continue
            if self.recovery.changed(path):
                self._rescan_soon = True

    async def clean_checkpoints(self) -> int:
        """Forget checkpoints of files that are gone and fully shipped, `clean_removed_after` after
        they finished, so the store does not grow without bound. A finished incarnation whose
        content still lies beside its path (a rotated copy, a .gz) is kept: forgetting it would
        let a glob that matches the copy ship it again. Returns how many were forgotten."""
        grace = self.cfg.clean_removed_after_s
        now_wall = self.clock.time()
        open_incs = self.files.incarnations_open()
        old = [cp for cp in self.catalog
               if cp.finished and now_wall - cp.updated >= grace and cp.incarnation not in open_incs]
        if not old:
            return 0
        gone = await asyncio.to_thread(look.content_nowhere, old)

        def pick(in_draft: set[str]) -> list[str]:
            return [cp.incarnation for cp in gone
                    if self.catalog.get(cp.incarnation) is cp and cp.finished and cp.incarnation not in in_draft]

        forgotten = await self.reader.writer.forget(pick)
        for inc in forgotten:
            cp = self.catalog.unindex(inc)
            if cp is not None:
                self.recovery.forgotten(cp)
        if forgotten:
            self.events.checkpoints_forgotten(len(forgotten), len(self.catalog))
        return len(forgotten)

    def index_written(self, cps: list[Checkpoint]) -> None:
        """The writer stored these checkpoint copies: the catalog keeps whichever is newer."""
        for cp in cps:
            self.catalog.index(cp)
