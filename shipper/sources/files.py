"""Files as a source: globs -> the open-file set -> lines in the draft, with rotation followed by identity.

Composition of the tail rooms: discovery (globs, inotify), the catalog (incarnations and their
checkpoints), the open decision (`tail/adopt.py`), recovery (orphans, successors), the open-file
set under `max_open_files`, and `file_reading.py`. The rescan (globs + stat, off the loop) decides
what exists; inotify only hurries it. Every look that blocks runs in a thread.
"""

from __future__ import annotations

import asyncio
import fnmatch
import logging
import os
import time
from typing import Mapping

from shipper.clock import Clock
from shipper.config import Config
from shipper.events import Events
from shipper.model import Checkpoint, Draft, FileStatus
from shipper.sources.base import Drafts, Progress, Room, lowest_unshipped
from shipper.sources.file_reading import FileReader
from shipper.tail import adopt, discovery, identity, look
from shipper.tail.catalog import Catalog
from shipper.tail.files import Candidate, FileSet, Key, Parked
from shipper.tail.recovery import Recovery

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
        self._unreadable: set[str] = set()       # paths whose permission problem was logged once
        self._watcher: discovery.Watcher | None = None

    exhausted = False

    # ---------------------------------------------------------------- the seam

    async def start(self, wake: asyncio.Event) -> None:
        loop = asyncio.get_running_loop()
        self._watcher = discovery.Watcher(loop, wake)
        try:
            await asyncio.to_thread(self._watcher.watch, self.cfg.inputs)
        except Exception as e:  # watching is an optimisation; the rescan is the truth
            log.warning("file watching unavailable, relying on rescans", extra={"error": str(e)})

    async def tick(self, now: float) -> None:
        """A full rescan on schedule, or soon after inotify saw something created or moved in; else
        reopen parked files inotify says changed and open what waits; clean old checkpoints."""
        w = self._watcher
        wanted = self._rescan_soon or (w is not None and w.scan_wanted)
        # the gap grows with what a rescan costs (10,000 files: ~0.15 s), so a directory where
        # files keep appearing cannot keep a core busy globbing; a new file is found within ~1 s
        gap = min(1.0, max(RESCAN_MIN_GAP_S, 3 * self._scan_cost_s))
        if now >= self._next_scan or (wanted and now - self._last_scan >= gap):
            if w is not None:
                w.scan_wanted = False
            self._rescan_soon = False
            await self.rescan()
            self.scanned.set()
            self._next_scan = self.clock.monotonic() + self._scan_every
        else:
            if w is not None:
                self._recheck_modified(w.take_modified())
            if self.files.waiting:
                await self.open_waiting()
        if now >= self._next_clean:
            await self.clean_checkpoints()
            self._next_clean = self.clock.monotonic() + self._clean_every

    def read_round(self, room: Room, now_wall: float, now_mono: float) -> Progress:
        return self.reader.read_round(room, now_wall, now_mono)

    def flush_due(self, now_mono: float) -> None:
        self.reader.flush_due(now_mono)

    async def check(self, now_mono: float) -> None:
        await self.reader.check(now_mono)

    def next_deadline(self) -> float | None:
        return self.reader.next_deadline()

    def pause_watch(self) -> None:
        if self._watcher is not None:
            self._watcher.pause()

    def resume_watch(self) -> None:
        if self._watcher is not None:
            self._watcher.resume()

    async def stop(self) -> None:
        if self._watcher is not None:
            await asyncio.to_thread(self._watcher.stop)
            self._watcher = None
        await self.reader.read_deleted_to_end()

    def close(self) -> None:
        self.files.close_all()

    @property
    def read_total(self) -> int:
        return self.reader.read_total

    def status(self, shipped: Mapping[str, int], writing: list[Draft]) -> list[FileStatus]:
        out = []
        for f in list(self.files.open.values()):
            h = f.harvester
            cp = f.checkpoint
            size = h.size
            if not h.compressed and h.fd >= 0:
                # the size the last read saw is stale while reading is paused (backpressure, a full
                # disk): the file's own says how far behind we really are
                try:
                    size = max(size, os.fstat(h.fd).st_size)
                except OSError:
                    pass
            acked = lowest_unshipped(cp.incarnation, cp.offset, shipped, [*writing, self.reader.writer.draft])
            out.append(FileStatus(h.path, h.inode, cp.incarnation, acked, cp.offset, size, max(0, size - acked),
                                  "copy" if f.role == "copy" else h.state))
        return out

    def bytes_at_risk(self) -> int:
        """Unread bytes that no path names any more: files renamed or deleted while open, and the
        rotated copies being read for a truncated incarnation."""
        return sum(max(0, f.harvester.size - f.harvester.position) for f in list(self.files.open.values())
                   if f.role == "copy" or f.harvester.state in ("renamed", "deleted"))

    # ---------------------------------------------------------------- scanning

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

    def _scan_thread(self) -> list[tuple[str, int, os.stat_result]]:
        entries = discovery.scan_stat(self.cfg.inputs)
        if self._watcher is not None:
            try:
                self._watcher.watch(self.cfg.inputs)     # base directories that appeared since
            except Exception as e:  # watching is an optimisation; the rescan is the truth
                log.debug("file watching not extended", extra={"error": str(e)})
        return entries

    async def rescan(self) -> None:
        """Glob every input: queue new and changed files for opening, then look for the unfinished
        incarnations the globs no longer show (rotated, compressed, copied), then open what fits."""
        self._last_scan = self.clock.monotonic()
        scan_started = self.clock.time()
        t0 = time.monotonic()
        entries = await asyncio.to_thread(self._scan_thread)
        self._scan_cost_s = time.monotonic() - t0
        # open files first: a truncation noticed now gives the new content its incarnation (and
        # fingerprint) before any sibling is judged by content
        await self.check(self.clock.monotonic())
        for f in list(self.files.open.values()):
            if f.role == "live":
                f.harvester.refresh_fingerprint()    # a young file's content claimed before a copy of it is judged
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
            if p is not None and p.size == st.st_size and p.mtime_ns == st.st_mtime_ns:
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
            idx = self._input_for(path)
            if idx is not None:
                self.recovery.lost_sight_of(path, idx)
        await self.recovery.resolve_orphans(seen)
        await self.open_waiting()
        if self.recovery.dirty:
            # opening showed an inode now held by a new incarnation: find where the old one went now
            self.recovery.dirty = False
            await self.recovery.resolve_orphans(seen)
            await self.open_waiting()
        if self.recovery.wants_successors:
            await self.recovery.find_successors(seen)
            await self.open_waiting()

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

    async def _evict(self, n: int) -> int:
        """Close up to n files read to their end (least recently grown first) so that waiting files
        get a slot. A deleted file is never closed early: closing it loses its rest."""
        now = self.clock.monotonic()
        closable = []
        for _t, key, f in self.files.idle(now):
            what = f.harvester.check(now)      # a look first: a file deleted or truncated meanwhile stays open
            if what == "truncated":
                await self.reader.on_truncated(key, f)
                continue
            if what == "same" and f.harvester.state in ("active", "renamed"):
                closable.append((key, f))
        closable = [(key, f) for key, f in closable if self.files.open.get(key) is f][:n]
        for key, f in closable:
            self.reader.park(key, f, "max_open_files")
        return len(closable)

    async def open_waiting(self) -> None:
        """Open waiting files while there are slots under max_open_files (opening happens in a thread)."""
        files = self.files
        if not files.waiting:
            return
        free = files.free_slots()
        if free < len(files.waiting):
            free += await self._evict(len(files.waiting) - max(free, 0))
        free = min(free, files.free_slots())
        if free <= 0:
            return
        batch = [files.waiting.pop(key) for key in list(files.waiting)[:free]]
        refs = self._references(batch)
        tail_of = {i for i, c in enumerate(batch)
                   if c.first_scan and self.cfg.inputs[c.input_idx].start_at == "end"
                   and c.path not in self.catalog.known_paths}
        job = asyncio.ensure_future(asyncio.to_thread(look.open_batch, batch, refs, tail_of))
        try:
            opened = await asyncio.shield(job)
        except asyncio.CancelledError:
            job.add_done_callback(_close_opened)     # stopping: the thread's files are not leaked
            raise
        for cand, o in zip(batch, opened):
            if o is None:
                self.recovery.look_again_for(cand)   # a successor gone between the look and the open
                # a file we may not read is retried at every scan; say so once, not silently
                if cand.path not in self._unreadable and not os.access(cand.path, os.R_OK) and os.path.exists(cand.path):
                    self._unreadable.add(cand.path)
                    self.events.file_error(cand.path, "permission denied: not readable by this user; retried at every scan")
                continue
            self._unreadable.discard(cand.path)
            try:
                self._adopt(cand, o)
            except BaseException:
                o.close()
                raise
        # a compressed copy read from far in: decompress up to the offset in a thread, not in the
        # first read on the loop (a 1 GiB .gz takes seconds)
        far = [f.harvester for f in files.open.values() if f.harvester.needs_seek]
        if far:
            await asyncio.to_thread(lambda: [h.seek_compressed() for h in far])

    def _references(self, batch: list[Candidate]) -> list[look.Reference]:
        """For the copy check: the files we hold or parked of the rotation roots the batch's short
        unknown files belong to (fingerprinted beyond what such a file holds)."""
        roots = {identity.rotation_root(c.path) for c in batch if c.cp is None}
        roots.discard("")
        refs = []
        for key, f in self.files.open.items():
            root = identity.rotation_root(f.checkpoint.path)
            if root in roots and not f.harvester.compressed:
                refs.append(look.Reference(root, f.checkpoint.path, key, f.harvester.fd, f.checkpoint.fp_len))
        for key, p in self.files.parked.items():
            root = identity.rotation_root(p.path)
            if p.incarnation is None or root not in roots or identity.is_compressed(p.path):
                continue
            cp = self.catalog.get(p.incarnation)
            if cp is not None:
                refs.append(look.Reference(root, p.path, key, -1, cp.fp_len))
        return refs

    def _adopt(self, cand: Candidate, o: look.Opened) -> None:
        """Act on the open decision: read the file as what it is, park it, or close it again."""
        st = o.st
        key = (st.st_dev, st.st_ino)
        files = self.files
        was_parked = key in files.parked and key not in files.open and key == cand.key
        d = adopt.decide(cand, key, st.st_size, o.head, o.gz is not None, o.being_copied, catalog=self.catalog,
                         open_keys=files.open, reading=files.reading,
                         has_input=lambda p: self._input_for(p) is not None, was_parked=was_parked)
        if d.kind != "look_again":
            files.unpark(key)
        if d.look_around:
            self.recovery.lost_sight_of(cand.doc_path or cand.path, cand.input_idx)
        if d.orphans_dirty:
            self.recovery.dirty = True
            self._rescan_soon = True
        if d.look_again_later:
            self.recovery.look_again_for(cand)
        idx = cand.input_idx
        if d.kind in ("look_again", "drop"):
            o.close()
            if d.kind == "look_again":
                self._rescan_soon = True
            return
        if d.kind == "park":
            inc = d.cp.incarnation if d.cp is not None else None
            files.remember(key, Parked(st.st_size, st.st_mtime_ns, inc, cand.path, idx))
            o.close()
            return
        rd = self.reader
        if d.kind in ("continue", "read_copy"):
            cp = d.cp
            assert cp is not None
            self.recovery.forget_orphan(cp.incarnation)
            f = rd.make(cand.path, idx, o.fd, st, cp, gz=o.gz, role=d.role,
                        size_hint=st.st_size if (d.role == "copy" and o.gz is None and d.kind == "continue") else None)
            if d.renamed:
                f.harvester.state = "renamed"
            else:
                self.events.rotated_copy_opened(cp.path, cand.path, cp.incarnation, cp.offset)
            files.open[key] = f
            if d.kind == "continue":
                self.events.file_opened(cand.path, st.st_ino, cp.offset, cp.incarnation)
            return
        if d.kind == "resume":
            cp = d.cp
            assert cp is not None
            cp.finished = False          # the same file, grown again after we let it go (if it was finished)
            files.open[key] = rd.make(cand.path, idx, o.fd, st, cp, gz=o.gz, role=d.role)
            if d.reopened:
                self.events.file_reopened(cand.path, st.st_ino, cp.offset)
            else:
                self.events.file_opened(cand.path, st.st_ino, cp.offset, cp.incarnation)
            return
        # a new incarnation
        start = o.tail_start
        fp_len, fp = identity.fingerprint_head(o.head[:st.st_size] if o.gz is None else o.head)
        cp = Checkpoint(identity.new_incarnation(), cand.doc_path or cand.path, st.st_dev, st.st_ino, fp_len, fp,
                        start, st.st_size, self.clock.time())
        rd.stage(cp)
        f = rd.make(cand.path, idx, o.fd, st, cp, gz=o.gz, role=d.role)
        if d.renamed:
            f.harvester.state = "renamed"
        files.open[key] = f
        self.events.file_opened(cand.path, st.st_ino, start, cp.incarnation)

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
        gone = await asyncio.to_thread(look.gone, old)

        def pick(in_draft: set[str]) -> list[str]:
            return [cp.incarnation for cp in gone
                    if self.catalog.get(cp.incarnation) is cp and cp.finished and cp.incarnation not in in_draft]

        forgotten = await self.reader.writer.forget(pick)  # type: ignore[attr-defined]
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


def _close_opened(job: asyncio.Future[list[look.Opened | None]]) -> None:
    """Close what an `open_batch` nobody waits for any more opened."""
    if job.cancelled() or job.exception() is not None:
        return
    for o in job.result():
        if o is not None:
            o.close()
