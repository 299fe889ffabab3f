"""Pure: joined container records (`parse/container.py`) -> bulk pairs, for one `DocBuilder`.

A record's text is parsed as format auto parses a line (a pino line gives the document it gives
in a file), with the runtime's time in place of the read time: @timestamp is the line's own time
if it has one, else the runtime's. Added: log.stream, the fields the path tells
(`path_metadata`: kubernetes.*, container.*), docker.attrs when the runtime wrote some. Plain
lines among them (stream "") are built by `DocBuilder.build_pairs`, in order, as any line of a file.

The usual record (a JSON object with none of the keys enrichment adds) is spliced as a file's
JSON line is: in C when it is built (log.stream rides in its `mid` bytes, the path's fields in
its tail), else in Python; every other record through `DocBuilder.to_doc`. Both give equal docs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from shipper.model import Line
from shipper.parse.container import ContainerEvent, parse_rfc3339, path_metadata
from shipper.parse.doc_values import (
    _FAST_MS_MAX,
    _FAST_MS_MIN,
    _LEVEL_BYTES,
    _MS_TEXT,
    _copy_json,
    _event_time,
    _merge,
    _usable,
)
from shipper.parse.ecs import splice_parts
from shipper.parse.timeparse import format_timestamp

if TYPE_CHECKING:
    from shipper.parse.document import DocBuilder

_CONTAINER_KEYS = frozenset(("kubernetes", "container", "docker"))   # what a container record adds on top


class ContainerDocs:
    """The container half of one `DocBuilder`: its caches and the splice's reserved keys."""

    def __init__(self, b: DocBuilder) -> None:
        from shipper.parse import document as d
        self.b = b
        self._d = d
        self._path_meta: dict[str, dict[str, Any]] = {}
        # spliced like a file's JSON line when, on top of that, neither the fields nor the index
        # pattern touch what a record adds
        self.reserved: frozenset[str] | None = None
        if b._splice_reserved is not None and not (frozenset(b.fields) & _CONTAINER_KEYS) and not any(
                m.group(1).strip().startswith(k) for m in d._FIELD_REF_RE.finditer(b.router.pattern)
                for k in _CONTAINER_KEYS):
            self.reserved = b._splice_reserved | _CONTAINER_KEYS
        # the path's fields may be shared by every document (not copied) when nothing edits them later
        self._meta_shared = b.transform is None and not (frozenset(b.fields) & _CONTAINER_KEYS)
        self._meta_bytes: dict[str, bytes] = {}
        self._stream_mid: dict[tuple[str, str], bytes] = {}
        self._reserved_bytes = tuple(k.encode() for k in self.reserved or ())
        self.native = (b._native if self.reserved is not None and len(self._reserved_bytes) <= 64 else None)
        self._stream_bytes = {s: b',"stream":' + d._dumps(s) for s in ("stdout", "stderr")}

    def meta(self, path: str) -> dict[str, Any]:
        meta = self._path_meta.get(path)
        if meta is None:
            if len(self._path_meta) > 4096:
                self._path_meta.clear()
            meta = self._path_meta[path] = path_metadata(path)
        return meta

    def add_meta(self, doc: dict[str, Any], path: str, attrs: dict[str, Any] | None) -> None:
        """The path's fields (and docker.attrs) into a parsed record, before the input's fields,
        so `fields: {kubernetes: {cluster: ...}}` merges into them."""
        meta = self.meta(path)
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

    def build(self, incarnation: str, path: str, events: list[ContainerEvent], now: float,
              out: list[bytes]) -> int:
        """`DocBuilder.build_container`: one bulk pair per record appended to `out`; the bytes."""
        b = self.b
        nbytes = 0
        plain: list[Line] = []
        same: list[ContainerEvent] = []       # consecutive records of one stream, for the C path
        native = self.native
        one = self._build_record
        for ev in events:
            stream = ev[4]
            if native is not None and stream and ev[6] is None and (not same or same[0][4] == stream):
                if plain:
                    nbytes += b.build_pairs(incarnation, path, plain, now, out)
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
                nbytes += b.build_pairs(incarnation, path, plain, now, out)
                plain = []
            nbytes += one(incarnation, path, ev, now, out)
        if same:
            nbytes += self._build_records_native(incarnation, path, same, now, out)
        if plain:
            nbytes += b.build_pairs(incarnation, path, plain, now, out)
        return nbytes

    def _build_records_native(self, incarnation: str, path: str, records: list[ContainerEvent], now: float,
                              out: list[bytes]) -> int:
        """Records of one stream without docker attrs through the C splice (`_build_native`): the
        same C code as a file's pino lines, with log.stream inside `mid` and the path's fields in
        `tail` (opaque bytes to it). It takes only lines with their own epoch-ms `time`, so the
        runtime's time is never needed there; every other record comes back to `_build_record`."""
        assert self.native is not None
        b, d = self.b, self._d
        stream = records[0][4]
        key = (path, stream)
        mid = self._stream_mid.get(key)
        if mid is None:
            if len(self._stream_mid) > 4096:
                self._stream_mid.clear()
            mid = (b',"log":{"stream":' + d._dumps(stream) + b',"file":{"path":' + d._dumps(path)
                   + b'},"offset":')
            self._stream_mid[key] = mid
        by_start: dict[int, ContainerEvent] = {}

        def one(ev: Line) -> int:
            if not by_start:
                by_start.update((r[0], r) for r in records)
            return self._build_record(incarnation, path, by_start[ev[0]], now, out)

        n: int = self.native([r[:4] for r in records], out, b._static_prefix, b._prefix_at_second,
                             incarnation.encode() + b"-", mid, b._host_bytes,
                             self._path_meta_bytes(path) + b._fields_bytes + b",",
                             self._reserved_bytes, one, _FAST_MS_MIN, _FAST_MS_MAX, b._ecs_arg)
        return n

    def _build_record(self, incarnation: str, path: str, ev: ContainerEvent, now: float, out: list[bytes]) -> int:
        """One container record in Python: the splice when its text is a JSON object it can take,
        else `to_doc` and a full serialisation. Returns the bytes appended."""
        b, d = self.b, self._d
        start, _end, data, flags, stream, t_text, attrs = ev
        t = parse_rfc3339(t_text)
        when = t if t is not None and _usable(t) else now
        reserved = self.reserved
        inc = incarnation.encode()
        if reserved is not None and not flags and data[:1] == b"{":
            n = self._splice_record(inc, path, start, data, stream, when, attrs, reserved, out)
            if n >= 0:
                return n
        try:
            r = b.to_doc(data, flags, path, start, when, stream=stream, attrs=attrs)
            if r is None:
                return 0
            doc, ts = r
            body = d._dumps(doc)
        except TypeError:
            # nested deeper than orjson serialises (see `DocBuilder.build`): the record as text
            r = b.to_doc(data, flags, path, start, when, as_text=True, stream=stream, attrs=attrs)
            if r is None:
                return 0
            doc, ts = r
            body = d._dumps(doc)
        pair = b"".join((b._prefix(b.router.route(doc, ts)), inc, b"-%d\"}}\n" % start, body, b"\n"))
        out.append(pair)
        return len(pair)

    def _path_meta_bytes(self, path: str) -> bytes:
        """The path's fields (`path_metadata`) as `,"k":v` pairs, cached per path."""
        meta = self._meta_bytes.get(path)
        if meta is None:
            if len(self._meta_bytes) > 4096:
                self._meta_bytes.clear()
            dumps = self._d._dumps
            meta = self._meta_bytes[path] = b"".join(b"," + dumps(k) + b":" + dumps(v)
                                                     for k, v in self.meta(path).items())
        return meta

    def _splice_record(self, inc: bytes, path: str, start: int, data: bytes, stream: str, now: float,
                       attrs: dict[str, Any] | None, reserved: frozenset[str], out: list[bytes]) -> int:
        """`_build_general`'s splice for one container record whose text is a JSON object with none
        of the keys enrichment adds: the added fields (log.stream and the path's fields among them)
        as ready bytes, then orjson's serialisation of the parsed line without its `{`. Returns the
        bytes appended; -1 when the record needs `to_doc` (nothing appended). Same document."""
        b, d = self.b, self._d
        try:
            obj = d._loads(data)
        except d._JSONDecodeError:
            return -1
        if type(obj) is not dict or not obj or not reserved.isdisjoint(obj):
            return -1
        ecs_parts = splice_parts(obj, b.ecs, b.ecs_fixed)
        if ecs_parts is None:
            return -1
        if b.line_filter is not None and b.line_dropped(data.decode("utf-8", "replace")):
            return 0
        static_prefix = b._static_prefix
        t = 0.0
        tm = obj.get("time")
        if type(tm) is int and _FAST_MS_MIN <= tm < _FAST_MS_MAX:
            sec = tm // 1000
            tsp = b._ts_prefix.get(sec) or b._second_prefix(sec)
            ts = _MS_TEXT[tm - sec * 1000]
            if static_prefix is None:
                t = tm / 1000.0
        else:
            t = _event_time(obj, now, b.tz)
            tsp = b'"}}\n{"@timestamp":"' + format_timestamp(t).encode()
            ts = b'"'
        lv = obj.get("level")
        if type(lv) is int:
            lvb = _LEVEL_BYTES.get(lv, b"}")
        elif type(lv) is str and lv:
            lvb = b',"level":' + d._dumps(lv) + b"}"
        else:
            lvb = b"}"
        meta = self._path_meta_bytes(path)
        try:
            if attrs:
                meta += b',"docker":' + d._dumps({"attrs": attrs})
            msg = obj.get("msg")
            if msg is not None and "message" not in obj:
                meta += b',"message":' + d._dumps(msg)
            body = d._dumps(obj, option=d._NEWLINE)
        except TypeError:
            return -1                 # nested deeper than orjson serialises: `to_doc` says how
        sb = b"%d" % start
        pair = b"".join((static_prefix or b._prefix(b.router.route(obj, t)), inc, b"-", sb, tsp, ts,
                         b._path_bytes(path), sb, self._stream_bytes.get(stream) or b',"stream":' + d._dumps(stream),
                         lvb, b._host_bytes, ecs_parts[0], b"}", ecs_parts[1], meta, b._fields_bytes, b",",
                         body[1:]))
        out.append(pair)
        return len(pair)
