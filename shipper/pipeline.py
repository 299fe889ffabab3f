"""The running pipeline: sources (harvester + parser per file) -> accumulator -> spool -> senders.

Reading, committing and sending overlap: while one record is committed on the spool thread the
loop keeps reading into the next, and a record goes out as soon as a request slot is free, but
when caught up at most one partial record per `flush_min_interval` (20 ms).
`flush_interval` only bounds how long a partial record waits while every slot is busy.
"""

from __future__ import annotations

import asyncio
import dataclasses
import fnmatch
import logging
import os
import random
import socket
import time
import zlib
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from shipper.clock import Clock
from shipper.config import Config
from shipper.errors import SpoolFullError
from shipper.events import Events
from shipper.model import Checkpoint, DeadLetter, Line
from shipper.parse.document import DocBuilder
from shipper.ship import bulk as bulkproto
from shipper.ship.sender import Attempt, Sender
from shipper.control import dlq_answer, dlq_claim
from shipper.model import BatchMeta as RecordMeta
from shipper.spool import AsyncSpool
from shipper.tail import discovery, identity
from shipper.tail.harvester import CHUNK_BYTES, GzipReader, Harvester, open_file

log = logging.getLogger("shipper.pipeline")

POLL_S = 0.25                 # fallback look at open files when inotify said nothing
DELETED_GRACE_S = 1.0         # a deleted file, read to its end, is closed this long after its last growth
MTIME_SLACK_S = 0.05          # file mtimes come from a coarser clock than time.time()
RESCAN_MIN_GAP_S = 0.2        # inotify-triggered rescans (something was created or moved in) at most this often
BODY_CACHE_BYTES = 8 * 1024 * 1024    # record bodies kept in memory for the senders; beyond: re-read
READ_BYTES = 256 * 1024               # per source and read round: 4 x 1 MiB copies cost RSS and page faults
RESUME_FRACTION = 0.75        # a paused reader resumes when the queue is below this share of max_bytes
DLQ_CHECK_S = 1.0             # how often a sender looks for a `shipper dlq replay|purge` request
ROOM_FILL = 0.9               # a read round aims at this share of the lines the record still has room for
FULL_ENOUGH = 0.95            # with a backlog, a record this full (of bulk_max_events) is committed
WRITES_BEHIND = 2             # records the reader may have handed to the spool thread and not yet seen written


@dataclass(slots=True)
class Source:
    harvester: Harvester
    input_idx: int
    builder: DocBuilder
    aggregator: Any = None          # MultilineAggregator when the input has multiline
    role: str = "live"              # "live": the file itself (maybe renamed); "copy": a rotated copy read to its end
    line_bytes: float = 0.0         # mean line length of the last read (sizes reads to the record's room)

    @property
    def checkpoint(self) -> Checkpoint:
        return self.harvester.checkpoint

    def committed_offset(self) -> int:
        """The offset a checkpoint may record: never past a line still held (partial or multiline)."""
        off = self.harvester.splitter.offset
        if self.aggregator is not None:
            ps = self.aggregator.pending_start
            if ps is not None and ps < off:
                off = ps
        return off


@dataclass(slots=True)
class Candidate:
    """A file to open: found by the globs, or where an incarnation's content lives now."""

    path: str
    input_idx: int
    key: tuple[int, int]
    why: str                        # glob | renamed | copy | gz (with cp) | successor
    cp: Checkpoint | None = None    # the incarnation it continues
    first_scan: bool = False
    doc_path: str | None = None     # successor: the path its lines were written at
    since: float = 0.0              # successor: changed after this (wall time)


@dataclass(slots=True)
class Parked:
    """A closed file read to its end: reopened when its size or mtime changes."""

    size: int
    mtime_ns: int
    incarnation: str | None
    path: str
    input_idx: int


@dataclass(slots=True)
class Accumulator:
    parts: list[bytes] = field(default_factory=list)
    events: int = 0
    nbytes: int = 0
    covers: dict[str, list[int]] = field(default_factory=dict)
    checkpoints: dict[str, Checkpoint] = field(default_factory=dict)
    started: float = 0.0

    def empty(self) -> bool:
        return not self.parts and not self.checkpoints


class Pipeline:
    def __init__(self, cfg: Config, spool: AsyncSpool, events: Events, clock: Clock,
                 host_name: str | None = None, rng: random.Random | None = None) -> None:
        self.cfg = cfg
        self.spool = spool
        self.events = events
        self.clock = clock
        self.rng = rng or random.Random()
        self.host_name = host_name or socket.gethostname()
        self.shipping = Sender(cfg, events, clock, self.rng)
        self.client = self.shipping.client
        self.builders = [DocBuilder(inp, cfg.output.index, self.host_name) for inp in cfg.inputs]
        self.sources: dict[tuple[int, int], Source] = {}
        self.acc = Accumulator()
        self.outbox: deque[tuple[RecordMeta, bytes | None]] = deque()
        self.outbox_ready = asyncio.Event()
        self._idle_sender = asyncio.Lock()      # one idle sender waits for the outbox, the others queue behind it
        self.space = asyncio.Event()
        self.wake = asyncio.Event()
        self.stopping = False
        self.reading_done = False       # the final commit is queued: idle senders may return
        self.in_flight = 0
        self.queue_events = 0
        self.queue_bytes = 0
        self.cached_bytes = 0
        self.paused = False
        self.first_scan_done = False
        self.max_open_files = max(1, cfg.max_open_files)
        self.clean_removed_after_s = cfg.clean_removed_after_s
        self.parked: dict[tuple[int, int], Parked] = {}
        self._parked_paths: dict[str, tuple[int, int]] = {}
        self.waiting: dict[tuple[int, int], Candidate] = {}    # in arrival order: fair under max_open_files
        self.cps: dict[str, Checkpoint] = {}                   # incarnation -> its latest checkpoint
        self._by_key: dict[tuple[int, int], set[str]] = {}
        self._by_path: dict[str, set[str]] = {}
        self._by_root: dict[str, set[str]] = {}                # rotation root (app.log for app.log.2.gz) -> incs
        self._known_paths: set[str] = set()
        self._path_input: dict[str, int] = {}
        self._orphan_seen: dict[str, tuple[str, int, int, int]] = {}   # inc -> where it was last found, unchanged
        self._orphan_paths: dict[str, str] = {}
        self._copy_failures: dict[str, int] = {}
        self._rescan_soon = False
        self._orphans_dirty = False
        self._last_scan = float("-inf")
        self._scan_cost_s = 0.0
        self._successor_paths: dict[str, tuple[float, int]] = {}
        self._path_seen_at: dict[str, float] = {}    # path -> wall time of the last rescan that saw a file there
        self._seen_before: dict[str, float] = {}     # the same, as of the rescan before this one
        self._vanished: set[str] = set()             # known paths found empty (looked around once)
        self._spool_full = False
        self._next_dlq_check = 0.0
        self.read_total = 0
        self.shipped_total = 0
        # the last read round stopped with more to read (a file behind, or the record full): the
        # record keeps filling to its limits instead of leaving at once (fewer, fuller requests)
        self.backlog = False
        self._last_commit_at = float("-inf")    # when the last record was handed to the spool (flush_min_interval)
        self._commit_lock = asyncio.Lock()      # held by the record being written (records are written in order)
        self.scanned = asyncio.Event()           # set after the first rescan: every matched file is open
        self._unreadable: set[str] = set()       # paths whose permission problem was logged once
        self.give_up_at: float | None = None     # monotonic: spool writes stop retrying a full disk after this
        self._writing: Accumulator | None = None  # taken by commit(), being written on the spool thread
        self._writes: deque[tuple[Accumulator, asyncio.Future[None]]] = deque()   # records queued for writing, in order
        self._write_error: BaseException | None = None   # a record that could not be written: nothing after it is
        self._watcher: discovery.Watcher | None = None
        # TODO(#13): stop-gap until the lead's pipeline reads `await spool.contents()` at start
        for cp in spool._spool.checkpoints.values():
            self._index_cp(dataclasses.replace(cp))
            self._known_paths.add(cp.path)
        for seq in sorted(spool._spool.pending):
            meta = spool._spool.pending[seq]
            self.outbox.append((meta, None))
            self.queue_events += meta.events
            self.queue_bytes += meta.stored_bytes
        if self.outbox:
            self.outbox_ready.set()

    # ================================================================ reading side
    #
    # Identity: a file incarnation is (dev, inode) plus the fingerprint of its first bytes, with a
    # checkpoint in `self.cps`. A source reads one open file for one incarnation: the live file,
    # the same inode renamed (`app.log.1`), or a rotated copy (plain or .gz) that holds the range
    # the incarnation had not read yet. A file that is not open is parked (read to its end,
    # reopened when it changes), waiting (for a slot under max_open_files), or an orphan: an
    # unfinished incarnation the globs no longer show, looked up among its rotated siblings by
    # content. The rescan (globs + stat, in a thread) decides what exists; inotify only hurries it.

    def _index_cp(self, cp: Checkpoint) -> None:
        old = self.cps.get(cp.incarnation)
        # the object an open source moves is the truth; the accumulator's copies of it never newer
        if old is not None and old is not cp and (old.updated, old.offset, old.finished) >= (cp.updated, cp.offset, cp.finished):
            return
        self.cps[cp.incarnation] = cp
        self._by_key.setdefault((cp.dev, cp.inode), set()).add(cp.incarnation)
        self._by_path.setdefault(cp.path, set()).add(cp.incarnation)
        self._by_root.setdefault(identity.rotation_root(cp.path), set()).add(cp.incarnation)

    def _unindex_cp(self, inc: str) -> None:
        cp = self.cps.pop(inc, None)
        if cp is None:
            return
        if cp.path not in self._by_path or self._by_path[cp.path] == {inc}:
            self._vanished.discard(cp.path)
        for index, k in ((self._by_key, (cp.dev, cp.inode)), (self._by_path, cp.path),
                         (self._by_root, identity.rotation_root(cp.path))):
            s = index.get(k)  # type: ignore[attr-defined]
            if s is not None:
                s.discard(inc)
                if not s:
                    del index[k]  # type: ignore[attr-defined]
        self._forget_orphan(inc)

    def _stage(self, cp: Checkpoint) -> None:
        """Put a copy of this checkpoint into the accumulator: it is written with the next record."""
        if self.acc.empty():
            self.acc.started = self.clock.monotonic()
        self.acc.checkpoints[cp.incarnation] = dataclasses.replace(cp)
        self._index_cp(cp)

    def _finish_cp(self, cp: Checkpoint) -> None:
        """Nothing more will be read for this incarnation."""
        cp.finished = True
        cp.updated = self.clock.time()
        self._stage(cp)
        self._forget_orphan(cp.incarnation)

    def _forget_orphan(self, inc: str) -> None:
        seen = self._orphan_seen.pop(inc, None)
        if seen is not None and self._orphan_paths.get(seen[0]) == inc:
            del self._orphan_paths[seen[0]]

    def _lookup(self, key: tuple[int, int], head: bytes, size: int | None) -> Checkpoint | None:
        """The known incarnation of the file (dev, inode) whose fingerprint its first bytes carry,
        and that has not read past its size (else it was truncated and is another one now)."""
        best: tuple[tuple[bool, float, int], Checkpoint] | None = None
        for inc in self._by_key.get(key, ()):
            cp = self.cps[inc]
            if size is not None and cp.offset > size:
                continue
            if cp.fp_len == 0:
                # an empty file's fingerprint names nothing: only an open-ended incarnation that read
                # nothing yet may claim its inode (a finished one is some other file's inode now),
                # and never for a compressed file (always a new inode: the number was reused)
                if cp.offset != 0 or cp.finished or size is None:
                    continue
            elif not identity.head_matches(head, cp.fp_len, cp.fp):
                continue
            rank = (not cp.finished, cp.updated, cp.offset)
            if best is None or rank > best[0]:
                best = (rank, cp)
        return None if best is None else best[1]

    def _copy_of(self, path: str, head: bytes, key: tuple[int, int]) -> Checkpoint | None:
        """The known incarnation that this file is a rotated copy of (plain or compressed): its name
        is a rotation of that incarnation's name and it starts with the fingerprinted bytes."""
        root = identity.rotation_root(path)
        if root == path:
            return None
        best: tuple[tuple[int, bool, float], Checkpoint] | None = None
        for inc in self._by_root.get(root, ()):
            cp = self.cps[inc]
            if (cp.dev, cp.inode) == key or not identity.head_matches(head, cp.fp_len, cp.fp):
                continue
            rank = (cp.fp_len, not cp.finished, cp.updated)
            if best is None or rank > best[0]:
                best = (rank, cp)
        return None if best is None else best[1]

    def _look_again_for(self, cand: Candidate) -> None:
        """A successor (written at a path while nobody looked) not taken now: the next rescan
        looks among that path's rotated siblings again."""
        if cand.why == "successor" and cand.doc_path is not None:
            self._successor_paths.setdefault(cand.doc_path, (cand.since, cand.input_idx))

    def _being_copied(self, path: str, head: bytes, compressed: bool) -> bool:
        """Is this unknown file at a rotated name a copy logrotate is still writing? The compressor
        creates its .gz empty and fills it; copytruncate's copy starts empty and grows. Such a file
        is too short to carry the fingerprint of the file it copies, but its bytes so far are that
        file's first bytes (looked up in the files of the same rotation root we hold or parked)."""
        root = identity.rotation_root(path)
        if root == path or len(head) >= identity.FP_MAX_BYTES:
            return False
        if not head:
            return True           # nothing to ship yet either way; judged by content once written
        n = len(head)
        for src in self.sources.values():
            h = src.harvester
            cp = src.checkpoint
            if h.compressed or cp.fp_len <= n or identity.rotation_root(cp.path) != root:
                continue
            try:
                if os.pread(h.fd, n, 0) == head:
                    return True
            except OSError:
                continue
        for pkey, p in self.parked.items():
            if p.incarnation is None or identity.rotation_root(p.path) != root or identity.is_compressed(p.path):
                continue
            cp = self.cps.get(p.incarnation)
            if cp is None or cp.fp_len <= n:
                continue
            try:
                fd = os.open(p.path, os.O_RDONLY | os.O_NONBLOCK)
            except OSError:
                continue
            try:
                st = os.fstat(fd)
                if (st.st_dev, st.st_ino) == pkey and os.pread(fd, n, 0) == head:
                    return True
            except OSError:
                pass
            finally:
                os.close(fd)
        return False

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

    def _make_source(self, path: str, idx: int, fd: int, st: os.stat_result, cp: Checkpoint, *,
                     start: int | None = None, gz: GzipReader | None = None, size_hint: int | None = None,
                     role: str = "live") -> Source:
        inp = self.cfg.inputs[idx]
        h = Harvester(path, fd, st, cp, inp.max_line_bytes, self.clock.monotonic(), start_offset=start,
                      gz=gz, size_hint=size_hint)
        return Source(h, idx, self.builders[idx], self._aggregator(idx), role)

    def _aggregator(self, idx: int) -> Any:
        inp = self.cfg.inputs[idx]
        if inp.multiline is None:
            return None
        from shipper.parse.multiline import MultilineAggregator
        return MultilineAggregator(inp.multiline.start, inp.multiline.max_lines, inp.multiline.timeout_s)

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
        self.check_sources()
        for src in self.sources.values():
            if src.role == "live":
                src.harvester.refresh_fingerprint()    # a young file's content claimed before a copy of it is judged
        first = not self.first_scan_done
        if first:
            # after a downtime, anything may have been rotated away unseen at any path we knew
            for path in self._by_path:
                idx = self._input_for(path)
                if idx is not None:
                    self._lost_sight_of(path, idx)
        seen: dict[tuple[int, int], str] = {}
        prev_seen_at, self._path_seen_at = self._path_seen_at, {}
        for path, idx, st in entries:
            key = (st.st_dev, st.st_ino)
            seen[key] = path
            self._path_input[path] = idx
            self._path_seen_at[path] = scan_started
            if key in self.sources:
                continue
            w = self.waiting.get(key)
            if w is not None:
                if w.why == "glob":
                    w.path, w.input_idx = path, idx    # rotated names shift: open it where it is now
                continue
            p = self.parked.get(key)
            if p is not None and p.size == st.st_size and p.mtime_ns == st.st_mtime_ns:
                continue
            self.waiting[key] = Candidate(path, idx, key, "glob", first_scan=first)
        for key in [k for k in self.parked if k not in seen]:
            self._unpark(key)
        if len(self._path_input) > 4 * len(seen) + 1024:
            self._path_input = {path: self._path_input[path] for path in seen.values() if path in self._path_input}
        self.first_scan_done = True
        self._seen_before = prev_seen_at
        # a known path with no file now (nocreate, or deleted): what was last written there may have
        # been rotated away unseen; look once among its siblings
        for path in self._by_path:
            if path in self._path_seen_at:
                self._vanished.discard(path)
            elif path not in self._vanished:
                self._vanished.add(path)
                idx = self._input_for(path)
                if idx is not None:
                    self._lost_sight_of(path, idx)
        await self._resolve_orphans(seen)
        await self.open_waiting()
        if self._orphans_dirty:
            # opening showed an inode now held by a new incarnation: find where the old one went now
            self._orphans_dirty = False
            await self._resolve_orphans(seen)
            await self.open_waiting()
        if self._successor_paths:
            await self._find_successors(seen)
            await self.open_waiting()

    def _unpark(self, key: tuple[int, int]) -> Parked | None:
        p = self.parked.pop(key, None)
        if p is not None and self._parked_paths.get(p.path) == key:
            del self._parked_paths[p.path]
        return p

    async def _resolve_orphans(self, seen: dict[tuple[int, int], str]) -> None:
        """Unfinished incarnations that no source reads and no glob shows: find their content among
        the rotated siblings (same inode renamed, a plain copy, a .gz) and read the rest from there;
        also ship the siblings written at that path while we did not look (a downtime across
        rotations). An incarnation found nowhere is finished (and its unread bytes reported)."""
        open_incs = {s.checkpoint.incarnation for s in self.sources.values()}
        holders: dict[tuple[int, int], str | None] = {k: p.incarnation for k, p in self.parked.items()}
        for k, s in self.sources.items():
            holders[k] = s.checkpoint.incarnation
        todo: list[Checkpoint] = []
        for cp in self.cps.values():
            if cp.finished or cp.incarnation in open_incs:
                continue
            key = (cp.dev, cp.inode)
            if key in self.waiting:
                continue           # identified when it is opened
            if key in seen and holders.get(key) == cp.incarnation:
                continue           # parked where the globs see it
            todo.append(cp)
        if not todo:
            return
        cache = dict(self._orphan_seen)
        results = await asyncio.to_thread(_locate, todo, cache)
        for res in results:
            if res is None:
                continue
            cp, found, sibs = res
            if cp.finished or self.cps.get(cp.incarnation) is not cp:
                continue
            idx = self._input_for(cp.path)
            if idx is None:
                self.events.file_closed(cp.path, cp.inode, cp.offset, "no input matches it any more")
                self._finish_cp(cp)
                continue
            if found is None:
                lost = max(0, cp.size - cp.offset)
                if lost:
                    self.events.bytes_lost(cp.path, cp.inode, lost, "file gone before it was read to its end")
                self.events.file_closed(cp.path, cp.inode, cp.offset, "gone")
                self._finish_cp(cp)
            else:
                kind, sib = found
                key = (sib.dev, sib.inode)
                if key in self.sources or key in self.waiting:
                    pass
                elif kind == "renamed" and sib.size <= cp.offset:
                    self._orphan_seen[cp.incarnation] = (sib.path, sib.inode, sib.size, sib.mtime_ns)
                    self._orphan_paths[sib.path] = cp.incarnation
                elif kind == "copy" and sib.size <= cp.offset:
                    self._finish_cp(cp)          # the copy holds nothing we have not read
                else:
                    self.waiting[key] = Candidate(sib.path, idx, key, kind, cp=cp)
            self._queue_successors(cp.path, cp.updated, idx, sibs, seen)

    def _queue_successors(self, path: str, since: float, idx: int, sibs: list[identity.Sibling],
                          seen: dict[tuple[int, int], str]) -> None:
        """What was written at `path` while nobody looked (a downtime across rotations): rotated
        siblings modified after our last look (`since`, wall time) that no checkpoint knows."""
        for sib in sibs:
            key = (sib.dev, sib.inode)
            if sib.mtime <= since - MTIME_SLACK_S or key in seen or key in self.sources or key in self.waiting:
                continue
            if self._lookup(key, sib.head, None if sib.compressed else sib.size) is not None or self._copy_of(sib.path, sib.head, key) is not None:
                continue
            self.waiting[key] = Candidate(sib.path, idx, key, "successor", doc_path=path, since=since)

    async def _find_successors(self, seen: dict[tuple[int, int], str]) -> None:
        """For each path that got a new incarnation after we had lost sight of it, queue the
        rotated siblings written in between (see `_queue_successors`)."""
        todo, self._successor_paths = self._successor_paths, {}
        listed = await asyncio.to_thread(_list_siblings, {p: v[0] for p, v in todo.items()})
        for path, sibs in listed.items():
            since, idx = todo[path]
            self._queue_successors(path, since, idx, sibs, seen)

    def _recheck_modified(self, paths: set[str]) -> None:
        """inotify said these paths were written: reopen parked files that changed."""
        for path in paths:
            key = self._parked_paths.get(path)
            if key is not None:
                p = self.parked[key]
                try:
                    st = os.stat(path)
                except OSError:
                    continue
                if (st.st_dev, st.st_ino) == key and (st.st_size != p.size or st.st_mtime_ns != p.mtime_ns):
                    self._unpark(key)
                    self.waiting.setdefault(key, Candidate(path, p.input_idx, key, "glob"))
                continue
            inc = self._orphan_paths.get(path)
            if inc is not None:
                self._forget_orphan(inc)
                self._rescan_soon = True

    def _evict(self, n: int) -> int:
        """Close up to n sources that are read to their end (least recently grown first) so that
        waiting files get a slot. A deleted file is never closed early: closing it loses its rest."""
        idle = []
        now = self.clock.monotonic()
        for key, src in list(self.sources.items()):
            h = src.harvester
            if src.role != "live" or h.state not in ("active", "renamed") or not h.at_eof or h.position < h.size:
                continue
            if src.aggregator is not None and src.aggregator.pending_start is not None:
                continue
            what = h.check(now)          # a look first: a file deleted or truncated meanwhile stays open
            if what == "truncated":
                self._on_truncated(key, src)
                continue
            if what != "same" or h.state not in ("active", "renamed"):
                continue
            idle.append((h.last_growth, key, src))
        idle.sort(key=lambda t: t[0])
        for _t, key, src in idle[:n]:
            self._park(key, src, "max_open_files")
        return min(n, len(idle))

    async def open_waiting(self) -> None:
        """Open waiting files while there are slots under max_open_files (opening happens in a thread)."""
        if not self.waiting:
            return
        free = self.max_open_files - len(self.sources)
        if free < len(self.waiting):
            free += self._evict(len(self.waiting) - max(free, 0))
        if free <= 0:
            return
        batch: list[Candidate] = []
        for key in list(self.waiting)[:free]:
            batch.append(self.waiting.pop(key))
        job = asyncio.ensure_future(asyncio.to_thread(_open_batch, batch))
        try:
            opened = await asyncio.shield(job)
        except asyncio.CancelledError:
            job.add_done_callback(_close_opened)     # stopping: the thread's files are not leaked
            raise
        for cand, res in zip(batch, opened):
            if res is None:
                self._look_again_for(cand)   # a successor gone between the look and the open (compressed meanwhile)
                # a file we may not read is retried at every scan; say so once, not silently
                if cand.path not in self._unreadable and not os.access(cand.path, os.R_OK) and os.path.exists(cand.path):
                    self._unreadable.add(cand.path)
                    self.events.file_error(cand.path, "permission denied: not readable by this user; retried at every scan")
                continue
            self._unreadable.discard(cand.path)
            fd, st, head, gz = res
            try:
                self._adopt(cand, fd, st, head, gz)
            except BaseException:
                _close_file(fd, gz)
                raise
        # a compressed copy read from far in: decompress up to the offset in a thread, not in the
        # first read on the loop (a 1 GiB .gz takes seconds)
        far = [s.harvester for s in self.sources.values() if s.harvester.needs_seek]
        if far:
            await asyncio.to_thread(lambda: [h.seek_compressed() for h in far])

    def _adopt(self, cand: Candidate, fd: int, st: os.stat_result, head: bytes, gz: GzipReader | None) -> None:
        """Decide what an opened file is, and read it as that (or close it again)."""
        key = (st.st_dev, st.st_ino)

        def drop() -> None:
            _close_file(fd, gz)

        if key in self.sources or key != cand.key:
            drop()          # the name now names another file (rotated names shift): look again
            self._look_again_for(cand)
            self._rescan_soon = True
            return
        was_parked = self._unpark(key) is not None
        idx = cand.input_idx
        now_wall = self.clock.time()
        if cand.cp is not None:
            cp = cand.cp
            if cp.finished or self.cps.get(cp.incarnation) is not cp or \
                    any(s.checkpoint.incarnation == cp.incarnation for s in self.sources.values()):
                drop()
                return
            self._forget_orphan(cp.incarnation)
            if cand.why == "renamed":
                src = self._make_source(cand.path, idx, fd, st, cp)
                src.harvester.state = "renamed"
            else:
                src = self._make_source(cand.path, idx, fd, st, cp, gz=gz, role="copy", size_hint=st.st_size if gz is None else None)
                self.events.rotated_copy_opened(cp.path, cand.path, cp.incarnation, cp.offset)
            self.sources[key] = src
            self.events.file_opened(cand.path, st.st_ino, cp.offset, cp.incarnation)
            return
        if cand.why == "glob":
            cp_found = self._lookup(key, head, None if gz is not None else st.st_size)
            if cp_found is not None and cp_found.fp_len == 0:
                self._lost_sight_of(cand.path, idx)   # an empty file's inode proves little: look around
            if cp_found is not None:
                cp = cp_found
                if cp.finished and (gz is not None or st.st_size <= cp.offset):
                    self._park(key, None, "finished", path=cand.path, st=st, inc=cp.incarnation, idx=idx)
                    drop()
                    return
                if cp.finished:
                    cp.finished = False          # the same file, grown again after we let it go
                src = self._make_source(cand.path, idx, fd, st, cp, gz=gz, role="copy" if gz is not None else "live")
                self.sources[key] = src
                if was_parked:
                    self.events.file_reopened(cand.path, st.st_ino, cp.offset)
                else:
                    self.events.file_opened(cand.path, st.st_ino, cp.offset, cp.incarnation)
                return
            if self._by_key.get(key):
                self._orphans_dirty = True       # its inode held another incarnation: go find that one's copy
                self._rescan_soon = True
            copy_of = self._copy_of(cand.path, head, key)
            if copy_of is not None:
                reading = any(s.checkpoint.incarnation == copy_of.incarnation for s in self.sources.values())
                if copy_of.finished or reading or self._input_for(copy_of.path) is None:
                    # a rotated copy of what we read (or are reading): shipping it would ship twice
                    self._park(key, None, "rotated copy", path=cand.path, st=st, inc=copy_of.incarnation, idx=idx)
                    drop()
                    return
                # the rest of an incarnation we lost track of: read it from this copy
                self._forget_orphan(copy_of.incarnation)
                src = self._make_source(cand.path, idx, fd, st, copy_of, gz=gz, role="copy")
                self.sources[key] = src
                self.events.rotated_copy_opened(copy_of.path, cand.path, copy_of.incarnation, copy_of.offset)
                return
        if cand.why in ("glob", "successor") and self._being_copied(cand.path, head, gz is not None):
            # judged again when it changes: shipping it now would ship a copy under a new identity
            if cand.why == "successor":
                self._look_again_for(cand)      # no glob shows it, so no park would be seen again
            else:
                self._park(key, None, "copy being written", path=cand.path, st=st, idx=idx)
            drop()
            return
        # a new incarnation
        doc_path = cand.doc_path or cand.path
        if cand.why == "glob":
            self._lost_sight_of(doc_path, idx)
        inp = self.cfg.inputs[idx]
        start = 0
        if gz is None and cand.first_scan and inp.start_at == "end" and cand.path not in self._known_paths:
            start = _last_newline_end(fd, st.st_size)      # a file never seen: only what comes next
        fp_len, fp = identity.fingerprint_head(head[:st.st_size] if gz is None else head)
        cp = Checkpoint(identity.new_incarnation(), doc_path, st.st_dev, st.st_ino, fp_len, fp, start,
                        st.st_size, now_wall)
        self._stage(cp)
        role = "copy" if gz is not None else "live"
        src = self._make_source(cand.path, idx, fd, st, cp, gz=gz, role=role)
        if cand.why == "successor" and gz is None:
            src.harvester.state = "renamed"
        self.sources[key] = src
        self.events.file_opened(cand.path, st.st_ino, start, cp.incarnation)

    def _lost_sight_of(self, path: str, idx: int) -> None:
        """A new incarnation appears at a path we knew: whatever was created there and rotated away
        since we last looked may have been seen by no one. Look among the rotated siblings for
        files changed since then that no checkpoint knows (after the rescan, off the loop)."""
        prev = [self.cps[i] for i in self._by_path.get(path, ())]
        if not prev:
            return
        since = self._seen_before.get(path)
        if since is None:
            since = max(c.updated for c in prev)
        old = self._successor_paths.get(path)
        self._successor_paths[path] = (since if old is None else min(since, old[0]), idx)

    def read_round(self) -> bool:
        """One pass over every open source, bounded by the record limits. True if anything was read."""
        progressed = False
        backlog = False
        max_events = self.cfg.output.bulk_max_events
        max_bytes = self.cfg.output.bulk_max_bytes
        now_wall = self.clock.time()
        now_mono = self.clock.monotonic()
        for src in list(self.sources.values()):
            h = src.harvester
            if h.fd < 0:
                continue
            budget = min(READ_BYTES, max(64 * 1024, max_bytes - self.acc.nbytes))
            # about the lines the record has room for: a round that overshoots bulk_max_events
            # makes _group cut a small extra body (2000 + 250 docs: two requests, not one)
            if src.line_bytes:
                room = max_events - self.acc.events
                budget = min(budget, max(4096, int(room * src.line_bytes * ROOM_FILL)))
            else:
                budget = min(budget, 64 * 1024)     # line length not known yet: a first look
            lines = h.read(budget)
            if not lines and h.splitter.offset == src.checkpoint.offset:
                continue
            if lines:
                src.line_bytes = (lines[-1][1] - lines[0][0]) / len(lines)
            progressed = progressed or bool(lines) or not h.at_eof
            backlog = backlog or not h.at_eof
            h.last_growth = now_mono if lines else h.last_growth
            self._take(src, lines, now_wall, now_mono)
            if self.acc.events >= max_events * FULL_ENOUGH or self.acc.nbytes >= max_bytes:
                backlog = True
                break
        self.backlog = backlog
        return progressed

    def _take(self, src: Source, lines: list[Line], now_wall: float, now_mono: float) -> None:
        """Parse lines of one source into the accumulator and move its checkpoint."""
        cp = src.checkpoint
        if src.aggregator is not None:
            evs: list[Line] = []
            for ln in lines:
                evs.extend(src.aggregator.feed(ln, now_mono))
            lines = evs
        acc = self.acc
        if not acc.parts and not acc.checkpoints:
            acc.started = now_mono
        if lines:
            n0 = len(acc.parts)
            acc.nbytes += src.builder.build(cp.incarnation, cp.path, lines, now_wall, acc.parts)
            added = len(acc.parts) - n0
            acc.events += added
            self.read_total += len(lines)
            self.events.lines_read(cp.path, len(lines), 0)
        new_off = src.committed_offset()
        if new_off != cp.offset or cp.incarnation not in acc.checkpoints:
            cov = acc.covers.get(cp.incarnation)
            if cov is None:
                acc.covers[cp.incarnation] = [cp.offset, new_off]
            else:
                cov[1] = new_off
            cp.offset = new_off
            cp.size = src.harvester.size
            cp.updated = now_wall
            if src.role == "live":
                src.harvester.refresh_fingerprint()
            acc.checkpoints[cp.incarnation] = dataclasses.replace(cp)

    def flush_multiline(self) -> None:
        now_mono = self.clock.monotonic()
        for src in self.sources.values():
            agg = src.aggregator
            if agg is None or agg.next_deadline is None or agg.next_deadline > now_mono:
                continue
            evs = agg.flush_due(now_mono)
            if evs:
                self._take_events(src, evs)

    def _take_events(self, src: Source, evs: list[Line]) -> None:
        cp = src.checkpoint
        acc = self.acc
        if not acc.parts and not acc.checkpoints:
            acc.started = self.clock.monotonic()
        n0 = len(acc.parts)
        acc.nbytes += src.builder.build(cp.incarnation, cp.path, evs, self.clock.time(), acc.parts)
        acc.events += len(acc.parts) - n0
        self.read_total += len(evs)
        new_off = src.committed_offset()
        cov = acc.covers.setdefault(cp.incarnation, [cp.offset, new_off])
        cov[1] = new_off
        cp.offset = new_off
        cp.updated = self.clock.time()
        acc.checkpoints[cp.incarnation] = dataclasses.replace(cp)

    def check_sources(self) -> None:
        """Rotation, truncation, deletion and idleness of every open source."""
        now = self.clock.monotonic()
        for key, src in list(self.sources.items()):
            h = src.harvester
            if src.role == "copy":
                if h.error is not None:
                    self._copy_failed(key, src)
                elif h.at_eof:
                    self._finish(key, src, "rotated copy read")
                continue
            what = h.check(now)
            if what == "truncated":
                self._on_truncated(key, src)
                continue
            if what == "touched":
                self._lost_sight_of(src.checkpoint.path, src.input_idx)
                self._rescan_soon = True
            if what in ("renamed", "deleted"):
                self.events.file_rotated(h.path, h.inode, what)
            if not h.at_eof or h.position < h.size:
                continue
            idle_s = now - h.last_growth
            if h.state == "deleted":
                if idle_s >= DELETED_GRACE_S:
                    self._finish(key, src, "deleted")
            elif idle_s >= self.cfg.inputs[src.input_idx].close_inactive_s:
                if src.aggregator is None or src.aggregator.pending_start is None:
                    self._park(key, src, "inactive")

    def _on_truncated(self, key: tuple[int, int], src: Source) -> None:
        """copytruncate (or any truncation): the range not read yet is in the copy logrotate left
        beside the file, found by content; it is read from there as the old incarnation (same _ids)
        while the file itself goes on as a new incarnation from 0."""
        h = src.harvester
        old = src.checkpoint
        committed = src.committed_offset()
        self.events.file_truncated(h.path, h.inode, committed)
        copy_src = None
        if old.fp_len:
            sibs = [s for p in identity.rotated_siblings(h.path) if (s := identity.look_at(p)) is not None]
            found = identity.find_incarnation(h.path, old.dev, old.inode, old.fp_len, old.fp, committed, sibs,
                                              copies_only=True)
            if found is not None:
                kind, sib = found
                skey = (sib.dev, sib.inode)
                opened = open_file(sib.path) if skey not in self.sources else None
                if opened is not None and (opened[1].st_dev, opened[1].st_ino) == skey:
                    fd, st = opened
                    try:
                        gz = GzipReader(fd) if kind == "gz" else None
                    except OSError:
                        os.close(fd)
                    else:
                        self._unpark(skey)
                        old.offset = committed
                        copy_src = self._make_source(sib.path, src.input_idx, fd, st, old, start=committed, gz=gz,
                                                     role="copy")
                        self.sources[skey] = copy_src
                        self.events.rotated_copy_opened(old.path, sib.path, old.incarnation, committed)
                elif opened is not None:
                    os.close(opened[0])
        if copy_src is None:
            # no copy: what we hold is all there is of the old incarnation
            tail = self._final_events(src)
            if tail:
                self._take_events(src, tail)
            lost = max(0, h.size - h.position)
            if lost:
                self.events.bytes_lost(h.path, h.inode, lost, "truncated before it was read, and no rotated copy found")
            self._finish_cp(old)
        try:
            size = os.fstat(h.fd).st_size
        except OSError:
            size = 0
        try:
            fp_len, fp = identity.fingerprint_fd(h.fd, size)
        except OSError:
            fp_len, fp = 0, identity.digest(b"")   # unreadable now: grows once it reads again
        cp = Checkpoint(identity.new_incarnation(), old.path, h.dev, h.inode, fp_len, fp, 0, size, self.clock.time())
        h.restart_at_zero(cp)
        src.aggregator = self._aggregator(src.input_idx)   # held lines of the old one are re-read from the copy
        self._stage(cp)
        # truncated more than once since we looked? the copies of what we never saw lie beside it too
        self._lost_sight_of(old.path, src.input_idx)
        self._rescan_soon = True

    def _copy_failed(self, key: tuple[int, int], src: Source) -> None:
        """A compressed copy that cannot be read (yet): logrotate may still be writing it. Close it;
        the incarnation stays unfinished, so a later rescan finds it again (three tries)."""
        h = src.harvester
        cp = src.checkpoint
        n = self._copy_failures.get(cp.incarnation, 0) + 1
        self._copy_failures[cp.incarnation] = n
        self.events.file_error(h.path, h.error or "unreadable")
        if src.committed_offset() != cp.offset:
            cp.offset = src.committed_offset()
        h.close()
        del self.sources[key]
        if n >= 3:
            lost = max(0, h.size - cp.offset)
            self.events.bytes_lost(cp.path, cp.inode, lost, "rotated copy unreadable")
            self._copy_failures.pop(cp.incarnation, None)
            self._finish_cp(cp)
        else:
            self._index_cp(cp)

    def _final_events(self, src: Source) -> list[Line]:
        """The source will not grow again: its last line without newline, and the multiline event
        held for it, complete now."""
        tail = src.harvester.flush_partial()
        if src.aggregator is None:
            return tail
        evs: list[Line] = []
        for ln in tail:
            evs.extend(src.aggregator.feed(ln, self.clock.monotonic()))
        evs.extend(src.aggregator.flush())
        return evs

    def _finish(self, key: tuple[int, int], src: Source, reason: str) -> None:
        """The file will not grow again: its last partial line and held multiline event count."""
        h = src.harvester
        tail = self._final_events(src)
        if tail:
            self._take_events(src, tail)
        else:
            src.checkpoint.offset = src.committed_offset()
        cp = src.checkpoint
        self._copy_failures.pop(cp.incarnation, None)
        self._finish_cp(cp)
        self.events.file_closed(h.path, h.inode, cp.offset, reason)
        if src.role == "copy":
            # a rotated copy the globs may also show: remember it, so it is not looked at again
            size, mtime_ns = _disk_stat(h.fd)
            self.parked[key] = Parked(size, mtime_ns, cp.incarnation, h.path, src.input_idx)
            self._parked_paths[h.path] = key
        h.close()
        del self.sources[key]

    def _park(self, key: tuple[int, int], src: Source | None, reason: str, *, path: str = "",
              st: os.stat_result | None = None, inc: str | None = None, idx: int = 0) -> None:
        """Close a file that is read to its end; it is reopened (by identity) when it changes."""
        if src is None:
            assert st is not None
            self.parked[key] = Parked(st.st_size, st.st_mtime_ns, inc, path, idx)
            self._parked_paths[path] = key
            return
        h = src.harvester
        cp = src.checkpoint
        if h.state == "active":
            self.parked[key] = Parked(h.size, h.mtime_ns, cp.incarnation, h.path, src.input_idx)
            self._parked_paths[h.path] = key
        else:
            # renamed: the globs no longer show it; its rotated siblings do (an orphan, remembered)
            try:
                pst = os.stat(h.path)
            except OSError:
                pst = None
            if pst is not None and (pst.st_dev, pst.st_ino) == key:
                self._orphan_seen[cp.incarnation] = (h.path, h.inode, h.size, h.mtime_ns)
                self._orphan_paths[h.path] = cp.incarnation
        self._index_cp(cp)
        self.events.file_parked(h.path, h.inode, cp.offset, reason)
        h.close()
        del self.sources[key]

    def read_deleted_to_end(self, budget_bytes: int = 64 * 1024 * 1024) -> None:
        """Stopping: a file deleted while open cannot be found again after a restart, so what it
        still holds is read now (bounded), before the final commit."""
        now_mono = self.clock.monotonic()
        for key, src in list(self.sources.items()):
            h = src.harvester
            if src.role != "live" or key not in self.sources:
                continue
            if h.check(now_mono) == "truncated":
                self._on_truncated(key, src)
                h.check(now_mono)
            if h.state != "deleted":
                continue
            while budget_bytes > 0:
                before = h.position
                lines = h.read(CHUNK_BYTES)
                budget_bytes -= h.position - before
                if lines:
                    self._take(src, lines, self.clock.time(), now_mono)
                if h.at_eof and not lines:
                    break
            if budget_bytes > 0:
                self._finish(key, src, "deleted")

    async def clean_checkpoints(self) -> int:
        """Forget checkpoints of files that are gone and fully shipped, `clean_removed_after` after
        they finished, so the store does not grow without bound. A finished incarnation whose
        content still lies beside its path (a rotated copy, a .gz) is kept: forgetting it would
        let a glob that matches the copy ship it again. Returns how many were forgotten."""
        grace = self.clean_removed_after_s
        now_wall = self.clock.time()
        open_incs = {s.checkpoint.incarnation for s in self.sources.values()}
        old = [cp for cp in self.cps.values()
               if cp.finished and now_wall - cp.updated >= grace and cp.incarnation not in open_incs]
        if not old:
            return 0
        gone = await asyncio.to_thread(_gone, old)
        async with self._commit_lock:
            incs = [cp.incarnation for cp in gone
                    if self.cps.get(cp.incarnation) is cp and cp.finished and cp.incarnation not in self.acc.checkpoints]
            if not incs:
                return 0
            forgotten = await self.spool.forget_checkpoints(incs)
        for inc in forgotten:
            self._unindex_cp(inc)
        if forgotten:
            self.events.checkpoints_forgotten(len(forgotten), len(self.cps))
        return len(forgotten)

    # ================================================================ committing

    def should_commit(self) -> bool:
        acc = self.acc
        if acc.empty():
            return False
        out = self.cfg.output
        if acc.events >= out.bulk_max_events or acc.nbytes >= out.bulk_max_bytes:
            return True
        if self.backlog and acc.events >= out.bulk_max_events * FULL_ENOUGH:
            return True        # behind: a nearly full record goes rather than a few more lines in a second body
        if self.committing:
            return False       # the record being written goes first; this one keeps filling meanwhile
        age = self.clock.monotonic() - acc.started
        if (acc.events and self.in_flight < out.max_in_flight and not self.outbox and not self.backlog
                and self.clock.monotonic() - self._last_commit_at >= out.flush_min_interval_s):
            # caught up and a request slot is free: send now rather than wait for a timer, but at most
            # one partial record per flush_min_interval: a writer that appends line by line (pino's
            # default) would otherwise cost a request, a spool transaction and an ack per line
            return True
        return age >= out.flush_interval_s

    @property
    def committing(self) -> bool:
        """A record is being written (or waits to be): the accumulator alone does not show everything read."""
        return bool(self._writes)

    async def commit(self, wait: bool = True) -> None:
        """Write the accumulator as one record with its checkpoints (one transaction), then hand it to the senders.

        With wait=False (the reader) only the hand-over is awaited: the record is grouped,
        compressed and written on the spool thread while the loop reads the next one. Records
        are written one at a time, in order (each write holds the lock; asyncio's lock is FIFO),
        and up to WRITES_BEHIND of them may wait behind the reader: one record's write stalled
        by a busy GIL or a slow disk does not stop reading. A failure to write is raised by the
        next commit, and no later record is written after it (its checkpoints would skip lines).
        wait=True returns when this record and every one before it is queued for the senders.
        """
        if self._write_error is not None:
            raise self._write_error
        while len(self._writes) >= WRITES_BEHIND:
            await self._await_write(self._writes[0][1])
        acc = self.acc
        if acc.empty():
            if wait and self._writes:
                await self._await_write(self._writes[-1][1])
            return
        self.acc = Accumulator()
        self._last_commit_at = self.clock.monotonic()
        task = asyncio.ensure_future(self._write_record(acc))
        task.add_done_callback(_retrieve)       # a failure is raised through _write_error, by every later commit
        self._writes.append((acc, task))
        self._show_writing()
        if wait:
            await self._await_write(task)

    async def _await_write(self, task: asyncio.Future[None]) -> None:
        """Wait for a record's write. Shielded: the record holds lines taken from the accumulator and
        nowhere else, so a cancelled caller (pipe interrupted, reader cancelled at stop) must not
        cancel its write; it goes on, and the next commit raises its failure."""
        await asyncio.shield(task)

    def _show_writing(self) -> None:
        """`_writing` (what status counts as read but not queued) covers every record being written or waiting."""
        if not self._writes:
            self._writing = None
        elif len(self._writes) == 1:
            self._writing = self._writes[0][0]
        else:
            merged = Accumulator()
            for acc, _ in self._writes:
                for inc, (start, end) in acc.covers.items():
                    cur = merged.covers.get(inc)
                    merged.covers[inc] = [start, end] if cur is None else [min(cur[0], start), max(cur[1], end)]
            self._writing = merged

    async def _write_record(self, acc: Accumulator) -> None:
        """commit()'s second half, in order under the lock: the spool transaction, then the outbox."""
        try:
            async with self._commit_lock:
                if self._write_error is not None:
                    raise self._write_error       # an earlier record was not written: neither is this one
                try:
                    await self._store_record(acc)
                except BaseException as e:
                    self._write_error = e
                    raise
        finally:
            if self._writes and self._writes[0][0] is acc:
                self._writes.popleft()
            else:
                self._writes = deque(w for w in self._writes if w[0] is not acc)
            self._show_writing()
            if not self.acc.empty():
                self.wake.set()     # what was read meanwhile may go now (should_commit held it back)

    async def _store_record(self, acc: Accumulator) -> None:
        out = self.cfg.output
        covers = {k: (v[0], v[1]) for k, v in acc.covers.items()}
        # a full disk waits here (logged once): reading pauses with it, the files are the buffer
        parts, max_events, max_bytes = acc.parts, out.bulk_max_events, out.bulk_max_bytes
        records = await self._spool_write(self.spool.commit, lambda: _group(parts, max_events, max_bytes), covers,
                                          list(acc.checkpoints.values()), out.compression == "gzip")
        for cp in acc.checkpoints.values():
            self._index_cp(cp)
        for meta, stored in records:
            self.queue_events += meta.events
            self.queue_bytes += meta.stored_bytes
            # only what the senders take next stays in memory: a backlog (slow output) is re-read
            # from the spool when its turn comes, so memory stays flat however long the queue
            if len(self.outbox) < out.max_in_flight and self.cached_bytes + len(stored) <= BODY_CACHE_BYTES:
                self.outbox.append((meta, stored))
                self.cached_bytes += len(stored)
            else:
                self.outbox.append((meta, None))
            self.events.events_queued(meta.events, meta.stored_bytes)
        if records:
            self.outbox_ready.set()
            self.events.queue_state(self.queue_events, self.queue_bytes)

    # ================================================================ sending side

    @property
    def output_up(self) -> bool:
        return self.shipping.up

    @property
    def last_error(self) -> str | None:
        return self.shipping.last_error

    @property
    def last_success(self) -> float:
        return self.shipping.last_success

    async def sender(self) -> None:
        """A worker: takes records from the outbox and delivers each until every item is acked or
        dead-lettered. `max_in_flight` workers run; ship/sender.py decides how many may post at once."""
        while True:
            await self._dlq_requests()
            # a record wakes one idle sender, not all of them (each woken one would only wait again)
            async with self._idle_sender:
                while not self.outbox:
                    self.outbox_ready.clear()
                    if self.reading_done and self.acc.empty() and not self.committing:
                        return
                    if not await _wait(self.outbox_ready, DLQ_CHECK_S):
                        await self._dlq_requests()
                meta, body = self.outbox.popleft()
            if body is not None:
                self.cached_bytes -= len(body)
            self.in_flight += 1
            try:
                if body is None:
                    body = await self.spool.read(meta.seq)
                if body is None:
                    log.error("queue record missing", extra={"seq": meta.seq})
                    self.queue_events -= meta.events
                    self.queue_bytes -= meta.stored_bytes
                    continue
                dead = await self.shipping.deliver(Attempt(body, meta.gzipped, meta.events))
                await self._ack(meta, dead)
            finally:
                self.in_flight -= 1
                if not self.acc.empty():
                    self.wake.set()     # a record held back for a free slot may go now (nothing else waits on an ack)

    async def _spool_write(self, fn: Any, *args: Any) -> Any:
        """A spool write that waits out a full disk: logged once per episode, retried, never dropped.
        SQLite rolls a failed transaction back, so the queue stays as it was before the attempt."""
        while True:
            try:
                result = await fn(*args)
            except SpoolFullError as e:
                if not self._spool_full:
                    self._spool_full = True
                    self.events.spool_error(str(e))
                if self.give_up_at is not None and self.clock.monotonic() >= self.give_up_at:
                    raise          # stopping: what was not written is read again at the next start
                await self.clock.sleep(1.0)
                continue
            if self._spool_full:
                self._spool_full = False
                self.events.info("spool writable again")
            return result

    async def _ack(self, meta: RecordMeta, dead: list[DeadLetter]) -> None:
        await self._spool_write(self.spool.ack, meta.seq, dead)
        self.queue_events -= meta.events
        self.queue_bytes -= meta.stored_bytes
        delivered = meta.events - len(dead)
        self.shipped_total += delivered
        self.events.batch_acked(meta.seq, delivered, len(dead))
        if dead:
            self.events.dead_lettered(len(dead), dead[0].reason)
        self.events.queue_state(self.queue_events, self.queue_bytes)
        if self.paused and self._has_space():
            self.space.set()

    def _has_space(self) -> bool:
        """Paused reading resumes below RESUME_FRACTION of queue.max_bytes, not just under it, so a
        slow output does not flip reading on and off at every ack."""
        return self.queue_bytes <= self.cfg.queue.max_bytes * RESUME_FRACTION

    async def _dlq_requests(self) -> None:
        """`shipper dlq replay|purge` while the daemon runs: the command leaves a request file in
        state_dir; one worker claims it (rename), acts through the spool thread, and answers."""
        now = self.clock.monotonic()
        if now < self._next_dlq_check:
            return
        self._next_dlq_check = now + DLQ_CHECK_S
        request = await asyncio.to_thread(dlq_claim, self.cfg.state_dir)
        if request is None:
            return
        action, nonce, claimed = request
        count = 0
        if action == "replay":
            out = self.cfg.output

            def bodies(items: list[dict[str, Any]]) -> list[tuple[bytes, int]]:
                return bulkproto.dead_letter_bodies(items, out.bulk_max_events, out.bulk_max_bytes)

            records = await self._spool_write(self.spool.replay_dead_letters, bodies, out.compression == "gzip")
            for rmeta, stored in records:
                count += rmeta.events
                self.queue_events += rmeta.events
                self.queue_bytes += rmeta.stored_bytes
                self.outbox.append((rmeta, None))
            if records:
                self.outbox_ready.set()
                self.events.queue_state(self.queue_events, self.queue_bytes)
        elif action == "purge":
            count = await self._spool_write(self.spool.purge_dead_letters)
        self.events.info("dead letters " + ("re-queued" if action == "replay" else "purged"), count=count)
        await asyncio.to_thread(dlq_answer, self.cfg.state_dir, claimed, nonce, action, count)

    # ================================================================ the loops

    async def reader(self) -> None:
        """Scan, read, commit; sleep only when there is nothing to read, until inotify or the poll tick wakes us."""
        scan_every = min((i.scan_interval_s for i in self.cfg.inputs), default=10.0)
        next_scan = 0.0
        loop = asyncio.get_running_loop()
        self._watcher = discovery.Watcher(loop, self.wake)
        try:
            await asyncio.to_thread(self._watcher.watch, self.cfg.inputs)
        except Exception as e:  # watching is an optimisation; the rescan is the truth
            log.warning("file watching unavailable, relying on rescans", extra={"error": str(e)})
        last_check = 0.0
        clean_every = min(300.0, max(0.5, self.clean_removed_after_s / 2))
        next_clean = self.clock.monotonic() + clean_every
        while not self.stopping:
            now = self.clock.monotonic()
            w = self._watcher
            # a full rescan on schedule, or soon after inotify saw something created or moved in
            wanted = self._rescan_soon or (w is not None and w.scan_wanted)
            # the gap grows with what a rescan costs (10,000 files: ~0.15 s), so a directory where
            # files keep appearing cannot keep a core busy globbing; a new file is found within ~1 s
            gap = min(1.0, max(RESCAN_MIN_GAP_S, 3 * self._scan_cost_s))
            if now >= next_scan or (wanted and now - self._last_scan >= gap):
                if w is not None:
                    w.scan_wanted = False
                self._rescan_soon = False
                await self.rescan()
                self.scanned.set()
                next_scan = self.clock.monotonic() + scan_every
            else:
                if w is not None:
                    self._recheck_modified(w.take_modified())
                if self.waiting:
                    await self.open_waiting()
            if now >= next_clean:
                await self.clean_checkpoints()
                next_clean = self.clock.monotonic() + clean_every
            if self.queue_bytes >= self.cfg.queue.max_bytes or (self.paused and not self._has_space()):
                if not self.paused:
                    self.paused = True
                    self.events.backpressure(True, self.queue_bytes)
                if self.should_commit():
                    await self.commit()
                self.space.clear()
                try:
                    await asyncio.wait_for(self.space.wait(), timeout=POLL_S * 4)
                except asyncio.TimeoutError:
                    pass
                continue
            if self.paused:
                self.paused = False
                self.events.backpressure(False, self.queue_bytes)
            self.wake.clear()
            progressed = self.read_round()
            self.flush_multiline()
            if self.should_commit():
                await self.commit(wait=False)    # written on the spool thread while we read on
            now = self.clock.monotonic()
            if not progressed or now - last_check >= POLL_S:
                self.check_sources()
                last_check = now
            if progressed and self.backlog:
                await asyncio.sleep(0)       # more to read: let senders and acks run between chunks
                continue
            # every source read got less than it asked for (at its end): the next bytes come with
            # an inotify wake-up (or the poll tick), so no second read at the end before waiting
            timeout = POLL_S
            gap = self.cfg.output.flush_min_interval_s
            pace = self._last_commit_at + gap - now
            if not self.acc.empty():
                timeout = min(timeout, max(0.005, self.acc.started + self.cfg.output.flush_interval_s - now))
                if pace > 0:
                    timeout = min(timeout, pace)      # held back by the gap only: goes when it ends
            if await _wait(self.wake, timeout):
                pace = self._last_commit_at + gap - self.clock.monotonic()
                if pace > 0 and not self.stopping:
                    await self._pace(pace)

    async def _pace(self, seconds: float) -> None:
        """Written to within flush_min_interval of the last record: read it all when the interval
        ends, not write by write. The watcher is not read meanwhile (its events merge in the kernel)."""
        w = self._watcher
        if w is not None:
            w.pause()
        try:
            await self.clock.sleep(seconds)
        finally:
            if w is not None:
                w.resume()

    async def stop_reading(self) -> None:
        """Stop reading: queue the last complete lines with their offsets (one final commit)."""
        self.stopping = True
        if self._watcher is not None:
            await asyncio.to_thread(self._watcher.stop)
        self.read_deleted_to_end()
        # a full disk must not hold the stop past shutdown_timeout: an uncommitted accumulator
        # moved no checkpoint, so its lines are simply read again at the next start
        self.give_up_at = self.clock.monotonic() + self.cfg.shutdown_timeout_s
        try:
            await self.commit()
        except SpoolFullError:
            log.error("final commit abandoned: state_dir is full; the lines are read again at the next start")
        self.reading_done = True
        self.outbox_ready.set()

    async def drain(self, timeout_s: float) -> bool:
        """Wait until every queued record is acknowledged, at most timeout_s. True if all were."""
        deadline = time.monotonic() + timeout_s
        while (self.outbox or self.in_flight) and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        return not self.outbox and not self.in_flight

    def close_files(self) -> None:
        for src in self.sources.values():
            src.harvester.close()
        self.sources.clear()

    # ================================================================ status

    def file_status(self) -> list[dict[str, Any]]:
        shipped = self._shipped_offsets()
        out = []
        for src in self.sources.values():
            h = src.harvester
            cp = src.checkpoint
            size = h.size
            if not h.compressed and h.fd >= 0:
                # the size the last read saw is stale while reading is paused (backpressure, a full
                # disk): the file's own says how far behind we really are
                try:
                    size = max(size, os.fstat(h.fd).st_size)
                except OSError:
                    pass
            out.append({"path": h.path, "inode": h.inode, "incarnation": cp.incarnation,
                        "offset": shipped.get(cp.incarnation, cp.offset), "queued_offset": cp.offset,
                        "size": size, "lag_bytes": max(0, size - shipped.get(cp.incarnation, cp.offset)),
                        "state": "copy" if src.role == "copy" else h.state})
        return out

    def _shipped_offsets(self) -> dict[str, int]:
        """Per incarnation: the lowest start of a range not yet acknowledged. The spool's pending
        records include those in flight (the outbox does not); the accumulator holds what is read
        but not yet queued. list() copies the dict in one step: the spool thread pops acked seqs."""
        out: dict[str, int] = {}
        for meta in list(self.spool._spool.pending.values()):   # TODO(#13): stop-gap, reads the spool thread's dict
            for inc, (start, _end) in meta.covers.items():
                if inc not in out or start < out[inc]:
                    out[inc] = start
        for acc in (self._writing, self.acc):
            if acc is None:
                continue
            for inc, (start, _end) in list(acc.covers.items()):
                if inc not in out or start < out[inc]:
                    out[inc] = start
        return out

    def bytes_at_risk(self) -> int:
        """Unread bytes that no path names any more: files renamed or deleted while open, and the
        rotated copies being read for a truncated incarnation. Lost if the process died now and
        the copies were removed before it came back."""
        return sum(max(0, s.harvester.size - s.harvester.position) for s in self.sources.values()
                   if s.role == "copy" or s.harvester.state in ("renamed", "deleted"))


async def _wait(event: asyncio.Event, timeout_s: float) -> bool:
    """event.wait() for at most timeout_s; True if it was set. A timer on the waiting task, where
    asyncio.wait_for (3.11) also makes a Task and a waiter future per call: ~1,000 waits/s here."""
    if event.is_set():
        return True
    try:
        async with asyncio.timeout(timeout_s):
            await event.wait()
    except TimeoutError:
        return False
    return True


def _retrieve(task: asyncio.Future[None]) -> None:
    """Mark a record write's failure as seen (commit() raises it via _write_error)."""
    if not task.cancelled():
        task.exception()


def _group(parts: list[bytes], max_events: int, max_bytes: int) -> list[tuple[bytes, int]]:
    """Bulk pairs -> bodies of at most max_events pairs and about max_bytes (one join each)."""
    n = len(parts)
    if n <= max_events:
        body = b"".join(parts)
        if len(body) <= max_bytes:
            return [(body, n)] if n else []
    out: list[tuple[bytes, int]] = []
    start = 0
    while start < n:
        end = min(n, start + max_events)
        size = 0
        for i in range(start, end):
            size += len(parts[i])
            if size > max_bytes and i > start:
                end = i
                break
        out.append((b"".join(parts[start:end]), end - start))
        start = end
    return out


def _disk_stat(fd: int) -> tuple[int, int]:
    try:
        st = os.fstat(fd)
    except OSError:
        return -1, -1
    return st.st_size, st.st_mtime_ns


def _open_batch(cands: list[Candidate]) -> list[tuple[int, os.stat_result, bytes, GzipReader | None] | None]:
    """Open files and read their first bytes (through gzip for compressed ones), off the loop."""
    out: list[tuple[int, os.stat_result, bytes, GzipReader | None] | None] = []
    for c in cands:
        opened = open_file(c.path)
        if opened is None:
            out.append(None)
            continue
        fd, st = opened
        gz = None
        try:
            if c.why == "gz" or (c.why in ("glob", "successor") and identity.is_compressed(c.path)):
                gz = GzipReader(fd)
                head = gz.read(identity.FP_MAX_BYTES)
            else:
                head = os.pread(fd, identity.FP_MAX_BYTES, 0)
        except (OSError, EOFError, zlib.error):
            _close_file(fd, gz)
            out.append(None)
            continue
        out.append((fd, st, head, gz))
    return out


def _close_file(fd: int, gz: GzipReader | None) -> None:
    """Close a file `_open_batch` opened (and its gzip reader)."""
    if gz is not None:
        gz.close()
    os.close(fd)


def _close_opened(job: asyncio.Future[list[tuple[int, os.stat_result, bytes, GzipReader | None] | None]]) -> None:
    """Close what an `_open_batch` nobody waits for any more opened."""
    if job.cancelled() or job.exception() is not None:
        return
    for res in job.result():
        if res is not None:
            _close_file(res[0], res[3])


class _Surroundings:
    """One look around, off the loop: directory listings and rotated siblings' heads, each read once."""

    def __init__(self) -> None:
        self._listings: dict[str, list[str]] = {}
        self._looked: dict[str, identity.Sibling | None] = {}

    def rotated(self, path: str) -> list[str]:
        """The rotated siblings' paths of `path` (app.log.1, app.log-20260101.gz, ...)."""
        d = os.path.dirname(path)
        names = self._listings.get(d)
        if names is None:
            try:
                names = os.listdir(d or ".")
            except OSError:
                names = []
            self._listings[d] = names
        return list(identity.rotated_siblings(path, names))

    def look(self, path: str) -> identity.Sibling | None:
        if path not in self._looked:
            self._looked[path] = identity.look_at(path)
        return self._looked[path]


def _locate(cps: list[Checkpoint], cache: dict[str, tuple[str, int, int, int]]
            ) -> list[tuple[Checkpoint, tuple[identity.Kind, identity.Sibling] | None, list[identity.Sibling]] | None]:
    """Off the loop: for each incarnation, its rotated siblings and which of them holds it.
    None for one whose remembered place (`cache`: path, inode, size, mtime) has not changed."""
    around = _Surroundings()
    out: list[tuple[Checkpoint, tuple[identity.Kind, identity.Sibling] | None, list[identity.Sibling]] | None] = []
    for cp in cps:
        c = cache.get(cp.incarnation)
        if c is not None:
            try:
                st = os.stat(c[0])
                if (st.st_ino, st.st_size, st.st_mtime_ns) == c[1:]:
                    out.append(None)
                    continue
            except OSError:
                pass
        sibs = [s for s in map(around.look, around.rotated(cp.path)) if s is not None]
        found = identity.find_incarnation(cp.path, cp.dev, cp.inode, cp.fp_len, cp.fp, cp.offset, sibs)
        out.append((cp, found, sibs))
    return out


def _list_siblings(paths: dict[str, float]) -> dict[str, list[identity.Sibling]]:
    """Off the loop: the rotated siblings of each path changed after its time, with their heads
    (the older ones are only stat'ed)."""
    out: dict[str, list[identity.Sibling]] = {}
    around = _Surroundings()
    for path, since in paths.items():
        sibs = []
        for p in around.rotated(path):
            try:
                if os.stat(p).st_mtime <= since - MTIME_SLACK_S:
                    continue
            except OSError:
                continue
            s = identity.look_at(p)
            if s is not None:
                sibs.append(s)
        out[path] = sibs
    return out


def _gone(cps: list[Checkpoint]) -> list[Checkpoint]:
    """Off the loop: the incarnations whose content is nowhere any more (not at their path, not
    among its rotated siblings, renamed or copied or compressed)."""
    out = []
    around = _Surroundings()
    for cp in cps:
        try:
            st = os.stat(cp.path)
            if (st.st_dev, st.st_ino) == (cp.dev, cp.inode):
                continue
        except OSError:
            pass
        present = False
        for p in around.rotated(cp.path):
            s = around.look(p)
            if s is not None and identity.classify(s, cp.dev, cp.inode, cp.fp_len, cp.fp) is not None:
                present = True
                break
        if not present:
            out.append(cp)
    return out


def _last_newline_end(fd: int, size: int) -> int:
    """Offset just past the last newline before size (0 if none in the last 1 MiB)."""
    start = max(0, size - 1024 * 1024)
    data = os.pread(fd, size - start, start)
    nl = data.rfind(b"\n")
    return start + nl + 1 if nl >= 0 else start if start else 0
