"""Joined container records (parse/container.py) -> bulk pairs for one input: the text parsed as
format auto parses a line, with the runtime's time as the fallback @timestamp, plus log.stream and
the fields the path tells (kubernetes.*, container.*) and docker.attrs. Spliced like a file's JSON
line where it can be (in C when built), else shaped whole (shaper.py); both give equal docs."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import orjson

from shipper import native
from shipper.model import Line
from shipper.parse.container import ContainerEvent, parse_rfc3339
from shipper.parse.doc_values import FAST_MS_MAX, FAST_MS_MIN, copy_json, index_field_refs, merge, usable
from shipper.parse.ecs import splice_parts
from shipper.parse.pair_bytes import CACHE_MAX, PairBytes
from shipper.parse.shaper import DocShaper

CONTAINER_KEYS = frozenset(("kubernetes", "container", "docker"))   # what a container record adds on top
BuildLines = Callable[[str, str, list[Line], float, list[bytes]], int]

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



class ContainerDocs:
    """The container half of one input's builder: the path's fields per path, the splice's
    reserved keys (`reserved`: None when records are never spliced) and the C splice it uses
    (`native`: None for the Python loop). `build_lines` builds the plain lines among the records
    (stream "") as any line of a file."""

    def __init__(self, shaper: DocShaper, pb: PairBytes, reserved: frozenset[str] | None, pattern: str,
                 splice: native.Splice | None, build_lines: BuildLines) -> None:
        self.shaper = shaper
        self.pb = pb
        self.build_lines = build_lines
        self._path_meta: dict[str, dict[str, Any]] = {}
        # spliced like a file's JSON line when, on top of that, neither the fields nor the index
        # pattern touch what a record adds
        self.reserved: frozenset[str] | None = None
        if reserved is not None and not (frozenset(shaper.fields) & CONTAINER_KEYS) and not any(
                ref.startswith(k) for ref in index_field_refs(pattern) for k in CONTAINER_KEYS):
            self.reserved = reserved | CONTAINER_KEYS
        # the path's fields may be shared by every document (not copied) when nothing edits them later
        self._meta_shared = shaper.transform is None and not (frozenset(shaper.fields) & CONTAINER_KEYS)
        self._meta_bytes: dict[str, bytes] = {}
        self._stream_mid: dict[tuple[str, str], bytes] = {}
        self._reserved_bytes = tuple(k.encode() for k in self.reserved or ())
        self.native = splice if self.reserved is not None and len(self._reserved_bytes) <= 64 else None
        self._stream_bytes = {s: b',"stream":' + orjson.dumps(s) for s in ("stdout", "stderr")}

    def meta(self, path: str) -> dict[str, Any]:
        meta = self._path_meta.get(path)
        if meta is None:
            if len(self._path_meta) > CACHE_MAX:
                self._path_meta.clear()
            meta = self._path_meta[path] = path_metadata(path)
        return meta

    def meta_adder(self, path: str, attrs: dict[str, Any] | None) -> Callable[[dict[str, Any]], None]:
        """What adds the path's fields (and docker.attrs) to a parsed record, before the input's
        fields, so `fields: {kubernetes: {cluster: ...}}` merges into them (`DocShaper.to_doc`'s `meta`)."""
        def add(doc: dict[str, Any]) -> None:
            meta = self.meta(path)
            if attrs:
                meta = dict(meta, docker={"attrs": attrs})
            for k, v in meta.items():
                cur = doc.get(k)
                if isinstance(cur, dict):
                    merge(cur, v)
                elif cur is None:
                    doc[k] = v if self._meta_shared and k != "docker" else copy_json(v)
                else:
                    doc[k] = dict(copy_json(v), original=cur)
        return add

    def build(self, incarnation: str, path: str, events: list[ContainerEvent], now: float,
              out: list[bytes]) -> int:
        """One bulk pair per record appended to `out`; the bytes appended."""
        nbytes = 0
        plain: list[Line] = []
        same: list[ContainerEvent] = []       # consecutive records of one stream, for the C path
        native = self.native
        one = self._build_record
        for ev in events:
            stream = ev[4]
            if native is not None and stream and ev[6] is None and (not same or same[0][4] == stream):
                if plain:
                    nbytes += self.build_lines(incarnation, path, plain, now, out)
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
                nbytes += self.build_lines(incarnation, path, plain, now, out)
                plain = []
            nbytes += one(incarnation, path, ev, now, out)
        if same:
            nbytes += self._build_records_native(incarnation, path, same, now, out)
        if plain:
            nbytes += self.build_lines(incarnation, path, plain, now, out)
        return nbytes

    def _build_records_native(self, incarnation: str, path: str, records: list[ContainerEvent], now: float,
                              out: list[bytes]) -> int:
        """Records of one stream without docker attrs through the C splice (`_build_native`): the
        same C code as a file's pino lines, with log.stream inside `mid` and the path's fields in
        `tail` (opaque bytes to it). It takes only lines with their own epoch-ms `time`, so the
        runtime's time is never needed there; every other record comes back to `_build_record`."""
        assert self.native is not None
        pb = self.pb
        stream = records[0][4]
        key = (path, stream)
        mid = self._stream_mid.get(key)
        if mid is None:
            if len(self._stream_mid) > CACHE_MAX:
                self._stream_mid.clear()
            mid = (b',"log":{"stream":' + orjson.dumps(stream) + b',"file":{"path":' + orjson.dumps(path)
                   + b'},"offset":')
            self._stream_mid[key] = mid
        by_start: dict[int, ContainerEvent] = {}

        def one(ev: Line) -> int:
            if not by_start:
                by_start.update((r[0], r) for r in records)
            return self._build_record(incarnation, path, by_start[ev[0]], now, out)

        n: int = self.native([r[:4] for r in records], out, pb.static_prefix, pb.prefix_at_second,
                             incarnation.encode() + b"-", mid, pb.host, self._path_meta_bytes(path) + pb.tail,
                             self._reserved_bytes, one, FAST_MS_MIN, FAST_MS_MAX, pb.ecs_arg)
        return n

    def _build_record(self, incarnation: str, path: str, ev: ContainerEvent, now: float, out: list[bytes]) -> int:
        """One container record in Python: the splice when its text is a JSON object it can take,
        else `to_doc` and a full serialisation. Returns the bytes appended."""
        shaper, pb = self.shaper, self.pb
        start, _end, data, flags, stream, t_text, attrs = ev
        t = parse_rfc3339(t_text)
        when = t if t is not None and usable(t) else now
        reserved = self.reserved
        inc = incarnation.encode()
        if reserved is not None and not flags and data[:1] == b"{":
            n = self._splice_record(inc, path, start, data, stream, when, attrs, reserved, out)
            if n >= 0:
                return n
        meta = self.meta_adder(path, attrs)
        try:
            r = shaper.to_doc(data, flags, path, start, when, stream=stream, meta=meta)
            if r is None:
                return 0
            doc, ts = r
            body = orjson.dumps(doc)
        except TypeError:
            # nested deeper than orjson serialises (see `DocBuilder.build`): the record as text
            r = shaper.to_doc(data, flags, path, start, when, as_text=True, stream=stream, meta=meta)
            if r is None:
                return 0
            doc, ts = r
            body = orjson.dumps(doc)
        pair = b"".join((pb.prefix(pb.router.route(doc, ts)), inc, b"-%d\"}}\n" % start, body, b"\n"))
        out.append(pair)
        return len(pair)

    def _path_meta_bytes(self, path: str) -> bytes:
        """The path's fields (`path_metadata`) as `,"k":v` pairs, cached per path."""
        meta = self._meta_bytes.get(path)
        if meta is None:
            if len(self._meta_bytes) > CACHE_MAX:
                self._meta_bytes.clear()
            dumps = orjson.dumps
            meta = self._meta_bytes[path] = b"".join(b"," + dumps(k) + b":" + dumps(v)
                                                     for k, v in self.meta(path).items())
        return meta

    def _splice_record(self, inc: bytes, path: str, start: int, data: bytes, stream: str, now: float,
                       attrs: dict[str, Any] | None, reserved: frozenset[str], out: list[bytes]) -> int:
        """`_build_general`'s splice for one container record whose text is a JSON object with none
        of the keys enrichment adds: the added fields (log.stream and the path's fields among them)
        as ready bytes, then orjson's serialisation of the parsed line without its `{`. Returns the
        bytes appended; -1 when the record needs `to_doc` (nothing appended). Same document."""
        shaper, pb = self.shaper, self.pb
        try:
            obj = orjson.loads(data)
        except orjson.JSONDecodeError:
            return -1
        if type(obj) is not dict or not obj or not reserved.isdisjoint(obj):
            return -1
        ecs_parts = splice_parts(obj, shaper.ecs, shaper.ecs_fixed)
        if ecs_parts is None:
            return -1
        if shaper.line_filter is not None and shaper.line_dropped(data.decode("utf-8", "replace")):
            return 0
        tsp, ts, lvb, t = pb.time_level(obj, now, shaper.tz)
        meta = self._path_meta_bytes(path)
        try:
            if attrs:
                meta += b',"docker":' + orjson.dumps({"attrs": attrs})
            msg = obj.get("msg")
            if msg is not None and "message" not in obj:
                meta += b',"message":' + orjson.dumps(msg)
            body = orjson.dumps(obj, option=orjson.OPT_APPEND_NEWLINE)
        except TypeError:
            return -1                 # nested deeper than orjson serialises: `to_doc` says how
        sb = b"%d" % start
        pair = b"".join((pb.static_prefix or pb.prefix(pb.router.route(obj, t)), inc, b"-", sb, tsp, ts,
                         pb.path(path), sb, self._stream_bytes.get(stream) or b',"stream":' + orjson.dumps(stream),
                         lvb, pb.host, ecs_parts[0], b"}", ecs_parts[1], meta, pb.tail, body[1:]))
        out.append(pair)
        return len(pair)
