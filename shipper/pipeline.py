"""The running pipeline: sources (harvester + parser per file) -> accumulator -> spool -> senders.

Reading, committing and sending overlap: while one record is committed on the spool thread the
loop keeps reading into the next, and a record goes out as soon as a request slot is free.
`flush_interval` only bounds how long a partial record waits while every slot is busy.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import random
import socket
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from shipper.clock import Clock
from shipper.config import Config, InputConfig
from shipper.errors import SpoolFullError
from shipper.events import Events
from shipper.model import Checkpoint, DeadLetter, Line
from shipper.parse.document import DocBuilder
from shipper.ship import bulk as bulkproto
from shipper.ship.sender import Attempt, Sender
from shipper.spool import AsyncSpool, RecordMeta, dlq_answer, dlq_claim
from shipper.tail import discovery, identity
from shipper.tail.harvester import CHUNK_BYTES, Harvester, open_file

log = logging.getLogger("shipper.pipeline")

POLL_S = 0.25                 # fallback look at open files when inotify said nothing
ROTATED_GRACE_S = 5.0         # a rotated-away file is kept open this long after its last growth
DELETED_GRACE_S = 1.0
BODY_CACHE_BYTES = 16 * 1024 * 1024   # record bodies kept in memory for the senders; beyond: re-read
RESUME_FRACTION = 0.75        # a paused reader resumes when the queue is below this share of max_bytes
DLQ_CHECK_S = 1.0             # how often a sender looks for a `shipper dlq replay|purge` request


@dataclass(slots=True)
class Source:
    harvester: Harvester
    input_idx: int
    builder: DocBuilder
    aggregator: Any = None          # MultilineAggregator when the input has multiline

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
        self.space = asyncio.Event()
        self.wake = asyncio.Event()
        self.stopping = False
        self.in_flight = 0
        self.queue_events = 0
        self.queue_bytes = 0
        self.cached_bytes = 0
        self.paused = False
        self.first_scan_done = False
        self.done_files: dict[tuple[int, int], int] = {}   # (dev, ino) -> size when found fully read
        self._spool_full = False
        self._next_dlq_check = 0.0
        self.read_total = 0
        self.shipped_total = 0
        self._commit_lock = asyncio.Lock()
        self._watcher: discovery.Watcher | None = None
        self._cp_index: dict[tuple[int, int], Checkpoint] = {}
        for cp in spool.spool.checkpoints.values():
            self._index_cp(cp)
        for seq in sorted(spool.spool.pending):
            meta = spool.spool.pending[seq]
            self.outbox.append((meta, None))
            self.queue_events += meta.events
            self.queue_bytes += meta.stored_bytes
        if self.outbox:
            self.outbox_ready.set()

    # ================================================================ reading side

    def _index_cp(self, cp: Checkpoint) -> None:
        key = (cp.dev, cp.inode)
        old = self._cp_index.get(key)
        if old is None or cp.updated >= old.updated:
            self._cp_index[key] = cp

    def _make_source(self, path: str, idx: int, fd: int, st: os.stat_result, cp: Checkpoint) -> Source:
        inp = self.cfg.inputs[idx]
        h = Harvester(path, fd, st, cp, inp.max_line_bytes, self.clock.monotonic())
        agg = None
        if inp.multiline is not None:
            from shipper.parse.multiline import MultilineAggregator
            agg = MultilineAggregator(inp.multiline.start, inp.multiline.max_lines, inp.multiline.timeout_s)
        return Source(h, idx, self.builders[idx], agg)

    async def rescan(self) -> None:
        """Glob every input; open new files, resuming known incarnations from their checkpoint."""
        found = await asyncio.to_thread(_scan_and_stat, self.cfg.inputs)
        for path, idx, dev, ino, size in found:
            key = (dev, ino)
            if key in self.sources:
                continue
            if self.done_files.get(key) == size:
                continue
            opened = open_file(path)
            if opened is None:
                continue
            fd, st = opened
            key = (st.st_dev, st.st_ino)
            if key in self.sources:
                os.close(fd)
                continue
            cp = self._cp_index.get(key)
            resume = False
            if cp is not None and identity.matches(fd, cp.fp_len, cp.fp) and cp.offset <= st.st_size:
                if cp.fp_len or st.st_size >= cp.offset:
                    resume = True
            if resume and cp is not None:
                if cp.offset >= st.st_size and cp.finished:
                    os.close(fd)
                    self.done_files[key] = st.st_size
                    continue
                cp = dataclasses.replace(cp, path=path, finished=False)
            else:
                fp_len, fp = identity.fingerprint_fd(fd, st.st_size)
                start = st.st_size if (self.cfg.inputs[idx].start_at == "end" and not self.first_scan_done) else 0
                if start:
                    # start at the end of the last complete line
                    start = _last_newline_end(fd, st.st_size)
                cp = Checkpoint(identity.new_incarnation(), path, st.st_dev, st.st_ino, fp_len, fp, start,
                                st.st_size, time.time())
                self.acc.checkpoints[cp.incarnation] = dataclasses.replace(cp)
            self._index_cp(cp)
            src = self._make_source(path, idx, fd, st, cp)
            self.sources[key] = src
            self.events.file_opened(path, st.st_ino, cp.offset, cp.incarnation)
        self.first_scan_done = True

    def read_round(self) -> bool:
        """One pass over every open source, bounded by the record limits. True if anything was read."""
        progressed = False
        max_events = self.cfg.output.bulk_max_events
        max_bytes = self.cfg.output.bulk_max_bytes
        now_wall = self.clock.time()
        now_mono = self.clock.monotonic()
        for src in list(self.sources.values()):
            h = src.harvester
            if h.fd < 0:
                continue
            budget = min(CHUNK_BYTES, max(64 * 1024, max_bytes - self.acc.nbytes))
            lines = h.read(budget)
            if not lines and h.splitter.offset == src.checkpoint.offset:
                continue
            progressed = progressed or bool(lines) or not h.at_eof
            h.last_growth = now_mono if lines else h.last_growth
            self._take(src, lines, now_wall, now_mono)
            if self.acc.events >= max_events or self.acc.nbytes >= max_bytes:
                break
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
            what = h.check(now)
            if what == "truncated":
                self._on_truncated(src)
            elif what in ("renamed", "deleted") and h.state != "active":
                self.events.file_rotated(h.path, h.inode, what)
            if h.state in ("renamed", "deleted") and h.at_eof and h.position >= h.size:
                grace = DELETED_GRACE_S if h.state == "deleted" else ROTATED_GRACE_S
                if now - h.last_growth >= grace:
                    self._finish(key, src, h.state)
            elif h.state == "active" and h.at_eof and now - h.last_growth >= self.cfg.inputs[src.input_idx].close_inactive_s:
                self._close_inactive(key, src)

    def _on_truncated(self, src: Source) -> None:
        h = src.harvester
        old = src.checkpoint
        self.events.file_truncated(h.path, h.inode, old.offset)
        done = dataclasses.replace(old, finished=True, updated=self.clock.time())
        self.acc.checkpoints[old.incarnation] = done
        if not self.acc.parts and len(self.acc.checkpoints) == 1:
            self.acc.started = self.clock.monotonic()
        try:
            size = os.fstat(h.fd).st_size
        except OSError:
            size = 0
        fp_len, fp = identity.fingerprint_fd(h.fd, size)
        cp = Checkpoint(identity.new_incarnation(), h.path, h.dev, h.inode, fp_len, fp, 0, size, time.time())
        h.restart_at_zero(cp)
        if src.aggregator is not None:
            src.aggregator.flush()   # events of the old incarnation that were held are re-read nowhere: see README
        self.acc.checkpoints[cp.incarnation] = dataclasses.replace(cp)
        self._index_cp(cp)

    def _finish(self, key: tuple[int, int], src: Source, reason: str) -> None:
        """The file will not grow again: its last partial line and held multiline event count."""
        h = src.harvester
        tail = h.flush_partial()
        if src.aggregator is not None:
            evs = []
            for ln in tail:
                evs.extend(src.aggregator.feed(ln, self.clock.monotonic()))
            evs.extend(src.aggregator.flush())
            tail = evs
        if tail:
            self._take_events(src, tail)
        else:
            src.checkpoint.offset = src.committed_offset()
        cp = src.checkpoint
        cp.finished = True
        cp.updated = self.clock.time()
        self.acc.checkpoints[cp.incarnation] = dataclasses.replace(cp)
        if not self.acc.parts and len(self.acc.checkpoints) == 1:
            self.acc.started = self.clock.monotonic()
        self.events.file_closed(h.path, h.inode, cp.offset, reason)
        h.close()
        del self.sources[key]

    def _close_inactive(self, key: tuple[int, int], src: Source) -> None:
        h = src.harvester
        if src.aggregator is not None and src.aggregator.pending_start is not None:
            return
        self.events.file_closed(h.path, h.inode, src.checkpoint.offset, "inactive")
        self.done_files[key] = h.size
        h.close()
        del self.sources[key]

    # ================================================================ committing

    def should_commit(self) -> bool:
        acc = self.acc
        if acc.empty():
            return False
        out = self.cfg.output
        if acc.events >= out.bulk_max_events or acc.nbytes >= out.bulk_max_bytes:
            return True
        age = self.clock.monotonic() - acc.started
        if acc.events and self.in_flight < out.max_in_flight and not self.outbox:
            return True        # a request slot is free: send now rather than wait for a timer
        return age >= out.flush_interval_s

    async def commit(self) -> None:
        """Write the accumulator as one record with its checkpoints (one transaction), then hand it to the senders."""
        async with self._commit_lock:
            acc = self.acc
            if acc.empty():
                return
            self.acc = Accumulator()
            bodies = _group(acc.parts, self.cfg.output.bulk_max_events, self.cfg.output.bulk_max_bytes)
            covers = {k: (v[0], v[1]) for k, v in acc.covers.items()}
            gzip = self.cfg.output.compression == "gzip"
            # a full disk waits here (logged once): reading pauses with it, the files are the buffer
            records = await self._spool_write(self.spool.spool.commit, bodies, covers,
                                              list(acc.checkpoints.values()), gzip)
            for cp in acc.checkpoints.values():
                self._index_cp(cp)
            for meta, stored in records:
                self.queue_events += meta.events
                self.queue_bytes += meta.stored_bytes
                if self.cached_bytes + len(stored) <= BODY_CACHE_BYTES:
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
            while not self.outbox:
                self.outbox_ready.clear()
                if self.stopping and self.acc.empty():
                    return
                try:
                    await asyncio.wait_for(self.outbox_ready.wait(), timeout=DLQ_CHECK_S)
                except asyncio.TimeoutError:
                    await self._dlq_requests()
            meta, body = self.outbox.popleft()
            if body is not None:
                self.cached_bytes -= len(body)
            self.in_flight += 1
            try:
                if body is None:
                    body = await self.spool.call(self.spool.spool.read, meta.seq)
                if body is None:
                    log.error("queue record missing", extra={"seq": meta.seq})
                    continue
                dead = await self.shipping.deliver(Attempt(body, meta.gzipped, meta.events))
                await self._ack(meta, dead)
            finally:
                self.in_flight -= 1
                self.wake.set()

    async def _spool_write(self, fn: Any, *args: Any) -> Any:
        """A spool write that waits out a full disk: logged once per episode, retried, never dropped.
        SQLite rolls a failed transaction back, so the queue stays as it was before the attempt."""
        while True:
            try:
                result = await self.spool.call(fn, *args)
            except SpoolFullError as e:
                if not self._spool_full:
                    self._spool_full = True
                    self.events.spool_error(str(e))
                await self.clock.sleep(1.0)
                continue
            if self._spool_full:
                self._spool_full = False
                self.events.info("spool writable again")
            return result

    async def _ack(self, meta: RecordMeta, dead: list[DeadLetter]) -> None:
        await self._spool_write(self.spool.spool.ack, meta.seq, dead)
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

            records = await self._spool_write(self.spool.spool.replay_dead_letters, bodies, out.compression == "gzip")
            for rmeta, stored in records:
                count += rmeta.events
                self.queue_events += rmeta.events
                self.queue_bytes += rmeta.stored_bytes
                self.outbox.append((rmeta, None))
            if records:
                self.outbox_ready.set()
                self.events.queue_state(self.queue_events, self.queue_bytes)
        elif action == "purge":
            count = await self._spool_write(self.spool.spool.purge_dead_letters)
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
        while not self.stopping:
            now = self.clock.monotonic()
            if now >= next_scan or (self.wake.is_set() and now - next_scan > -scan_every + 1.0):
                await self.rescan()
                next_scan = self.clock.monotonic() + scan_every
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
                await self.commit()
            now = self.clock.monotonic()
            if not progressed or now - last_check >= POLL_S:
                self.check_sources()
                last_check = now
            if progressed:
                await asyncio.sleep(0)       # let senders and acks run between chunks
                continue
            timeout = POLL_S
            if not self.acc.empty():
                timeout = min(timeout, max(0.005, self.acc.started + self.cfg.output.flush_interval_s - now))
            try:
                await asyncio.wait_for(self.wake.wait(), timeout=timeout)
            except asyncio.TimeoutError:
                pass

    async def stop_reading(self) -> None:
        """Stop reading: queue the last complete lines with their offsets (one final commit)."""
        self.stopping = True
        if self._watcher is not None:
            await asyncio.to_thread(self._watcher.stop)
        await self.commit()
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
            out.append({"path": h.path, "inode": h.inode, "incarnation": cp.incarnation,
                        "offset": shipped.get(cp.incarnation, cp.offset), "queued_offset": cp.offset,
                        "size": h.size, "lag_bytes": max(0, h.size - shipped.get(cp.incarnation, cp.offset)),
                        "state": h.state})
        return out

    def _shipped_offsets(self) -> dict[str, int]:
        """Per incarnation: the lowest start of a range not yet acknowledged. The spool's pending
        records include those in flight (the outbox does not); the accumulator holds what is read
        but not yet queued. list() copies the dict in one step: the spool thread pops acked seqs."""
        out: dict[str, int] = {}
        for meta in list(self.spool.spool.pending.values()):
            for inc, (start, _end) in meta.covers.items():
                if inc not in out or start < out[inc]:
                    out[inc] = start
        for inc, (start, _end) in list(self.acc.covers.items()):
            if inc not in out or start < out[inc]:
                out[inc] = start
        return out

    def bytes_at_risk(self) -> int:
        return sum(max(0, s.harvester.size - s.harvester.position) for s in self.sources.values()
                   if s.harvester.state in ("renamed", "deleted"))


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


def _scan_and_stat(inputs: tuple[InputConfig, ...]) -> list[tuple[str, int, int, int, int]]:
    out = []
    for path, idx in discovery.scan(inputs).items():
        try:
            st = os.stat(path)
        except OSError:
            continue
        out.append((path, idx, st.st_dev, st.st_ino, st.st_size))
    return out


def _last_newline_end(fd: int, size: int) -> int:
    """Offset just past the last newline before size (0 if none in the last 1 MiB)."""
    start = max(0, size - 1024 * 1024)
    data = os.pread(fd, size - start, start)
    nl = data.rfind(b"\n")
    return start + nl + 1 if nl >= 0 else start if start else 0
