"""Pure: container runtimes' log lines (Docker json-file, CRI) -> joined records with stream and time.

Physical lines of one file come from `tail/lines.py` in file order; joined records go to
`document.py` (`DocBuilder.build_container`). No I/O and no clock: `now` is passed in and only
drives the multiline timeout. Partial records (Docker: `log` without its final `\\n`; CRI: tag `P`)
are joined per stream until the record that completes them; the caller never checkpoints past
`pending_start`, so a restart re-reads the first piece and the join comes out identical.
"""

from __future__ import annotations

import calendar
import re
from collections import deque
from datetime import datetime
from typing import Any, Literal

import orjson

from shipper.model import FLAG_CONTAINER_UNPARSED, FLAG_TRUNCATED, Line
from shipper.parse.multiline import MultilineAggregator

__all__ = ["ContainerEvent", "ContainerFormat", "ContainerJoiner", "Record", "decode_cri", "decode_docker",
           "is_container_record", "looks_like_container", "parse_rfc3339", "path_metadata", "physical_max_line_bytes"]

ContainerFormat = Literal["docker", "cri", "auto"]

# One physical record, decoded: (stream, is_partial, runtime time, text, docker attrs).
# The time is the runtime's RFC 3339 text as written (`parse_rfc3339` gives epoch seconds; it is
# parsed only for a document whose line has no time of its own, most pino lines have one).
# `text` is the record's bytes without the newline that ends a complete Docker record.
Record = tuple[str, bool, str, bytes, "dict[str, Any] | None"]

# A joined record (what `feed` returns): (start, end, data, flags, stream, time, attrs).
# start/end/data/flags as in a `Line`: start is the first piece's start, end the last piece's end,
# data the joined text (without its newline or a final \r), flags FLAG_*. stream is "stdout" or
# "stderr"; "" for a line that is no container record (format auto: a plain line of the file, parsed
# as usual; docker/cri: a line flagged FLAG_CONTAINER_UNPARSED), then time is "" (no runtime time).
# time: the first piece's runtime time text (see `Record`).
ContainerEvent = tuple[int, int, bytes, int, str, str, "dict[str, Any] | None"]

STREAMS = ("stdout", "stderr")
DOCKER_PIECE_BYTES = 16 * 1024        # dockerd's copier cuts a line into pieces of this many raw bytes
_DOCKER_HEAD = b'{"log":'             # dockerd writes `log` first (jsonlog.JSONLogs.MarshalJSONBuf)
_MAX_SPANS = 4096                     # emitted-event spans remembered while something is held

_loads = orjson.loads
_JSONDecodeError = orjson.JSONDecodeError


def physical_max_line_bytes(fmt: str, max_line_bytes: int) -> int:
    """The cap the line splitter should use for an input of this format.

    A record's envelope (the JSON around `log`, the CRI header) must survive the splitter's cut,
    so the joiner can still decode a piece and cut the joined text at `max_line_bytes` itself.
    A Docker piece is 16 KiB of raw bytes, up to 6x that once escaped (`\\u0000`); a CRI piece is
    the text after a header of at most ~50 bytes, and its text may be cut (the tag comes first).
    """
    if fmt == "cri":
        return max_line_bytes + 256
    if fmt in ("docker", "auto"):
        return max(max_line_bytes + 256, 6 * DOCKER_PIECE_BYTES + 1024)
    return max_line_bytes


# ----------------------------------------------------------------------------- time

_SECONDS: dict[str, int] = {}
_POW10: list[int] = [10 ** i for i in range(40)]


def parse_rfc3339(text: str) -> float | None:
    """Epoch seconds of an RFC 3339 time as the runtimes write it (`2026-12-01T10:00:00.123456789Z`,
    Go's RFC3339Nano: 0-9 fraction digits; CRI-O: `+00:00`); None for anything else (also "")."""
    sec = _SECONDS.get(text[:19])
    if sec is not None and text[-1] == "Z":
        # the usual case: a second seen before (its 19 characters are checked), UTC
        rest = text[19:-1]
        if not rest:
            return float(sec)
        digits = rest[1:]
        if rest[0] == "." and digits.isdigit() and digits.isascii():
            return sec + int(digits) / _POW10[len(digits)]
    n = len(text)
    if n < 20 or text[4] != "-" or text[7] != "-" or text[10] not in "Tt" or text[13] != ":" or text[16] != ":":
        return None
    last = text[-1]
    if last == "Z" or last == "z":
        zone_s = 0
        body = n - 1
    elif n >= 25 and text[-3] == ":" and text[-6] in "+-":
        hh, mm = text[-5:-3], text[-2:]
        if not (hh.isdigit() and mm.isdigit() and hh.isascii() and mm.isascii()):
            return None
        zone_s = int(hh) * 3600 + int(mm) * 60
        if text[-6] == "-":
            zone_s = -zone_s
        body = n - 6
    else:
        return None
    frac = 0.0
    if body != 19:
        digits = text[20:body]
        if text[19] != "." or not digits or not digits.isdigit() or not digits.isascii():
            return None
        if len(digits) >= len(_POW10):
            return None
        frac = int(digits) / _POW10[len(digits)]
    head = text[:19]
    sec = _SECONDS.get(head)
    if sec is None:
        if not (head[:4] + head[5:7] + head[8:10] + head[11:13] + head[14:16] + head[17:19]).isdigit() \
                or not head.isascii():
            return None
        try:
            sec = calendar.timegm(datetime.fromisoformat(head).timetuple())
        except ValueError:
            return None
        if len(_SECONDS) >= 4096:
            _SECONDS.clear()
        _SECONDS[head] = sec
    return sec - zone_s + frac


# ----------------------------------------------------------------------------- decoding

def decode_docker(data: bytes) -> Record | None:
    """One line of Docker's json-file driver, or None when it is not one.

    A record is a JSON object with `log` (text), `stream` (stdout/stderr) and `time` (text; an
    unparseable one gives the read time later); `attrs` (the `--log-opt labels/env/tag` values) is
    kept when it is an object. Bytes that are not UTF-8 (dockerd itself writes U+FFFD for them)
    are replaced, never fatal.
    """
    try:
        d = _loads(data)
    except _JSONDecodeError:
        try:
            d = _loads(data.decode("utf-8", "replace"))
        except _JSONDecodeError:
            return None
    if type(d) is not dict:
        return None
    log = d.get("log")
    stream = d.get("stream")
    tm = d.get("time")
    if type(log) is not str or type(tm) is not str or (stream != "stdout" and stream != "stderr"):
        return None
    # orjson never gives lone surrogates (it rejects them), so a plain encode is safe
    if log[-1:] == "\n":
        text = log[:-1].encode()
        partial = False
    else:
        text = log.encode()
        partial = True
    attrs = d.get("attrs")
    return stream, partial, tm, text, attrs if type(attrs) is dict and attrs else None


def decode_cri(data: bytes, *, strict: bool = False) -> Record | None:
    """One line of the CRI log format (containerd, CRI-O): `<RFC 3339 time> <stream> <tags> <text>`,
    or None when it is not one.

    Like the kubelet, the first `:`-separated tag `P` means partial and any other tag complete
    (forward compatible); `strict` (format auto) accepts only `P` and `F`. The text is raw bytes.
    """
    sp = data.find(b" ", 19, 40)
    if sp < 0:
        return None
    s_end = sp + 7
    stream_b = data[sp + 1:s_end]
    if stream_b == b"stdout":
        stream = "stdout"
    elif stream_b == b"stderr":
        stream = "stderr"
    else:
        return None
    if data[s_end:s_end + 1] != b" ":
        return None
    tag_end = data.find(b" ", s_end + 1)
    if tag_end < 0 or tag_end == s_end + 1:
        return None
    tag = data[s_end + 1:tag_end]
    first = tag.split(b":", 1)[0] if b":" in tag else tag
    if strict and first != b"F" and first != b"P":
        return None
    # the time's shape only (`YYYY-MM-DDTHH:MM:SS...`); it is parsed when a document needs it
    if data[4] != 45 or data[7] != 45 or data[10] != 84 or data[13] != 58 or data[16] != 58 \
            or not data[:4].isdigit():
        return None
    return stream, first == b"P", data[:sp].decode("latin-1"), data[tag_end + 1:], None


def looks_like_container(data: bytes) -> bool:
    """Cheap pre-check for format auto: could this line be a Docker or CRI record?"""
    return data[:7] == _DOCKER_HEAD or (data[4:5] == b"-" and data[10:11] == b"T" and data[:1].isdigit())


def is_container_record(data: bytes) -> bool:
    """Is this line a Docker json-file or CRI record (as format auto recognises them)?"""
    return looks_like_container(data) and _decode_auto(data) is not None


def _decode_auto(data: bytes) -> Record | None:
    if data[:7] == _DOCKER_HEAD:
        return decode_docker(data)
    if data[4:5] == b"-" and data[10:11] == b"T" and data[:1].isdigit():
        return decode_cri(data, strict=True)
    return None


# ----------------------------------------------------------------------------- Kubernetes paths

_K8S_CONTAINERS_RE = re.compile(
    r"(?:^|/)(?P<pod>[^/_]+)_(?P<ns>[^/_]+)_(?P<container>[^/]+)-(?P<id>[0-9a-f]{64})\.log$")
_K8S_PODS_RE = re.compile(
    r"(?:^|/)(?P<ns>[^/_]+)_(?P<pod>[^/_]+)_(?P<uid>[0-9a-fA-F-]{8,})/(?P<container>[^/]+)/\d+\.log"
    r"(?:\.\d{8}-\d{6}(?:\.gz)?)?$")
_DOCKER_PATH_RE = re.compile(r"(?:^|/)(?P<id>[0-9a-f]{64})/(?P=id)-json\.log(?:\.\d+(?:\.gz)?)?$")


def path_metadata(path: str) -> dict[str, Any]:
    """Fields a container log's path tells, without asking any API server.

    `/var/log/containers/<pod>_<namespace>_<container>-<64 hex>.log` (kubelet's symlinks):
    kubernetes.pod.name, kubernetes.namespace, container.name, container.id;
    `/var/log/pods/<namespace>_<pod>_<uid>/<container>/<N>.log` (their targets, also rotated
    `N.log.<YYYYmmdd-HHMMSS>[.gz]`): the same but container.id, plus kubernetes.pod.uid;
    `/var/lib/docker/containers/<id>/<id>-json.log[.N]`: container.id. Only the path's tail is
    matched, so a host's /var/log mounted elsewhere (/host/var/log) gives the same fields.
    """
    m = _K8S_CONTAINERS_RE.search(path)
    if m is not None:
        return {"kubernetes": {"pod": {"name": m["pod"]}, "namespace": m["ns"]},
                "container": {"name": m["container"], "id": m["id"]}}
    m = _K8S_PODS_RE.search(path)
    if m is not None:
        return {"kubernetes": {"pod": {"name": m["pod"], "uid": m["uid"]}, "namespace": m["ns"]},
                "container": {"name": m["container"]}}
    m = _DOCKER_PATH_RE.search(path)
    if m is not None:
        return {"container": {"id": m["id"]}}
    return {}


# ----------------------------------------------------------------------------- joining

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
            self._decode = _decode_auto
        self._unparsed_flag = 0 if fmt == "auto" else FLAG_CONTAINER_UNPARSED
        self._held: dict[str, _Held] = {}
        self._ml_args = (multiline_start, multiline_max_lines, multiline_timeout_s)
        self._ml: dict[str, MultilineAggregator] | None = {} if multiline_start else None
        self._ml_meta: dict[str, deque[tuple[int, str, dict[str, Any] | None]]] = {}
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
                if d[:7] == _DOCKER_HEAD or (d[10:11] == b"T" and d[4:5] == b"-") or len(d) > cap:
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
