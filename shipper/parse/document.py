"""Pure: events -> Elasticsearch documents per SPEC, serialised as bulk `create` pairs.

JSON lines (pino, bunyan) keep their fields; text lines become `message`; regex formats add their
groups. Always added: @timestamp, host.name, log.file.path, log.offset, the input's fields.
Bad input is flagged in `log.flags`, never raised. The `_id` is `<incarnation>-<offset>`.
Sources other than files (the journal) hand in `SourceEvent`s: the same parsing, their own `_id`,
time and fields, no `log.file.*` (`source_doc`, `build_source`). Container records (format
docker/cri, or found by auto) come joined by `parse/container.py` and take `build_container`
(`parse/container_doc.py`): the joined text parsed as auto parses a line, plus log.stream and the
path's kubernetes/container fields.
Valid pino lines are built in C when `shipper/_native.c` is built (`_build_native`); this file
is the reference for what every document holds.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import orjson

from shipper import native
from shipper.config import EcsMode, InputConfig
from shipper.model import FLAG_CONTAINER_UNPARSED, FLAG_MULTILINE_CAPPED, FLAG_TRUNCATED, Line, SplitBuild
from shipper.parse.doc_splice import build_general, build_source
from shipper.parse.doc_values import (
    _FAST_MS_MAX,
    _FAST_MS_MIN,
    LEVEL_NAMES,
    SourceEvent,
    _add_absent,
    _epoch,
    _event_time,
    _merge,
    _usable,
)
from shipper.parse.ecs import ROOTS as ECS_ROOTS
from shipper.parse.ecs import apply_ecs, root_mask
from shipper.parse.index import IndexRouter
from shipper.parse.processors import Processors
from shipper.parse.timeparse import format_timestamp, parse_timestamp

if TYPE_CHECKING:
    from shipper.parse.container import ContainerEvent
    from shipper.parse.container_doc import ContainerDocs

native_splice = native.splice      # the C fast path, or None (shipper/native.py)
native_split_splice = native.split_splice   # the same, fused with line splitting (split_builder)


# The keys enrichment adds or overwrites at the top level: a JSON line with none of them (nor the
# input's fields) is spliced (see DocBuilder.build); one with any of them is re-serialised.
_ADDED_KEYS = frozenset(("@timestamp", "log", "host", "message"))
_SPLICE_BLOCKERS = frozenset(("@timestamp", "log", "host"))
_FIELD_REF_RE = re.compile(r"\{([^{}|]+)(?:\|[^{}]*)?\}")

_ECS_CODE = {"off": 0, "add": 1, "replace": 2}     # the C path's `ecs` argument

_loads = orjson.loads
_dumps = orjson.dumps
_NEWLINE = orjson.OPT_APPEND_NEWLINE
_JSONDecodeError = orjson.JSONDecodeError


class DocBuilder:
    """Builds the bulk pairs for one input. Holds compiled patterns and caches, no I/O."""

    def __init__(self, inp: InputConfig, default_index: str, host_name: str) -> None:
        self.format = inp.format
        # docker/cri: the joined text of a record is parsed as format auto parses a line
        self._line_format = "auto" if inp.format in ("docker", "cri") else inp.format
        self._containers: ContainerDocs | None = None
        self.tz = inp.timezone
        self.fields = dict(inp.fields)
        self._fields_flat = not any(isinstance(v, (dict, list)) for v in self.fields.values())
        self.host_name = host_name
        self.ecs: EcsMode = inp.ecs
        # the ECS objects the input's fields write (merged after the mapping): a line with an ECS
        # field for one of them is built whole, where the two merge (`ecs.splice_parts`)
        self.ecs_fixed = frozenset(k for k in inp.fields if isinstance(k, str)) & ECS_ROOTS
        self._ecs_arg = (_ECS_CODE[inp.ecs], root_mask(self.ecs_fixed))    # the C path's `ecs`
        self._host_bytes = b',"host":{"name":' + _dumps(host_name)   # host's start: hostname may follow
        self.router = IndexRouter(inp.index or default_index)
        self.regex: Any = None
        if inp.format == "regex" and inp.pattern:
            from shipper.parse.regex import RegexParser
            self.regex = RegexParser(inp.pattern, inp.timezone)
        self.line_filter: Any = None
        if inp.include_lines or inp.exclude_lines:
            from shipper.parse.filters import LineFilter
            self.line_filter = LineFilter(inp.include_lines, inp.exclude_lines)
        procs = Processors(inp)
        self.processors = procs if procs.active else None
        self.dropped: dict[str, int] = {}       # reason -> events dropped since `take_dropped`
        self.drop_reasons = (("include_lines",) if inp.include_lines else ()) + (
            ("exclude_lines",) if inp.exclude_lines else ()) + procs.reasons
        self.transform: Any = None
        if inp.drop_fields or inp.rename_fields or inp.mask:
            from shipper.parse.filters import DocTransform
            self.transform = DocTransform(inp.drop_fields, inp.rename_fields, inp.mask)
        self._action_prefix: dict[str, bytes] = {}
        self._field_keys: frozenset[str] | None = None
        self._splice_reserved: frozenset[str] | None = self._splice_keys(inp)
        self._fields_bytes = b""
        if self._splice_reserved is not None and self.fields:
            try:
                self._fields_bytes = b"".join(b"," + _dumps(k) + b":" + _dumps(v) for k, v in self.fields.items())
            except (TypeError, orjson.JSONEncodeError):
                self._splice_reserved = None      # not serialisable on its own: the slow path says how
        self._static_prefix = (self._prefix(self.router.route({}, 0.0))
                               if "%" not in self.router.pattern and "{" not in self.router.pattern else None)
        self._ts_prefix: dict[int, bytes] = {}    # epoch second -> b'"}}\n{"@timestamp":"YYYY-MM-DDTHH:MM:SS'
        self._path_mid: dict[str, bytes] = {}     # path -> the constant bytes between @timestamp and log.offset
        # the C fast path: for the usual input (no line filter; an index named by neither a field
        # nor anything but the event time), when it is built; `_build_native`
        self._native = (native_splice if native_splice is not None and self._splice_reserved is not None
                        and self.line_filter is None and "{" not in self.router.pattern else None)
        self._reserved_bytes = tuple(k.encode() for k in self._splice_reserved or ())
        if len(self._reserved_bytes) > 64:       # the C scan's limit; a config with 60 fields is rare
            self._native = None
        # the fused loop appends runs of pairs as one bytes object: not with processors, which
        # drop or rewrite pairs one by one
        self._split_splice = native_split_splice if self._native is not None and self.processors is None else None

    @property
    def fusable(self) -> bool:
        """Does `split_builder` give a fused loop (the C path, built)?"""
        return self._split_splice is not None

    def _splice_keys(self, inp: InputConfig) -> frozenset[str] | None:
        """The top-level keys that send a JSON line to full re-serialisation; None: never splice.

        Splicing needs JSON input, no transform (it rewrites the doc), input fields that touch
        nothing enrichment adds, and an index pattern that reads no added field."""
        if self._line_format not in ("auto", "json") or self.transform is not None:
            return None
        if not all(isinstance(k, str) for k in self.fields):
            return None
        field_keys = frozenset(self.fields)
        if field_keys & _ADDED_KEYS:
            return None
        for m in _FIELD_REF_RE.finditer(self.router.pattern):
            ref = m.group(1).strip()
            if any(ref.startswith(k) for k in _ADDED_KEYS | field_keys):
                return None
        self._field_keys = field_keys or None
        return _SPLICE_BLOCKERS | field_keys

    def _path_bytes(self, path: str) -> bytes:
        mid = self._path_mid.get(path)
        if mid is None:
            if len(self._path_mid) > 4096:
                self._path_mid.clear()
            mid = b',"log":{"file":{"path":' + _dumps(path) + b'},"offset":'
            self._path_mid[path] = mid
        return mid

    def _prefix(self, index: str) -> bytes:
        p = self._action_prefix.get(index)
        if p is None:
            if len(self._action_prefix) > 4096:
                self._action_prefix.clear()
            p = b'{"create":{"_index":' + _dumps(index) + b',"_id":"'
            self._action_prefix[index] = p
        return p

    def to_doc(self, data: bytes, flags: int, path: str, offset: int, now: float,
               parsed: dict[str, Any] | None = None, *, as_text: bool = False, stream: str = "",
               attrs: dict[str, Any] | None = None) -> tuple[dict[str, Any], float] | None:
        """One event -> (document, event time). None when a line filter drops it.
        `parsed`: `data` already parsed (orjson.loads of the bytes gave this dict).
        `as_text`: JSON that cannot be shipped as such: the line as text, flagged json_parse_failed.
        `stream`: a container record (see `build_container`; `now` is then the runtime's time):
        adds log.stream, the path's kubernetes/container fields and docker.attrs."""
        r = self._parse(data, flags, now, parsed, as_text, (path, attrs) if stream else None)
        if r is None:
            return None
        doc, t, log, fl, bad_ts = r
        lf = log.get("file")
        if isinstance(lf, dict):
            lf["path"] = path
        else:
            log["file"] = {"path": path}
        log["offset"] = offset
        if stream:
            log["stream"] = stream
        return self._finish(doc, t, log, fl, bad_ts, self.host_name)

    def source_doc(self, ev: SourceEvent, *, as_text: bool = False) -> tuple[dict[str, Any], float] | None:
        """An event of a non-file source -> (document, event time), parsed exactly as a file line
        (`to_doc`) but without `log.file.path`/`log.offset`: `ev.time` is the time when the line
        gives none, `ev.added` is merged where the line has nothing yet, `ev.host_name` (when
        set) is `host.name`. None when a line filter drops it."""
        r = self._parse(ev.data, ev.flags, ev.time, None, as_text, taken=ev.added or None)
        if r is None:
            return None
        doc, t, log, fl, bad_ts = r
        if ev.added:
            _add_absent(doc, ev.added)
        out = self._finish(doc, t, log, fl, bad_ts, ev.host_name or self.host_name)
        if out[0].get("log") == {}:
            del out[0]["log"]      # a file's always holds log.file; this one nothing: no empty object
        return out

    def _parse(self, data: bytes, flags: int, now: float, parsed: dict[str, Any] | None, as_text: bool,
               container: tuple[str, dict[str, Any] | None] | None = None, taken: dict[str, Any] | None = None,
               ) -> tuple[dict[str, Any], float, dict[str, Any], list[str] | None, Any] | None:
        """The line's own content: parsed fields, @timestamp, the input's fields, `log` (a dict
        in the doc) with the line's level. -> (doc, time, log, flags to add, bad @timestamp).
        `container`: (path, docker attrs) of a container record, whose fields go in before the input's.
        `taken`: a source's fields, added after this, that no ECS field takes the place of."""
        fl: list[str] | None = ["json_parse_failed"] if as_text else None
        obj: Any = parsed
        fmt = self._line_format
        if obj is not None:
            pass
        elif (fmt == "auto" or fmt == "json") and not as_text:
            head = data[:1]
            if head in b" \t" and head:
                head = data.lstrip(b" \t")[:1]
            if head == b"{":
                try:
                    obj = _loads(data)
                except _JSONDecodeError:
                    try:
                        obj = _loads(data.decode("utf-8", "replace"))
                    except _JSONDecodeError:
                        fl = ["json_parse_failed"]
                if obj is not None and not isinstance(obj, dict):
                    obj = None
                    fl = ["json_parse_failed"]
            elif fmt == "json":
                fl = ["json_parse_failed"]
        if obj is not None:
            doc: dict[str, Any] = obj
            if self.line_filter is not None and self.line_dropped(data.decode("utf-8", "replace")):
                return None
            if self.ecs != "off":
                apply_ecs(doc, self.ecs, taken)
            ts_text = None
            # a line's own @timestamp that is no time (text in no known layout, a bool, years past
            # 9999) cannot be indexed as a date: replaced, but kept and flagged, never silently lost
            bad_ts = doc.get("@timestamp")
            t = _epoch(bad_ts, now, self.tz) if bad_ts is not None else None
            if t is None:
                t = _event_time(doc, now, self.tz)
            else:
                bad_ts = None
            msg = doc.get("msg")
            if msg is not None and "message" not in doc:
                doc["message"] = msg
            level = doc.get("level")
        else:
            text = data.decode("utf-8", "replace")
            if self.line_filter is not None and self.line_dropped(text):
                return None
            doc = {"message": text}
            t, ts_text, level, bad_ts = now, None, None, None
            if self.regex is not None:
                parsed = self.regex.parse(text, now)
                if parsed is None:
                    fl = (fl or []) + ["regex_no_match"]
                else:
                    doc.update(parsed)
                    pts = parsed.get("@timestamp")
                    if isinstance(pts, str):
                        pt = parse_timestamp(pts, now, "UTC")
                        if pt is not None and _usable(pt):
                            t, ts_text = pt, pts
        if t is None or not _usable(t):
            t = now
        doc["@timestamp"] = ts_text or format_timestamp(t)
        if container is not None:
            self.containers.add_meta(doc, container[0], container[1])
        if self.fields:
            # before the fields SPEC always adds, so `fields: {log: {...}}` cannot drop log.offset
            if self._fields_flat:
                doc.update(self.fields)
            else:
                _merge(doc, self.fields)
        if flags:
            fl = fl or []
            if flags & (FLAG_TRUNCATED | FLAG_MULTILINE_CAPPED):
                fl.append("truncated")
            if flags & FLAG_CONTAINER_UNPARSED:
                fl.append(self.format + "_parse_failed")
        log = doc.get("log")
        if not isinstance(log, dict):
            log = {} if log is None else {"original": log}
            doc["log"] = log
        if "level" not in log:
            if isinstance(level, int) and not isinstance(level, bool):
                name = LEVEL_NAMES.get(level)
                if name:
                    log["level"] = name
            elif isinstance(level, str) and level:
                log["level"] = level          # pino with a level formatter, winston, structlog
        return doc, t, log, fl, bad_ts

    def _finish(self, doc: dict[str, Any], t: float, log: dict[str, Any], fl: list[str] | None, bad_ts: Any,
                host_name: str) -> tuple[dict[str, Any], float]:
        """Flags, an unparsed @timestamp kept aside, host.name, the input's transform."""
        if bad_ts is not None:
            # always text: one mapping for the field whatever the lines put in @timestamp
            log["original_timestamp"] = bad_ts if isinstance(bad_ts, str) else _dumps(bad_ts).decode()
            fl = (fl or []) + ["timestamp_unparsed"]
        if fl:
            old = log.get("flags")
            log["flags"] = (old if isinstance(old, list) else []) + fl
        host = doc.get("host")
        if isinstance(host, dict):
            host.setdefault("name", host_name)
        elif host is None:
            doc["host"] = {"name": host_name}
        else:
            doc["host"] = {"name": host_name, "original": host}
        if self.transform is not None:
            doc = self.transform.apply(doc)
        return doc, t

    def build_source(self, events: list[SourceEvent], out: list[bytes], now: float) -> int:
        """Append one bulk pair per event of a non-file source to `out` (each with its own `_id`),
        but the ones the processors drop; returns the bytes appended (`parse/doc_splice.py`).
        `now`: when they were read (the throttle's clock)."""
        n0 = len(out)
        return self._processed(out, n0, build_source(self, events, out), now)

    @property
    def containers(self) -> ContainerDocs:
        if self._containers is None:
            from shipper.parse.container_doc import ContainerDocs
            self._containers = ContainerDocs(self)
        return self._containers

    def build_container(self, incarnation: str, path: str, events: list[ContainerEvent], now: float,
                        out: list[bytes]) -> int:
        """Append one bulk pair per joined container record (`parse/container.py`) to `out`;
        returns the bytes appended. `now` is the time the lines were read; the runtime's time
        (RFC 3339 text) is the fallback @timestamp of records without their own
        (`parse/container_doc.py`). The processors drop or rewrite pairs as in `build`."""
        n0 = len(out)
        return self._processed(out, n0, self.containers.build(incarnation, path, events, now, out), now)

    def line_dropped(self, text: str) -> bool:
        """Does `include_lines`/`exclude_lines` drop this line? Counted when it does."""
        why = self.line_filter.drop_reason(text)
        if why is None:
            return False
        self.dropped[why] = self.dropped.get(why, 0) + 1
        return True

    def take_dropped(self) -> dict[str, int]:
        """The events dropped since the last call, by reason (`shipper_events_dropped_total`)."""
        d, self.dropped = self.dropped, {}
        return d

    def _processed(self, out: list[bytes], n0: int, nbytes: int, now: float) -> int:
        """The input's processors over the pairs just appended (out[n0:]); the bytes left."""
        if self.processors is None or len(out) == n0:
            return nbytes
        return self.processors.filter(out, n0, now, self.dropped)

    def build(self, incarnation: str, path: str, events: list[Line], now: float,
              out: list[bytes]) -> int:
        """Append one bulk pair per event to `out`, but the ones the input's processors drop;
        returns the bytes appended (`build_pairs`, then `parse/processors.py`). `now` is the time
        the lines were read."""
        n0 = len(out)
        return self._processed(out, n0, self.build_pairs(incarnation, path, events, now, out), now)

    def build_pairs(self, incarnation: str, path: str, events: list[Line], now: float,
                    out: list[bytes]) -> int:
        """`build` without the processors (see `_build`).

        Bad input never stops the pipeline: orjson parses JSON nested up to 1024 levels but
        serialises only 255, so such a line raises TypeError; then the events are built one by one
        and that line goes as text, flagged json_parse_failed.
        """
        n0 = len(out)
        counted = dict(self.dropped)
        try:
            return self._build(incarnation, path, events, now, out)
        except TypeError:
            del out[n0:]
            self.dropped = counted       # the lines the first try dropped are dropped again below
        nbytes = 0
        for ev in events:
            try:
                nbytes += self._build(incarnation, path, [ev], now, out)
                continue
            except TypeError:
                pass
            nbytes += self._as_text(incarnation, path, ev, now, out)
        return nbytes

    def _as_text(self, incarnation: str, path: str, ev: Line, now: float, out: list[bytes]) -> int:
        """The line as text, flagged json_parse_failed (what `build` makes of a TypeError)."""
        start, _end, data, flags = ev
        r = self.to_doc(data, flags, path, start, now, as_text=True)
        if r is None:
            return 0
        doc, t = r
        pair = b"".join((self._prefix(self.router.route(doc, t)), incarnation.encode(),
                         b"-%d\"}}\n" % start, _dumps(doc), b"\n"))
        out.append(pair)
        return len(pair)

    def split_builder(self, incarnation: str, path: str, now: float, out: list[bytes], counts: dict[int, int],
                      sniff: Callable[[bytes, bytes], bool] | None = None) -> SplitBuild | None:
        """`build` fused with line splitting, for one file's batch (`LineSplitter.feed_built`): the
        C loop scans each line where it was read and appends the pairs to `out`, so a line it takes
        never becomes a Python object (`_native.split_splice`); consecutive ones share one bytes
        object, `counts[i]` pairs in `out[i]` (`Draft.multi`). Every line gets the document `build`
        gives it, in order. None where `build` would not take the C path. `sniff(first, last)`
        (format auto) sees the first and last line of each chunk first; true: the caller splits
        and builds that chunk itself (a container log)."""
        fused = self._split_splice
        if fused is None:
            return None

        def one(ev: Line) -> int:
            # a line the scan did not take: what `build` gives it alone (TypeError: as text)
            n0 = len(out)
            try:
                return self._build_general(incarnation, path, [ev], now, out)
            except TypeError:
                del out[n0:]
            return self._as_text(incarnation, path, ev, now, out)

        rest = (out, counts, self._static_prefix, self._prefix_at_second, incarnation.encode() + b"-",
                self._path_bytes(path), self._host_bytes, self._fields_bytes + b",", self._reserved_bytes, one,
                _FAST_MS_MIN, _FAST_MS_MAX, self._ecs_arg)

        def split(chunk: Any, carry: bytes, pos: int, limit: int, flag: int) -> tuple[int, int, int, int, int, int, int] | None:
            return fused(chunk, carry, pos, limit, flag, sniff, *rest)

        return split

    def _build(self, incarnation: str, path: str, events: list[Line], now: float,
               out: list[bytes]) -> int:
        """Append one bulk pair per event to `out`; returns the bytes appended.

        A JSON object line with none of the keys enrichment adds (`@timestamp`, `log`, `host`,
        the input's fields; `message` only when it would be copied from `msg`) is spliced:
        `{` + the added fields as ready bytes + `,` + orjson's serialisation of the parsed line
        without its `{`. The parsed dict is never modified and nothing is serialised twice.
        Why not the original line's bytes: proving it has no duplicate keys (which Elasticsearch
        rejects, while re-serialising keeps the last) costs more than orjson.dumps does. Every
        other line takes the general path (`to_doc` + a full serialisation); both give equal docs.
        """
        if self._splice_reserved is None:
            return self.build_reserialised(incarnation, path, events, now, out)
        if self._native is not None:
            return self._build_native(incarnation, path, events, now, out)
        return self._build_general(incarnation, path, events, now, out)

    def _build_native(self, incarnation: str, path: str, events: list[Line], now: float,
                      out: list[bytes]) -> int:
        """`_build` in C (`_native.c`): a valid pino line is passed through as it is, after the
        added fields; every line it does not take is handed, in order, to the Python loop."""
        def one(ev: Line) -> int:
            return self._build_general(incarnation, path, [ev], now, out)

        native = self._native
        assert native is not None
        return int(native(events, out, self._static_prefix, self._prefix_at_second, incarnation.encode() + b"-",
                          self._path_bytes(path), self._host_bytes, self._fields_bytes + b",", self._reserved_bytes,
                          one, _FAST_MS_MIN, _FAST_MS_MAX, self._ecs_arg))

    def _prefix_at_second(self, sec: int) -> bytes:
        """The action's start for an event in epoch second `sec` (an index named by time alone)."""
        return self._prefix(self.router.route({}, float(sec)))

    def _build_general(self, incarnation: str, path: str, events: list[Line], now: float,
                       out: list[bytes]) -> int:
        """The Python splice loop, for any index pattern and line filter (see `_build`;
        `parse/doc_splice.py`)."""
        return build_general(self, incarnation, path, events, now, out)

    def _second_prefix(self, sec: int) -> bytes:
        """The action's end and the document's start up to the @timestamp's seconds, cached per second."""
        if len(self._ts_prefix) > 4096:
            self._ts_prefix.clear()
        tsp = b'"}}\n{"@timestamp":"' + format_timestamp(sec)[:19].encode()
        self._ts_prefix[sec] = tsp
        return tsp

    def build_reserialised(self, incarnation: str, path: str, events: list[Line], now: float,
                           out: list[bytes]) -> int:
        """`build` without splicing: every event through `to_doc` and one full serialisation."""
        nbytes = 0
        to_doc = self.to_doc
        route = self.router.route
        prefix = self._prefix
        inc = incarnation.encode()
        for start, _end, data, flags in events:
            r = to_doc(data, flags, path, start, now)
            if r is None:
                continue
            doc, t = r
            pair = b"".join((prefix(route(doc, t)), inc, b"-%d\"}}\n" % start, _dumps(doc), b"\n"))
            nbytes += len(pair)
            out.append(pair)
        return nbytes

