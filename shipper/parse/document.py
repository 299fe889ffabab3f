"""Pure: events -> Elasticsearch documents per SPEC, serialised as bulk `create` pairs.

JSON lines (pino, bunyan) keep their fields; text lines become `message`; regex formats add their
groups. Always added: @timestamp, host.name, log.file.path, log.offset, the input's fields.
Bad input is flagged in `log.flags`, never raised. The `_id` is `<incarnation>-<offset>`.
Valid pino lines are built in C when `shipper/_native.c` is built (`_build_native`); this file
is the reference for what every document holds.

Container logs (format docker/cri, or container records found by auto) arrive joined by
`parse/container.py` and go through `build_container`: the joined text is parsed by `to_doc` as
format auto parses a line, with the runtime's time as the fallback @timestamp, plus log.stream and
the fields the path tells (kubernetes.*, container.*). Plain lines among them take `build`.
"""

from __future__ import annotations

import re
from typing import Any

import orjson

from shipper import native
from shipper.config import InputConfig
from shipper.model import FLAG_CONTAINER_UNPARSED, FLAG_MULTILINE_CAPPED, FLAG_TRUNCATED, Line
from shipper.parse.container import ContainerEvent, parse_rfc3339, path_metadata
from shipper.parse.index import IndexRouter
from shipper.parse.timeparse import format_timestamp, parse_timestamp

native_splice = native.splice      # the C fast path, or None (shipper/native.py)

LEVEL_NAMES = {10: "trace", 20: "debug", 30: "info", 40: "warn", 50: "error", 60: "fatal"}
_LEVEL_BYTES = {k: b',"level":"' + v.encode() + b'"}' for k, v in LEVEL_NAMES.items()}   # closes `log`

# The keys enrichment adds or overwrites at the top level: a JSON line with none of them (nor the
# input's fields) is spliced (see DocBuilder.build); one with any of them is re-serialised.
_ADDED_KEYS = frozenset(("@timestamp", "log", "host", "message"))
_SPLICE_BLOCKERS = frozenset(("@timestamp", "log", "host"))
_CONTAINER_KEYS = frozenset(("kubernetes", "container", "docker"))   # what a container record adds on top
_FIELD_REF_RE = re.compile(r"\{([^{}|]+)(?:\|[^{}]*)?\}")
# pino's `time` in epoch ms, within which integer arithmetic gives exactly what format_timestamp
# (float seconds) gives: 1973-03-03 .. 2109-05-15 (beyond 2**42 ms float rounding may differ)
_FAST_MS_MIN = 100_000_000_001
_FAST_MS_MAX = 2 ** 42
_MS_TEXT = tuple(b".%03dZ\"" % i for i in range(1000))

_loads = orjson.loads
_dumps = orjson.dumps
_NEWLINE = orjson.OPT_APPEND_NEWLINE
_JSONDecodeError = orjson.JSONDecodeError


def doc_id(incarnation: str, offset: int) -> str:
    """Deterministic: a re-sent event is a 409, a new incarnation never collides with an old one."""
    return f"{incarnation}-{offset}"


_MAX_EPOCH_S = 253402300800.0   # 10000-01-01: past it no ISO 8601 @timestamp (nor index date) exists


def _usable(t: float | None) -> bool:
    return t is not None and 0.0 <= t < _MAX_EPOCH_S


def _epoch(value: Any, now: float, tz: str) -> float | None:
    """Epoch seconds from a JSON time value: a number (ms when it is too large for seconds) or a
    text in a known layout; None when unusable (unparseable, or outside years 1970..9999)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        t = value / 1000.0 if value > 1e11 else float(value)
    elif isinstance(value, str):
        t = parse_timestamp(value, now, tz)
    else:
        return None
    return t if _usable(t) else None


def _event_time(doc: dict[str, Any], now: float, tz: str) -> float:
    """Epoch seconds of the event: an existing `@timestamp`, pino's `time` (epoch ms) or bunyan's
    (ISO), `timestamp`; the first usable one wins, else `now` (the time it was read)."""
    for key in ("@timestamp", "time", "timestamp"):
        value = doc.get(key)
        if value is not None:
            t = _epoch(value, now, tz)
            if t is not None:
                return t
    return now


def _copy_json(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _copy_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_copy_json(v) for v in value]
    return value


def _merge(doc: dict[str, Any], extra: dict[str, Any]) -> None:
    """Deep-merge `extra` (the input's fields) into doc: objects merge, anything else replaces.
    Inserted objects are copies, so later changes to one document never reach the config."""
    for k, v in extra.items():
        if isinstance(v, dict):
            cur = doc.get(k)
            if isinstance(cur, dict):
                _merge(cur, v)
                continue
        doc[k] = _copy_json(v)


class DocBuilder:
    """Builds the bulk pairs for one input. Holds compiled patterns and caches, no I/O."""

    def __init__(self, inp: InputConfig, default_index: str, host_name: str) -> None:
        self.format = inp.format
        # docker/cri: the joined text of a record is parsed as format auto parses a line
        self._line_format = "auto" if inp.format in ("docker", "cri") else inp.format
        self._path_meta: dict[str, dict[str, Any]] = {}
        self.tz = inp.timezone
        self.fields = dict(inp.fields)
        self._fields_flat = not any(isinstance(v, (dict, list)) for v in self.fields.values())
        self.host_name = host_name
        self.router = IndexRouter(inp.index or default_index)
        self.regex: Any = None
        if inp.format == "regex" and inp.pattern:
            from shipper.parse.regex import RegexParser
            self.regex = RegexParser(inp.pattern, inp.timezone)
        self.line_filter: Any = None
        if inp.include_lines or inp.exclude_lines:
            from shipper.parse.filters import LineFilter
            self.line_filter = LineFilter(inp.include_lines, inp.exclude_lines)
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
        # container records (build_container): spliced like a file's JSON line when, on top of the
        # above, neither the fields nor the index pattern touch what a record adds
        self._container_reserved: frozenset[str] | None = None
        if self._splice_reserved is not None and not (frozenset(self.fields) & _CONTAINER_KEYS) and not any(
                m.group(1).strip().startswith(k) for m in _FIELD_REF_RE.finditer(self.router.pattern)
                for k in _CONTAINER_KEYS):
            self._container_reserved = self._splice_reserved | _CONTAINER_KEYS
        # the path's fields may be shared by every document (not copied) when nothing edits them later
        self._meta_shared = self.transform is None and not (frozenset(self.fields) & _CONTAINER_KEYS)
        self._meta_bytes: dict[str, bytes] = {}
        self._stream_mid: dict[tuple[str, str], bytes] = {}
        self._container_reserved_bytes = tuple(k.encode() for k in self._container_reserved or ())
        self._container_native = (self._native if self._container_reserved is not None
                                  and len(self._container_reserved_bytes) <= 64 else None)
        self._stream_bytes = {s: b',"stream":' + _dumps(s) for s in ("stdout", "stderr")}

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
            mid = (b',"host":{"name":' + _dumps(self.host_name) + b'},"log":{"file":{"path":' + _dumps(path)
                   + b'},"offset":')
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
            if self.line_filter is not None and not self.line_filter.keep(data.decode("utf-8", "replace")):
                return None
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
            if self.line_filter is not None and not self.line_filter.keep(text):
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
                        if _usable(pt):
                            t, ts_text = pt, pts  # type: ignore[assignment]
        if not _usable(t):
            t = now
        doc["@timestamp"] = ts_text or format_timestamp(t)
        if stream:
            # before the input's fields, so `fields: {kubernetes: {cluster: ...}}` merges into them
            meta = self._container_meta(path)
            if attrs:
                meta = dict(meta, docker={"attrs": attrs})
            for k, v in meta.items():
                cur = doc.get(k)
                if isinstance(cur, dict):
                    _merge(cur, v)
                elif cur is None:
                    doc[k] = v if self._meta_shared and k != "docker" else _copy_json(v)
                else:
                    doc[k] = dict(_copy_json(v), original=cur)
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
        lf = log.get("file")
        if isinstance(lf, dict):
            lf["path"] = path
        else:
            log["file"] = {"path": path}
        log["offset"] = offset
        if stream:
            log["stream"] = stream
        if bad_ts is not None:
            # always text: one mapping for the field whatever the lines put in @timestamp
            log["original_timestamp"] = bad_ts if isinstance(bad_ts, str) else _dumps(bad_ts).decode()
            fl = (fl or []) + ["timestamp_unparsed"]
        if fl:
            old = log.get("flags")
            log["flags"] = (old if isinstance(old, list) else []) + fl
        host = doc.get("host")
        if isinstance(host, dict):
            host.setdefault("name", self.host_name)
        elif host is None:
            doc["host"] = {"name": self.host_name}
        else:
            doc["host"] = {"name": self.host_name, "original": host}
        if self.transform is not None:
            doc = self.transform.apply(doc)
        return doc, t

    def _container_meta(self, path: str) -> dict[str, Any]:
        meta = self._path_meta.get(path)
        if meta is None:
            if len(self._path_meta) > 4096:
                self._path_meta.clear()
            meta = self._path_meta[path] = path_metadata(path)
        return meta

    def build_container(self, incarnation: str, path: str, events: list[ContainerEvent], now: float,
                        out: list[bytes]) -> int:
        """Append one bulk pair per joined container record (`parse/container.py`) to `out`;
        returns the bytes appended. `now` is the time the lines were read; the runtime's time
        (RFC 3339 text) is parsed only for records whose text has no time of its own.

        A record's text is parsed as format auto parses a line (a pino line gives the document it
        gives in a file), with the runtime's time in place of the read time: @timestamp is the
        line's own time if it has one, else the runtime's. Added: log.stream, and the fields the
        path tells (`path_metadata`), docker.attrs when the runtime wrote some. Plain lines among
        them (stream "") are built by `build`, in order, as any line of a file.
        """
        nbytes = 0
        plain: list[Line] = []
        same: list[ContainerEvent] = []       # consecutive records of one stream, for the C path
        native = self._container_native
        one = self._build_record
        for ev in events:
            stream = ev[4]
            if native is not None and stream and ev[6] is None and (not same or same[0][4] == stream):
                if plain:
                    nbytes += self.build(incarnation, path, plain, now, out)
                    plain = []
                same.append(ev)
                continue
            if same:
                nbytes += self._build_records_native(incarnation, path, same, now, out)
                same = [ev] if native is not None and stream and ev[6] is None else []
                if same:
                    continue
            if not stream:
                plain.append(ev[:4])
                continue
            if plain:
                nbytes += self.build(incarnation, path, plain, now, out)
                plain = []
            nbytes += one(incarnation, path, ev, now, out)
        if same:
            nbytes += self._build_records_native(incarnation, path, same, now, out)
        if plain:
            nbytes += self.build(incarnation, path, plain, now, out)
        return nbytes

    def _build_records_native(self, incarnation: str, path: str, records: list[ContainerEvent], now: float,
                              out: list[bytes]) -> int:
        """Records of one stream without docker attrs through the C splice (`_build_native`): the
        same C code as a file's pino lines, with log.stream inside `mid` and the path's fields in
        `tail` (opaque bytes to it). It takes only lines with their own epoch-ms `time`, so the
        runtime's time is never needed there; every other record comes back to `_build_record`."""
        assert self._container_native is not None
        stream = records[0][4]
        key = (path, stream)
        mid = self._stream_mid.get(key)
        if mid is None:
            if len(self._stream_mid) > 4096:
                self._stream_mid.clear()
            mid = (b',"host":{"name":' + _dumps(self.host_name) + b'},"log":{"stream":' + _dumps(stream)
                   + b',"file":{"path":' + _dumps(path) + b'},"offset":')
            self._stream_mid[key] = mid
        by_start: dict[int, ContainerEvent] = {}

        def one(ev: Line) -> int:
            if not by_start:
                by_start.update((r[0], r) for r in records)
            return self._build_record(incarnation, path, by_start[ev[0]], now, out)

        n: int = self._container_native([r[:4] for r in records], out, self._static_prefix, self._prefix_at_second,
                                        incarnation.encode() + b"-", mid,
                                        self._path_meta_bytes(path) + self._fields_bytes + b",",
                                        self._container_reserved_bytes, one, _FAST_MS_MIN, _FAST_MS_MAX)
        return n

    def _build_record(self, incarnation: str, path: str, ev: ContainerEvent, now: float, out: list[bytes]) -> int:
        """One container record in Python: the splice when its text is a JSON object it can take,
        else `to_doc` and a full serialisation. Returns the bytes appended."""
        start, _end, data, flags, stream, t_text, attrs = ev
        t = parse_rfc3339(t_text)
        when = t if t is not None and _usable(t) else now
        reserved = self._container_reserved
        inc = incarnation.encode()
        if reserved is not None and not flags and data[:1] == b"{":
            n = self._splice_record(inc, path, start, data, stream, when, attrs, reserved, out)
            if n >= 0:
                return n
        try:
            r = self.to_doc(data, flags, path, start, when, stream=stream, attrs=attrs)
            if r is None:
                return 0
            doc, ts = r
            body = _dumps(doc)
        except TypeError:
            # nested deeper than orjson serialises (see `build`): the record as text
            r = self.to_doc(data, flags, path, start, when, as_text=True, stream=stream, attrs=attrs)
            if r is None:
                return 0
            doc, ts = r
            body = _dumps(doc)
        pair = b"".join((self._prefix(self.router.route(doc, ts)), inc, b"-%d\"}}\n" % start, body, b"\n"))
        out.append(pair)
        return len(pair)

    def _path_meta_bytes(self, path: str) -> bytes:
        """The path's fields (`path_metadata`) as `,"k":v` pairs, cached per path."""
        meta = self._meta_bytes.get(path)
        if meta is None:
            if len(self._meta_bytes) > 4096:
                self._meta_bytes.clear()
            meta = self._meta_bytes[path] = b"".join(b"," + _dumps(k) + b":" + _dumps(v)
                                                     for k, v in self._container_meta(path).items())
        return meta

    def _splice_record(self, inc: bytes, path: str, start: int, data: bytes, stream: str, now: float,
                       attrs: dict[str, Any] | None, reserved: frozenset[str], out: list[bytes]) -> int:
        """`_build_general`'s splice for one container record whose text is a JSON object with none
        of the keys enrichment adds: the added fields (log.stream and the path's fields among them)
        as ready bytes, then orjson's serialisation of the parsed line without its `{`. Returns the
        bytes appended; -1 when the record needs `to_doc` (nothing appended). Same document."""
        try:
            d = _loads(data)
        except _JSONDecodeError:
            return -1
        if type(d) is not dict or not d or not reserved.isdisjoint(d):
            return -1
        if self.line_filter is not None and not self.line_filter.keep(data.decode("utf-8", "replace")):
            return 0
        static_prefix = self._static_prefix
        t = 0.0
        tm = d.get("time")
        if type(tm) is int and _FAST_MS_MIN <= tm < _FAST_MS_MAX:
            sec = tm // 1000
            tsp = self._ts_prefix.get(sec) or self._second_prefix(sec)
            ts = _MS_TEXT[tm - sec * 1000]
            if static_prefix is None:
                t = tm / 1000.0
        else:
            t = _event_time(d, now, self.tz)
            tsp = b'"}}\n{"@timestamp":"' + format_timestamp(t).encode()
            ts = b'"'
        lv = d.get("level")
        if type(lv) is int:
            lvb = _LEVEL_BYTES.get(lv, b"}")
        elif type(lv) is str and lv:
            lvb = b',"level":' + _dumps(lv) + b"}"
        else:
            lvb = b"}"
        meta = self._path_meta_bytes(path)
        try:
            if attrs:
                meta += b',"docker":' + _dumps({"attrs": attrs})
            msg = d.get("msg")
            if msg is not None and "message" not in d:
                meta += b',"message":' + _dumps(msg)
            body = _dumps(d, option=_NEWLINE)
        except TypeError:
            return -1                 # nested deeper than orjson serialises: `to_doc` says how
        sb = b"%d" % start
        pair = b"".join((static_prefix or self._prefix(self.router.route(d, t)), inc, b"-", sb, tsp, ts,
                         self._path_bytes(path), sb, self._stream_bytes.get(stream) or b',"stream":' + _dumps(stream),
                         lvb, meta, self._fields_bytes, b",", body[1:]))
        out.append(pair)
        return len(pair)

    def build(self, incarnation: str, path: str, events: list[Line], now: float,
              out: list[bytes]) -> int:
        """Append one bulk pair per event to `out`; returns the bytes appended (see `_build`).

        Bad input never stops the pipeline: orjson parses JSON nested up to 1024 levels but
        serialises only 255, so such a line raises TypeError; then the events are built one by one
        and that line goes as text, flagged json_parse_failed.
        """
        n0 = len(out)
        try:
            return self._build(incarnation, path, events, now, out)
        except TypeError:
            del out[n0:]
        nbytes = 0
        for ev in events:
            try:
                nbytes += self._build(incarnation, path, [ev], now, out)
                continue
            except TypeError:
                pass
            start, _end, data, flags = ev
            r = self.to_doc(data, flags, path, start, now, as_text=True)
            if r is None:
                continue
            doc, t = r
            pair = b"".join((self._prefix(self.router.route(doc, t)), incarnation.encode(),
                             b"-%d\"}}\n" % start, _dumps(doc), b"\n"))
            nbytes += len(pair)
            out.append(pair)
        return nbytes

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

        return self._native(events, out, self._static_prefix, self._prefix_at_second, incarnation.encode() + b"-",
                            self._path_bytes(path), self._fields_bytes + b",", self._reserved_bytes, one,
                            _FAST_MS_MIN, _FAST_MS_MAX)

    def _prefix_at_second(self, sec: int) -> bytes:
        """The action's start for an event in epoch second `sec` (an index named by time alone)."""
        return self._prefix(self.router.route({}, float(sec)))

    def _build_general(self, incarnation: str, path: str, events: list[Line], now: float,
                       out: list[bytes]) -> int:
        """The Python splice loop, for any index pattern and line filter (see `_build`). With one
        fixed index name the action's start is a constant and no event time is computed for routing."""
        field_keys = self._field_keys
        nbytes = 0
        loads = _loads
        dumps = _dumps
        decode_error = _JSONDecodeError
        join = b"".join
        append = out.append
        to_doc = self.to_doc
        route = self.router.route
        prefix = self._prefix
        static_prefix = self._static_prefix
        line_filter = self.line_filter
        ts_prefix = self._ts_prefix
        ms_text = _MS_TEXT
        level_bytes = _LEVEL_BYTES
        tail = self._fields_bytes + b","
        mid = self._path_bytes(path)
        inc = incarnation.encode() + b"-"
        d: Any
        for start, _end, data, flags in events:
            d = None
            if data and data[0] == 123 and not flags:        # b"{"
                try:
                    d = loads(data)
                except decode_error:
                    d = None
                else:
                    if ("@timestamp" not in d and "log" not in d and "host" not in d and d
                            and (field_keys is None or field_keys.isdisjoint(d))):
                        if line_filter is not None and not line_filter.keep(data.decode("utf-8", "replace")):
                            continue
                        t = 0.0
                        tm = d.get("time")
                        if type(tm) is int and _FAST_MS_MIN <= tm < _FAST_MS_MAX:
                            sec = tm // 1000
                            tsp = ts_prefix.get(sec)
                            if tsp is None:
                                tsp = self._second_prefix(sec)
                            ts = ms_text[tm - sec * 1000]
                            if static_prefix is None:
                                t = tm / 1000.0
                        else:
                            t = _event_time(d, now, self.tz)
                            tsp = b'"}}\n{"@timestamp":"' + format_timestamp(t).encode()
                            ts = b'"'
                        lv = d.get("level")
                        if type(lv) is int:
                            lvb = level_bytes.get(lv, b"}")
                        elif type(lv) is str and lv:
                            lvb = b',"level":' + dumps(lv) + b"}"
                        else:
                            lvb = b"}"
                        sb = b"%d" % start
                        msg = d.get("msg")
                        if msg is None or "message" in d:
                            pair = join((static_prefix or prefix(route(d, t)), inc, sb, tsp, ts, mid, sb, lvb,
                                         tail, dumps(d, option=_NEWLINE)[1:]))
                        else:
                            pair = join((static_prefix or prefix(route(d, t)), inc, sb, tsp, ts, mid, sb, lvb,
                                         b',"message":', dumps(msg), tail, dumps(d, option=_NEWLINE)[1:]))
                        nbytes += len(pair)
                        append(pair)
                        continue
            r = to_doc(data, flags, path, start, now, d if type(d) is dict else None)
            if r is None:
                continue
            doc, t = r
            pair = join((prefix(route(doc, t)), inc, b"%d\"}}\n" % start, dumps(doc), b"\n"))
            nbytes += len(pair)
            append(pair)
        return nbytes

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

