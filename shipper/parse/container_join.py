"""Pure: one file's container records joined per stream (a Docker `log` without its final newline,
a CRI `P` tag: pieces of one record) into ContainerEvents, multiline-grouped when asked; the
caller never checkpoints past `pending_start`, so a restart joins the same. `now` only drives
the multiline timeout. Lines from tail/lines.py; records decoded by container.py."""

from __future__ import annotations

from collections import deque
from typing import Any

from shipper.config_inputs import InputConfig
from shipper.model import FLAG_CONTAINER_UNPARSED, FLAG_TRUNCATED, Held, Line
from shipper.parse.container import (
    DOCKER_HEAD,
    ContainerEvent,
    ContainerFormat,
    Record,
    decode_auto,
    decode_cri,
    decode_docker,
)
from shipper.parse.multiline import MultilineAggregator

_MAX_SPANS = 4096                     # emitted-event spans remembered while something is held


class _Held:
    """The pieces of one stream's record joined so far."""

    __slots__ = ("attrs", "end", "flags", "nbytes", "overflow", "parts", "start", "time")

    def __init__(self, start: int, end: int, text: bytes, flags: int, time: str,
                 attrs: dict[str, Any] | None) -> None:
        self.start = start
        self.end = end
        self.parts = [text]
        self.nbytes = len(text)
        self.flags = flags
        self.time = time
        self.attrs = attrs
        self.overflow = False     # bytes beyond max_line_bytes + 1 arrived (and were dropped)


class ContainerJoiner:
    """Joins the partial records of one file per stream; optional multiline per stream after it.

    `feed(line, now)` / `feed_lines(lines, now)`: physical lines in file order -> joined records
    (`ContainerEvent`), in the order they complete. `flush()`: the file will not grow again; what
    is held is complete now. `flush_due(now)` / `next_deadline`: the multiline timeout.

    `pending_start` is the offset a checkpoint may record at most (None: nothing held, the
    splitter's offset is safe). Streams interleave, so it is not simply the first held piece: it
    is the largest offset q such that every held record (or multiline event) starts at or after q
    and no record already emitted has pieces on both sides of q. Re-reading the file from there
    with a fresh joiner gives exactly the records emitted from q on (same start, so the same `_id`):
    none is split, none is lost, and the ones emitted before the crash come again identical.
    It never decreases. A record that never completes (the runtime died mid-line) waits like
    a partial line until `flush()`.

    The joined text is cut at `max_line_bytes` and flagged FLAG_TRUNCATED; the pieces after the
    cut are still consumed (their bytes are dropped as they come, never held).
    """

    def __init__(self, fmt: ContainerFormat, max_line_bytes: int, multiline_start: str | None = None,
                 multiline_max_lines: int = 500, multiline_timeout_s: float = 1.0) -> None:
        self.format = fmt
        self.max_line_bytes = max_line_bytes
        if fmt == "docker":
            self._decode: Any = decode_docker
        elif fmt == "cri":
            self._decode = decode_cri
        else:
            self._decode = decode_auto
        self._unparsed_flag = 0 if fmt == "auto" else FLAG_CONTAINER_UNPARSED
        self._held: dict[str, _Held] = {}
        self._ml_args = (multiline_start, multiline_max_lines, multiline_timeout_s)
        self._ml: dict[str, MultilineAggregator] | None = {} if multiline_start else None
        self._ml_meta: dict[str, deque[tuple[int, str, dict[str, Any] | None]]] = {}
        self._replay: tuple[int, ...] = ()         # recorded cuts, for every stream's aggregator
        self._spans: list[tuple[int, int]] = []    # (start, end) of emitted records, while anything is held
        self._guard: int | None = None            # start of a record whose last piece was cut (see _emit)
        self._cut_at: int | None = None           # start of the last line fed, when the splitter cut it
        self._floor = 0                           # the last pending_start given out
        self._dirty = True
        self._safe: int | None = None

    # ------------------------------------------------------------------ public

    @property
    def pending_start(self) -> int | None:
        if self._dirty:
            self._safe = self._compute_safe()
            self._dirty = False
        return self._safe

    @property
    def next_deadline(self) -> float | None:
        if not self._ml:
            return None
        ds = [d for agg in self._ml.values() if (d := agg.next_deadline) is not None]
        return min(ds) if ds else None

    @property
    def held_bytes(self) -> int:
        return sum(h.nbytes for h in self._held.values())

    def feed(self, line: Line, now: float) -> list[ContainerEvent]:
        """Take the next physical line of the file; return the records it completes."""
        out: list[ContainerEvent] = []
        self._feed_one(line, now, out)
        return out

    def feed_lines(self, lines: list[Line], now: float) -> list[ContainerEvent] | None:
        """`feed` for a batch. Format auto only: None when no line of the batch can be a container
        record and nothing is held or aggregated, so the caller builds `lines` as plain lines (the
        fast path, same documents as without the joiner)."""
        if self.format == "auto" and self._ml is None and not self._held and self._guard is None:
            cap = self.max_line_bytes
            for ln in lines:
                d = ln[2]
                if d[:7] == DOCKER_HEAD or (d[10:11] == b"T" and d[4:5] == b"-") or len(d) > cap:
                    break
            else:
                if lines:
                    self._cut_at = lines[-1][0] if lines[-1][0] == lines[-1][1] else None
                return None
        out: list[ContainerEvent] = []
        feed_one = self._feed_one
        if self._ml is not None:
            for ln in lines:
                feed_one(ln, now, out)
            return out
        # the usual record inline: complete in one piece, nothing held, not cut by the splitter
        decode = self._decode
        held = self._held
        cap = self.max_line_bytes
        append = out.append
        self._dirty = True
        for ln in lines:
            start, end, data, flags = ln
            if held or self._guard is not None or end == start:
                feed_one(ln, now, out)
                continue
            rec = decode(data)
            if rec is None or rec[1]:
                self._take(start, end, data, flags, rec, now, out)
                continue
            self._cut_at = None
            stream, _partial, t, text, attrs = rec
            if text[-1:] == b"\r":
                text = text[:-1]
            if len(text) > cap:
                text = text[:cap]
                flags |= FLAG_TRUNCATED
            if text:
                append((start, end, text, flags, stream, t, attrs))
        return out

    # ------------------------------------------------------------ as a file's holder (tail/fileset.Holder)

    waits_closed = True       # a partial record may wait closed: the checkpoint stays at its first piece

    def hold(self, lines: list[Line], now: float) -> Held:
        """A batch of the file's lines: the records they complete, or the lines themselves when
        none can be a record (`feed_lines`: None)."""
        records = self.feed_lines(lines, now)
        return (lines, []) if records is None else ([], records)

    def release_due(self, now: float) -> Held:
        return [], self.flush_due(now)

    def release(self, tail: list[Line], now: float) -> Held:
        """The file will not grow again: `tail` fed, then every partial record and held event."""
        recs: list[ContainerEvent] = []
        for ln in tail:
            recs.extend(self.feed(ln, now))
        return [], recs + self.flush()

    def replay(self, cuts: list[int] | tuple[int, ...]) -> None:
        """Cuts name an event's end offset, so each stream's aggregator takes them all."""
        self._replay = tuple(cuts)
        for agg in (self._ml or {}).values():
            agg.replay(cuts)

    def take_cuts(self) -> list[int]:
        return [c for agg in self._ml.values() for c in agg.take_cuts()] if self._ml else []

    def flush_due(self, now: float) -> list[ContainerEvent]:
        """Multiline events whose last line is at least the timeout old."""
        out: list[ContainerEvent] = []
        if self._ml:
            self._dirty = True
            for stream, agg in self._ml.items():
                for ev in agg.flush_due(now):
                    self._emit_final(ev, stream, out)
        return out

    def flush(self) -> list[ContainerEvent]:
        """The file will not grow again: held partial records are complete as they are, then
        the held multiline events."""
        out: list[ContainerEvent] = []
        for stream, h in sorted(self._held.items(), key=lambda kv: kv[1].start):
            del self._held[stream]
            self._complete(h, stream, 0.0, out)
        if self._ml:
            for stream, agg in self._ml.items():
                for ev in agg.flush():
                    self._emit_final(ev, stream, out)
        self._guard = None
        self._cut_at = None
        self._dirty = True
        return out

    # ------------------------------------------------------------------ internals

    def _feed_one(self, line: Line, now: float, out: list[ContainerEvent]) -> None:
        start, end, data, flags = line
        self._take(start, end, data, flags, self._decode(data), now, out)

    def _take(self, start: int, end: int, data: bytes, flags: int, rec: Record | None, now: float,
              out: list[ContainerEvent]) -> None:
        """One physical line and what it decodes to (None: no record of the format)."""
        self._dirty = True
        if self._guard is not None and start > (self._cut_at or 0):
            self._guard = None          # the splitter has passed the cut line: its end is behind us
        self._cut_at = start if end == start else None
        if rec is None:
            cap = self.max_line_bytes
            if len(data) > cap:
                data = data[:cap]
                flags |= FLAG_TRUNCATED
            self._to_multiline((start, end, data, flags | self._unparsed_flag), "", "", None, now, out)
            return
        stream, partial, t, text, attrs = rec
        h = self._held.get(stream)
        if h is None:
            if partial:
                h = self._held[stream] = _Held(start, end, text, flags, t, attrs)
                self._cap_held(h)
                return
            # the usual record: complete in one piece
            if text[-1:] == b"\r":
                text = text[:-1]
            if len(text) > self.max_line_bytes:
                text = text[:self.max_line_bytes]
                flags |= FLAG_TRUNCATED
            self._to_multiline((start, end, text, flags), stream, t, attrs, now, out)
            return
        h.end = end
        h.flags |= flags
        if not h.overflow:
            h.parts.append(text)
            h.nbytes += len(text)
            self._cap_held(h)
        if not partial:
            del self._held[stream]
            self._complete(h, stream, now, out)

    def _cap_held(self, h: _Held) -> None:
        """Keep at most max_line_bytes + 1 bytes (the one more may be a final \\r that is stripped)."""
        keep = self.max_line_bytes + 1
        if h.nbytes > keep:
            joined = b"".join(h.parts)[:keep]
            h.parts = [joined]
            h.nbytes = keep
            h.overflow = True

    def _complete(self, h: _Held, stream: str, now: float, out: list[ContainerEvent]) -> None:
        data = h.parts[0] if len(h.parts) == 1 else b"".join(h.parts)
        flags = h.flags
        if data[-1:] == b"\r" and not h.overflow:
            data = data[:-1]
        if len(data) > self.max_line_bytes or h.overflow:
            data = data[:self.max_line_bytes]
            flags |= FLAG_TRUNCATED
        self._to_multiline((h.start, h.end, data, flags), stream, h.time, h.attrs, now, out)

    def _to_multiline(self, joined: Line, stream: str, t: str, attrs: dict[str, Any] | None, now: float,
                      out: list[ContainerEvent]) -> None:
        ml = self._ml
        if ml is None:
            self._emit(joined, stream, t, attrs, out)
            return
        agg = ml.get(stream)
        if agg is None:
            start_re, max_lines, timeout_s = self._ml_args
            agg = ml[stream] = MultilineAggregator(start_re or "", max_lines, timeout_s)
            if self._replay:
                agg.replay(self._replay)
            self._ml_meta[stream] = deque()
        self._ml_meta[stream].append((joined[0], t, attrs))
        for ev in agg.feed(joined, now):
            self._emit_final(ev, stream, out)
        if agg.pending_start is None:
            # a blank record with nothing pending is no event; its bytes still form a span
            self._note_span(joined[0], joined[1])
            self._ml_meta[stream].clear()

    def _emit_final(self, ev: Line, stream: str, out: list[ContainerEvent]) -> None:
        """A multiline event completed: its runtime time and attrs are its first record's."""
        meta = self._ml_meta[stream]
        start = ev[0]
        while meta and meta[0][0] < start:
            meta.popleft()
        t: str = ""
        attrs = None
        if meta and meta[0][0] == start:
            _s, t, attrs = meta.popleft()
        self._emit(ev, stream, t, attrs, out)

    def _emit(self, ev: Line, stream: str, t: str, attrs: dict[str, Any] | None,
              out: list[ContainerEvent]) -> None:
        start, end, data, flags = ev
        self._note_span(start, end)
        if self._cut_at is not None and start < self._cut_at and end == self._cut_at:
            # its last piece was cut by the splitter, which stays at that piece until its newline:
            # re-reading from there would give that piece as a record of its own
            self._guard = start
        if data:
            out.append((start, end, data, flags, stream, t, attrs))

    def _note_span(self, start: int, end: int) -> None:
        if end - start > 0 and (self._held or self._ml or self._guard is not None):
            spans = self._spans
            spans.append((start, end))
            if len(spans) > _MAX_SPANS:
                # conservative: one span over the oldest half (a checkpoint further back, never wrong)
                spans.sort()
                half = spans[:_MAX_SPANS // 2]
                merged = (half[0][0], max(e for _s, e in half))
                self._spans = [merged] + spans[_MAX_SPANS // 2:]

    def _compute_safe(self) -> int | None:
        held = [h.start for h in self._held.values()]
        if self._ml:
            held += [p for agg in self._ml.values() if (p := agg.pending_start) is not None]
        if self._guard is not None:
            held.append(self._guard)
        if not held:
            self._spans.clear()
            return None
        q = min(held)
        spans = sorted(self._spans, reverse=True)
        for s, e in spans:
            if s < q < e:
                q = s
        q = max(q, self._floor)       # the last answer is still safe (nothing read since starts before it)
        self._floor = q
        self._spans = [(s, e) for s, e in spans if e > q]
        return q


def joiner_for(inp: InputConfig) -> ContainerJoiner:
    """The joiner of an input's files (format docker or cri; auto once a file shows a record), with
    its multiline after it."""
    m = inp.multiline
    fmt: ContainerFormat = "docker" if inp.format == "docker" else "cri" if inp.format == "cri" else "auto"
    if m is None:
        return ContainerJoiner(fmt, inp.max_line_bytes)
    return ContainerJoiner(fmt, inp.max_line_bytes, m.start, m.max_lines, m.timeout_s)


def holder_for(inp: InputConfig, cuts: list[int] | tuple[int, ...] = ()) -> ContainerJoiner | MultilineAggregator | None:
    """What holds a file's lines of this input until they are events: the joiner of a container
    format, multiline, or nothing (format auto gets its joiner when a file shows a record).
    `cuts`: where an earlier read of the file completed events by time, above where this one
    begins (`Checkpoint.cuts`): this read cuts there too."""
    h: ContainerJoiner | MultilineAggregator | None
    if inp.format == "docker" or inp.format == "cri":
        h = joiner_for(inp)
    else:
        m = inp.multiline
        h = None if m is None else MultilineAggregator(m.start, m.max_lines, m.timeout_s)
    if h is not None and cuts:
        h.replay(cuts)
    return h
