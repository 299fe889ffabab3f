"""Opening files: waiting candidates get a slot under max_open_files (from the idle file grown least
recently when none is free; never a deleted one), are opened off the loop by the rule that fits how
they were found (tail/opening.py), and become what the open decision (tail/adopt.py) says."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable

from shipper.clock import Clock
from shipper.config import Config
from shipper.events import Events
from shipper.model import Checkpoint
from shipper.sources.file_reading import FileReader
from shipper.tail import adopt, identity, look, opening
from shipper.tail.catalog import Catalog
from shipper.tail.discovery import glob_bases
from shipper.tail.fileset import Candidate, FileSet, Parked
from shipper.tail.harvester import Harvester
from shipper.tail.opening import Refused, Rule
from shipper.tail.recovery import Recovery


class FileOpener:
    def __init__(self, cfg: Config, catalog: Catalog, files: FileSet, recovery: Recovery, reader: FileReader,
                 events: Events, clock: Clock, input_for: Callable[[str], int | None],
                 rescan_soon: Callable[[], None]) -> None:
        self.cfg = cfg
        self.catalog = catalog
        self.files = files
        self.recovery = recovery
        self.reader = reader
        self.events = events
        self.clock = clock
        self._input_for = input_for
        self._rescan_soon = rescan_soon
        self._unreadable: set[str] = set()       # paths whose permission problem was logged once
        # per input: the fixed parts of its globs, longest first (a glob's links there are the admin's)
        self._bases = [glob_bases(inp) for inp in cfg.inputs]

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
        rules = [self.rule(c) for c in batch]
        job = asyncio.ensure_future(asyncio.to_thread(look.open_batch, batch, rules, refs, tail_of))
        try:
            opened = await asyncio.shield(job)
        except asyncio.CancelledError:
            job.add_done_callback(_close_opened)     # stopping: the thread's files are not leaked
            raise
        for cand, o in zip(batch, opened, strict=True):
            if isinstance(o, Refused):
                self.events.file_refused(o.path, o.reason, o.link, o.rule)
                continue
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
            await asyncio.to_thread(_seek_all, far)

    def rule(self, c: Candidate) -> Rule:
        """How `c` may be opened: a file a glob found by its input's `symlinks`, with the links in the
        glob's fixed part followed as they are; one found by content (a rotated copy, a renamed or
        compressed incarnation, a successor) as a rotated copy of its original's owner."""
        if c.why == "glob":
            return opening.glob_rule(c.path, self._bases[c.input_idx], self.cfg.inputs[c.input_idx].symlinks)
        owner = c.cp.uid if c.cp is not None else self._owner_at(c.doc_path or c.path)
        return opening.copy_rule(c.path, owner)

    def _owner_at(self, path: str) -> int | None:
        """The owner of the file last read at `path`, if known."""
        cps = [cp for cp in self.catalog.at_path(path) if cp.uid is not None]
        return max(cps, key=lambda cp: cp.updated).uid if cps else None

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
            self._rescan_soon()
        if d.look_again_later:
            self.recovery.look_again_for(cand)
        idx = cand.input_idx
        if d.kind in ("look_again", "drop"):
            o.close()
            if d.kind == "look_again":
                self._rescan_soon()
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
            files.add(key, f)
            if d.kind == "continue":
                self.events.file_opened(cand.path, st.st_ino, cp.offset, cp.incarnation)
            return
        if d.kind == "resume":
            cp = d.cp
            assert cp is not None
            cp.finished = False          # the same file, grown again after we let it go (if it was finished)
            if cp.uid is None and d.role == "live":
                cp.uid = st.st_uid       # a checkpoint from before owners were kept
            files.add(key, rd.make(cand.path, idx, o.fd, st, cp, gz=o.gz, role=d.role))
            if d.reopened:
                self.events.file_reopened(cand.path, st.st_ino, cp.offset)
            else:
                self.events.file_opened(cand.path, st.st_ino, cp.offset, cp.incarnation)
            return
        # a new incarnation
        start = o.tail_start
        fp_len, fp = identity.fingerprint_head(o.head[:st.st_size] if o.gz is None else o.head)
        cp = Checkpoint(identity.new_incarnation(), cand.doc_path or cand.path, st.st_dev, st.st_ino, fp_len, fp,
                        start, st.st_size, self.clock.time(), uid=st.st_uid)
        rd.stage(cp, new=True)
        f = rd.make(cand.path, idx, o.fd, st, cp, gz=o.gz, role=d.role)
        if d.renamed:
            f.harvester.state = "renamed"
        files.add(key, f)
        self.events.file_opened(cand.path, st.st_ino, start, cp.incarnation)


def _close_opened(job: asyncio.Future[list[look.Opened | Refused | None]]) -> None:
    """Close what an `open_batch` nobody waits for any more opened."""
    if job.cancelled() or job.exception() is not None:
        return
    for o in job.result():
        if isinstance(o, look.Opened):
            o.close()


def _seek_all(harvesters: list[Harvester]) -> None:
    for h in harvesters:
        h.seek_compressed()
