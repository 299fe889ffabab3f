"""The Python build loops of bulk pairs: the splice (a JSON object line without the keys enrichment
adds becomes ready bytes and one orjson serialisation, as the C splice does for pino lines), the
re-serialising loop every other line takes, and the loop of non-file sources. Pure; a document's
content is shaper.py's, the pair's fixed bytes pair_bytes.py's."""

from __future__ import annotations

from typing import Any

import orjson

from shipper.model import Line
from shipper.parse.doc_values import SourceEvent
from shipper.parse.ecs import splice_parts
from shipper.parse.pair_bytes import PairBytes
from shipper.parse.shaper import DocShaper


def build_general(shaper: DocShaper, pb: PairBytes, incarnation: str, path: str, events: list[Line], now: float,
                  out: list[bytes]) -> int:
    """The Python splice loop, for any index pattern and line filter: one bulk pair per event
    appended to `out`; the bytes appended. With one fixed index name the action's start is a
    constant and no event time is computed for routing."""
    field_keys = shaper.field_keys
    nbytes = 0
    loads = orjson.loads
    dumps = orjson.dumps
    decode_error = orjson.JSONDecodeError
    join = b"".join
    append = out.append
    to_doc = shaper.to_doc
    route = pb.router.route
    prefix = pb.prefix
    static_prefix = pb.static_prefix
    line_filter = shaper.line_filter
    time_level = pb.time_level
    tz = shaper.tz
    tail = pb.tail
    mid = pb.path(path)
    host = pb.host
    ecs = shaper.ecs
    ecs_fixed = shaper.ecs_fixed
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
                        and (field_keys is None or field_keys.isdisjoint(d))
                        and (ecs_parts := splice_parts(d, ecs, ecs_fixed)) is not None):
                    if line_filter is not None and shaper.line_dropped(data.decode("utf-8", "replace")):
                        continue
                    hostname, ecs_members = ecs_parts
                    tsp, ts, lvb, t = time_level(d, now, tz)
                    sb = b"%d" % start
                    msg = d.get("msg")
                    if msg is None or "message" in d:
                        pair = join((static_prefix or prefix(route(d, t)), inc, sb, tsp, ts, mid, sb, lvb,
                                     host, hostname, b"}", ecs_members, tail,
                                     dumps(d, option=orjson.OPT_APPEND_NEWLINE)[1:]))
                    else:
                        pair = join((static_prefix or prefix(route(d, t)), inc, sb, tsp, ts, mid, sb, lvb,
                                     host, hostname, b"}", ecs_members, b',"message":', dumps(msg), tail,
                                     dumps(d, option=orjson.OPT_APPEND_NEWLINE)[1:]))
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


def build_reserialised(shaper: DocShaper, pb: PairBytes, incarnation: str, path: str, events: list[Line],
                       now: float, out: list[bytes]) -> int:
    """Without splicing: every event through `to_doc` and one full serialisation."""
    nbytes = 0
    to_doc = shaper.to_doc
    route = pb.router.route
    prefix = pb.prefix
    inc = incarnation.encode()
    for start, _end, data, flags in events:
        r = to_doc(data, flags, path, start, now)
        if r is None:
            continue
        doc, t = r
        pair = b"".join((prefix(route(doc, t)), inc, b"-%d\"}}\n" % start, orjson.dumps(doc), b"\n"))
        nbytes += len(pair)
        out.append(pair)
    return nbytes


def build_as_text(shaper: DocShaper, pb: PairBytes, incarnation: str, path: str, ev: Line, now: float,
                  out: list[bytes]) -> int:
    """The line as text, flagged json_parse_failed (what a build makes of a line orjson cannot
    serialise: nested past 255 levels raises TypeError)."""
    start, _end, data, flags = ev
    r = shaper.to_doc(data, flags, path, start, now, as_text=True)
    if r is None:
        return 0
    doc, t = r
    pair = b"".join((pb.prefix(pb.router.route(doc, t)), incarnation.encode(),
                     b"-%d\"}}\n" % start, orjson.dumps(doc), b"\n"))
    out.append(pair)
    return len(pair)


def build_source(shaper: DocShaper, pb: PairBytes, events: list[SourceEvent], out: list[bytes]) -> int:
    """Append one bulk pair per event of a non-file source to `out` (each with its own `_id`);
    returns the bytes appended. A line orjson cannot serialise goes as text, as in a build."""
    nbytes = 0
    route = pb.router.route
    prefix = pb.prefix
    for ev in events:
        r = shaper.source_doc(ev)
        if r is None:
            continue
        doc, t = r
        try:
            body = orjson.dumps(doc)
        except TypeError:
            r = shaper.source_doc(ev, as_text=True)
            if r is None:
                continue
            doc, t = r
            body = orjson.dumps(doc)
        pair = b"".join((prefix(route(doc, t)), ev.doc_id.encode(), b'"}}\n', body, b"\n"))
        nbytes += len(pair)
        out.append(pair)
    return nbytes
