"""Reading open files into the draft: lines fed through the file's holder (multiline, the container
joiner) and built by the input's DocBuilder, with the checkpoint move they make; and what happens
to an open file: rotation, truncation (the unread range read from logrotate's copy), deletion, its end."""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import os
from collections.abc import Callable, Mapping

from shipper.clock import Clock
from shipper.config import Config
from shipper.events import Events
from shipper.model import Checkpoint, Line, SplitBuild
from shipper.parse.container import ContainerEvent, is_container_record, physical_max_line_bytes
from shipper.parse.container_join import ContainerJoiner, holder_for, joiner_for
from shipper.parse.document import DocBuilder
from shipper.sources.base import Drafts, DropCounter, Progress, Room, input_label, record_cuts
from shipper.tail import identity, look
from shipper.tail.catalog import Catalog
from shipper.tail.fileset import FileSet, Holder, Key, OpenFile, Parked, disk_stat
from shipper.tail.harvester import CHUNK_BYTES, GzipReader, Harvester
from shipper.tail.lines import Built
from shipper.tail.recovery import Recovery

DELETED_GRACE_S = 1.0         # a deleted file, read to its end, is closed this long after its last growth
READ_BYTES = 256 * 1024       # per file and read round: 4 x 1 MiB copies cost RSS and page faults
ROOM_FILL = 0.9               # a read round aims at this share of the lines the draft still has room for


def _container_edge(first: bytes, last: bytes) -> bool:
    """Format auto's sniff (`FileReader._sniff`) on a chunk's first and last line."""
    return is_container_record(first) or is_container_record(last)


class FileReader:
    """Container logs (format docker/cri; format auto once a file shows a Docker or CRI record): a
    `ContainerJoiner` per open file joins the partial records per stream (and runs multiline per
    stream after it); the checkpoint never passes its `pending_start`, so a record hanging at
    the end of a file, or at a kill -9, is re-read whole. The splitter's cap lets a physical
    line through (`physical_max_line_bytes`); the joined record is cut at max_line_bytes."""

    def __init__(self, cfg: Config, catalog: Catalog, files: FileSet, recovery: Recovery, writer: Drafts,
                 events: Events, clock: Clock, host_name: str, rescan_soon: Callable[[], None]) -> None:
        self.cfg = cfg
        self.catalog = catalog
        self.files = files
        self.recovery = recovery
        self.writer = writer
        self.events = events
        self.clock = clock
        self.builders = [DocBuilder(inp, cfg.output.index, host_name) for inp in cfg.inputs]
        self.drops = {i: DropCounter(b, input_label(inp), events)      # file inputs' (journald's: its source's)
                      for i, (inp, b) in enumerate(zip(cfg.inputs, self.builders, strict=True)) if inp.journald is None}
        # inputs whose files the C loop reads and builds at once (no multiline; the C path built)
        self._fusable = [inp.multiline is None and b.fusable for inp, b in zip(cfg.inputs, self.builders, strict=True)]
        self._rescan_soon = rescan_soon
        self._copy_failures: dict[str, int] = {}
        self.read_total = 0
        self.moves = 0                          # bumped at every checkpoint move (a status row changes)
        self.unannounced: list[OpenFile] = []   # quiet files a full check found changed (FileSource judges)

    def holder(self, idx: int) -> Holder | None:
        return holder_for(self.cfg.inputs[idx])

    def _sniff(self, f: OpenFile, lines: list[Line]) -> ContainerJoiner | None:
        """Format auto without multiline: a file whose batch begins or ends with a Docker or CRI
        record is a container log from then on (a joiner of format auto: per line, plain lines
        stay plain). Two lines looked at per batch, so plain files pay nothing per line."""
        inp = self.cfg.inputs[f.input_idx]
        if inp.format != "auto" or inp.multiline is not None or not lines:
            return None
        if not (is_container_record(lines[0][2]) or is_container_record(lines[-1][2])):
            return None
        j = joiner_for(inp)
        f.holder = j
        return j

    def make(self, path: str, idx: int, fd: int, st: object, cp: Checkpoint, *, start: int | None = None,
             gz: GzipReader | None = None, size_hint: int | None = None, role: str = "live") -> OpenFile:
        inp = self.cfg.inputs[idx]
        cap = physical_max_line_bytes(inp.format, inp.max_line_bytes) if inp.format in ("docker", "cri") \
            else inp.max_line_bytes
        h = Harvester(path, fd, st, cp, cap, self.clock.monotonic(),  # type: ignore[arg-type]
                      start_offset=start, gz=gz, size_hint=size_hint)
        at = cp.offset if start is None else start
        holder = holder_for(inp, [c for c in cp.cuts if c > at])
        return OpenFile(h, idx, holder, "copy" if role == "copy" else "live")

    # ---------------------------------------------------------------- reading

    def read_round(self, room: Room, now_wall: float, now_mono: float, full: bool = True) -> Progress:
        """One pass over the open files, bounded by the draft's room: every one when `full`, else
        those not quiet (a quiet file was read to its end and inotify has not named it since)."""
        progressed = False
        backlog = False
        draft = self.writer.draft
        # not `full`: the files not quiet are FileSet.awake's (an idle daemon's round is O(1))
        for f in list((self.files.open if full else self.files.awake).values()):
            h = f.harvester
            if h.fd < 0:
                continue
            budget = min(READ_BYTES, max(64 * 1024, room.max_bytes - draft.nbytes))
            # about the lines the draft has room for: a round that overshoots bulk_max_events
            # makes the grouping cut a small extra body (2000 + 250 docs: two requests, not one)
            if f.line_bytes:
                left = room.max_events - draft.events
                budget = min(budget, max(4096, int(left * f.line_bytes * ROOM_FILL)))
            else:
                budget = min(budget, 64 * 1024)     # line length not known yet: a first look
            sp = h.splitter
            if sp.skipping or sp.pending_bytes >= budget:
                # inside a line longer than a read: read on in growing steps (what the carry holds
                # is copied once more per read), up to a whole CHUNK_BYTES
                budget = max(budget, min(CHUNK_BYTES, max(READ_BYTES, sp.pending_bytes)))
            before = h.position
            if f.holder is not None or not self._fusable[f.input_idx]:
                lines, built, built_docs = h.read(budget), None, 0
            else:
                # the C loop builds the lines as it splits them, into the draft (issue 14)
                was_empty = draft.empty()
                lines, built = h.read_built(budget, functools.partial(self._split_builder, f, now_wall))
                built_docs = built.pairs
                if was_empty and built_docs:
                    draft.started = now_mono
            nlines = len(lines) + (built.lines if built is not None else 0)
            moved = h.position != before
            if f.quiet and (nlines or moved):
                f.quiet = False      # a full round (no inotify to trust): the next check decides
            if not nlines and h.splitter.offset == f.checkpoint.offset:
                if moved:
                    # the read ended inside a line (or skipped on through an over-long one): the
                    # rest is read in the next round, at once; no event will name bytes already
                    # written, so the file must not wait as one read to its end (issue 41)
                    progressed = True
                    backlog = backlog or not h.at_eof
                    h.last_growth = now_mono
                continue
            if nlines:
                first = built.first if built is not None and built.lines else lines[0][0]
                last = lines[-1][1] if lines else built.last if built is not None else 0
                f.line_bytes = (last - first) / nlines
            progressed = progressed or bool(nlines) or not h.at_eof
            backlog = backlog or not h.at_eof
            h.last_growth = now_mono if nlines else h.last_growth
            self.take(f, lines, now_wall, now_mono, built=built, built_docs=built_docs)
            if draft.events >= room.full_events or draft.nbytes >= room.max_bytes:
                backlog = True
                break
        return Progress(progressed, backlog)

    def _split_builder(self, f: OpenFile, now_wall: float) -> SplitBuild:
        """The input's builder fused with the splitter, for a file read line by line (no joiner,
        no multiline: `_fusable`); format auto's sniff looks at each chunk's first and last line first."""
        cp = f.checkpoint
        draft = self.writer.draft
        split = self.builders[f.input_idx].split_builder(cp.incarnation, cp.path, now_wall, draft.parts, draft.multi,
                                                         _container_edge if self.cfg.inputs[f.input_idx].format == "auto"
                                                         else None)
        assert split is not None
        return split

    def take(self, f: OpenFile, lines: list[Line], now_wall: float, now_mono: float, *, grouped: bool = False,
             records: list[ContainerEvent] | None = None, built: Built | None = None, built_docs: int = 0) -> None:
        """Parse lines of one file into the draft and move its checkpoint (`grouped`: already
        events; `records`: joined container records, built after `lines`; `built`: lines the
        fused loop already built into the draft, `built_docs` pairs, before `lines`)."""
        cp = f.checkpoint
        nread = len(lines)
        if built is not None and built.lines:
            nread += built.lines
            self.writer.draft.events += built_docs
            self.writer.draft.nbytes += built.nbytes
            self.read_total += built.lines
        holder = f.holder
        if not grouped:
            if holder is None and lines and self.cfg.inputs[f.input_idx].format == "auto":
                holder = self._sniff(f, lines)
            if holder is not None:
                lines, records = holder.hold(lines, now_mono)
        draft = self.writer.draft
        if draft.empty():
            draft.started = now_mono
        if lines or records:
            n0 = len(draft.parts)
            builder = self.builders[f.input_idx]
            if lines:
                draft.nbytes += builder.build(cp.incarnation, cp.path, lines, now_wall, draft.parts)
            if records:
                draft.nbytes += builder.build_container(cp.incarnation, cp.path, records, now_wall, draft.parts)
            draft.events += len(draft.parts) - n0
            if builder.dropped:
                self.drops[f.input_idx].report()
            self.read_total += len(lines) + len(records or ())
        if nread and not grouped:
            self.events.lines_read(cp.path, nread, 0)
        if f.holder is not None:
            record_cuts(f.holder, cp, self.writer)
        new_off = f.committed_offset()
        if new_off != cp.offset or cp.incarnation not in draft.checkpoints or grouped:
            self.moves += 1
            draft.cover(cp.incarnation, cp.offset, new_off)
            start, cp.offset = cp.offset, new_off
            if cp.cuts and cp.cuts[0] <= new_off:
                cp.cuts = tuple(c for c in cp.cuts if c > new_off)
            if not grouped:
                cp.size = f.harvester.size
                if f.role == "live":
                    self.grow_fingerprint(f, start)
            cp.updated = now_wall
            draft.checkpoints[cp.incarnation] = dataclasses.replace(cp)

    def grow_fingerprint(self, f: OpenFile, start: int | None = None) -> None:
        """A live file's fingerprint grown with it. From none (an empty file's names nothing: after a
        kill -9 its .gz was taken for a file no one saw), it is stored at `start` (default: the
        checkpoint's offset) before any of its events go out from memory (`must_store`)."""
        grown = f.harvester.grown_fingerprint()
        if grown is not None:
            cp = f.checkpoint
            named, (cp.fp_len, cp.fp) = cp.fp_len, grown
            if not named:
                self.writer.must_store(dataclasses.replace(cp, offset=cp.offset if start is None else start))

    def flush_due(self, now_mono: float) -> None:
        for f in list(self.files.holding.values()):
            agg = f.holder
            if agg is None or agg.next_deadline is None or agg.next_deadline > now_mono:
                continue
            evs, recs = agg.release_due(now_mono)
            if evs or recs:
                self.take(f, evs, self.clock.time(), now_mono, grouped=True, records=recs)

    def next_deadline(self) -> float | None:
        out: float | None = None
        for f in self.files.holding.values():
            d = f.holder.next_deadline if f.holder is not None else None
            if d is not None and (out is None or d < out):
                out = d
        return out

    # ---------------------------------------------------------------- what happened to open files

    def stage(self, cp: Checkpoint, new: bool = False) -> None:
        """A checkpoint move, with the next draft; `new`: an incarnation just made (`must_store`)."""
        self.moves += 1
        self.writer.stage(cp)
        if new:
            self.writer.must_store(cp)
        self.catalog.index(cp)

    def finish_cp(self, cp: Checkpoint) -> None:
        """Nothing more will be read for this incarnation."""
        cp.finished = True
        cp.updated = self.clock.time()
        self.stage(cp)
        self.recovery.forget_orphan(cp.incarnation)

    async def check(self, now: float, full: bool = True, at: Mapping[str, Key] | None = None) -> None:
        """Rotation, truncation, deletion and idleness of the open files: every one when `full`,
        else those not quiet. A file found read to its end, unchanged, active, becomes quiet.
        `at`: the file each matched path led to in the rescan just made (path -> (dev, inode)),
        so a file still at its path needs no stat of it here (`Harvester.check`)."""
        files = self.files
        for key, f in list((files.open if full else files.awake).items()):
            if files.open.get(key) is not f:
                continue
            h = f.harvester
            was_quiet, f.quiet = f.quiet, False
            if f.role == "copy":
                if h.error is not None:
                    self._copy_failed(key, f)
                elif h.at_eof:
                    self.finish(key, f, "rotated copy read")
                continue
            what = h.check(now, at)
            if was_quiet and what != "same":
                # grown, truncated, renamed or deleted while no event named it (a full check):
                # FileSource judges it at the next read round (`unannounced`)
                self.unannounced.append(f)
            if what == "truncated":
                await self.on_truncated(key, f)
                continue
            if what == "deleted":
                self.writer.must_spool(f.checkpoint.incarnation)
            if what == "touched":
                self.recovery.lost_sight_of(f.checkpoint.path, f.input_idx)
                self._rescan_soon()
            if what in ("renamed", "deleted"):
                self.events.file_rotated(h.path, h.inode, what)
            if not h.at_eof or h.position < h.data_end:
                f.quiet = False
                continue
            f.quiet = what == "same" and h.state == "active" and not h.suspect and not f.unreported
            idle_s = now - h.last_growth
            if h.state == "deleted":
                if idle_s >= DELETED_GRACE_S:
                    self.finish(key, f, "deleted")
            elif idle_s >= self.cfg.inputs[f.input_idx].close_inactive_s and not h.splitter.skipping and (
                    not f.holds_lines() or (f.holder is not None and f.holder.waits_closed)):
                # a partial container record may wait closed: the checkpoint is at its first
                # piece, so reopened (it grew) the file is read from there and the record joined.
                # Inside an over-long line already shipped cut it stays open: its checkpoint is the
                # line's start, so reopened it would ship the cut line again (a 409, but a re-send)
                self.park(key, f, "inactive")

    async def on_truncated(self, key: Key, f: OpenFile) -> None:
        """copytruncate (or any truncation): the range not read yet is in the copy logrotate left
        beside the file, found by content; it is read from there as the old incarnation (same _ids)
        while the file itself goes on as a new incarnation from 0."""
        h = f.harvester
        f.quiet = False
        old = f.checkpoint
        committed = f.committed_offset()
        self.events.file_truncated(h.path, h.inode, committed)
        self.writer.must_spool(old.incarnation)
        files = self.files
        if old.fp_len and files.free_slots() <= 0:
            for _t, k, idle in files.idle(self.clock.monotonic()):
                if k != key and idle.harvester.check(self.clock.monotonic()) == "same":
                    self.park(k, idle, "max_open_files")
                    break
        may_open = files.free_slots() > 0
        found = await asyncio.to_thread(look.look_after_truncation, h.path, h.fd, old, committed,
                                        set(files.open), may_open)
        if found.refused is not None:
            r = found.refused
            self.events.file_refused(r.path, r.reason, r.link, r.rule)
        if found.copy is not None:
            c = found.copy
            ckey = (c.st.st_dev, c.st.st_ino)
            if ckey in files.open or key not in files.open:
                c.close()
            else:
                files.unpark(ckey)
                old.offset = committed
                files.add(ckey, self.make(found.copy_path, f.input_idx, c.fd, c.st, old, start=committed,
                                          gz=c.gz, role="copy"))
                self.events.rotated_copy_opened(old.path, found.copy_path, old.incarnation, committed)
        elif old.fp_len and (not may_open or found.moved):
            # no slot for the copy now, or it kept moving (the next rotation): the old incarnation stays
            # unfinished at what was read; the next rescan's look for orphans queues its copy
            old.offset = committed
            self.catalog.index(old)
        else:
            # no copy: what we hold is all there is of the old incarnation
            self.take_final(f)
            lost = max(0, h.size - h.position)
            if lost:
                self.events.bytes_lost(h.path, h.inode, lost, "truncated before it was read, and no rotated copy found")
            self.finish_cp(old)
        fp_len, fp = found.new_fp if found.new_fp is not None else (0, identity.digest(b""))
        cp = Checkpoint(identity.new_incarnation(), old.path, h.dev, h.inode, fp_len, fp, 0, found.new_size,
                        self.clock.time(), uid=old.uid)
        h.restart_at_zero(cp)
        f.holder = self.holder(f.input_idx)   # held lines of the old one are re-read from the copy
        self.stage(cp, new=True)
        # truncated more than once since we looked? the copies of what we never saw lie beside it too
        self.recovery.lost_sight_of(old.path, f.input_idx)
        self._rescan_soon()

    def _copy_failed(self, key: Key, f: OpenFile) -> None:
        """A compressed copy that cannot be read (yet): logrotate may still be writing it. Close it;
        the incarnation stays unfinished, so a later rescan finds it again (three tries)."""
        h = f.harvester
        cp = f.checkpoint
        n = self._copy_failures.get(cp.incarnation, 0) + 1
        self._copy_failures[cp.incarnation] = n
        self.events.file_error(h.path, h.error or "unreadable")
        cp.offset = f.committed_offset()
        self.files.close(key)
        if n >= 3:
            self.events.bytes_lost(cp.path, cp.inode, max(0, h.size - cp.offset), "rotated copy unreadable")
            self._copy_failures.pop(cp.incarnation, None)
            self.finish_cp(cp)
        else:
            self.catalog.index(cp)

    def final_events(self, f: OpenFile) -> tuple[list[Line], list[ContainerEvent]]:
        """The file will not grow again: its last line without newline, and the multiline event
        (or the partial container records) held for it, complete now."""
        tail = f.harvester.flush_partial()
        holder = f.holder
        return (tail, []) if holder is None else holder.release(tail, self.clock.monotonic())

    def take_final(self, f: OpenFile) -> bool:
        """`final_events` into the draft; False when there were none."""
        tail, recs = self.final_events(f)
        if not tail and not recs:
            return False
        self.take(f, tail, self.clock.time(), self.clock.monotonic(), grouped=True, records=recs)
        return True

    def finish(self, key: Key, f: OpenFile, reason: str) -> None:
        """The file will not grow again: its last partial line and held multiline event count."""
        h = f.harvester
        if not self.take_final(f):
            f.checkpoint.offset = f.committed_offset()
        cp = f.checkpoint
        self._copy_failures.pop(cp.incarnation, None)
        self.finish_cp(cp)
        self.events.file_closed(h.path, h.inode, cp.offset, reason)
        if f.role == "copy":
            # a rotated copy the globs may also show: remember it, so it is not looked at again
            size, mtime_ns = disk_stat(h.fd)
            self.files.remember(key, Parked(size, mtime_ns, cp.incarnation, h.path, f.input_idx))
        self.files.close(key)

    def park(self, key: Key, f: OpenFile, reason: str) -> None:
        """Close a file that is read to its end; it is reopened (by identity) when it changes."""
        h = f.harvester
        cp = f.checkpoint
        if h.state != "active":
            # renamed: the globs no longer show it; its rotated siblings do (an orphan, remembered)
            try:
                pst = os.stat(h.path)
            except OSError:
                pst = None
            if pst is not None and (pst.st_dev, pst.st_ino) == key:
                self.recovery.remember_orphan(cp.incarnation, h.path, h.inode, h.size, h.mtime_ns)
        self.catalog.index(cp)
        self.files.park(key, f, reason)

    async def read_deleted_to_end(self, budget_bytes: int = 64 * 1024 * 1024) -> None:
        """Stopping: a file deleted while open cannot be found again after a restart, so what it
        still holds is read now (bounded), before the final commit."""
        now_mono = self.clock.monotonic()
        for key, f in list(self.files.open.items()):
            h = f.harvester
            if f.role != "live" or key not in self.files.open:
                continue
            if h.check(now_mono) == "truncated":
                await self.on_truncated(key, f)
                h.check(now_mono)
            if h.state != "deleted":
                continue
            self.writer.must_spool(f.checkpoint.incarnation)
            while budget_bytes > 0:
                before = h.position
                lines = h.read(CHUNK_BYTES)
                budget_bytes -= h.position - before
                if lines:
                    self.take(f, lines, self.clock.time(), now_mono)
                if h.at_eof and not lines:
                    break
            if budget_bytes > 0:
                self.finish(key, f, "deleted")
