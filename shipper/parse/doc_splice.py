"""`DocBuilder`'s build loops that need none of its state beyond what they read: the Python splice
loop (`_build_general`: JSON object lines without the keys enrichment adds become bulk pairs from
ready bytes and one orjson serialisation, every other line goes through `DocBuilder.to_doc`; the C
path in `_native.c` does the same for pino lines) and the loop of non-file sources (`build_source`).
Pure.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import orjson

from shipper.model import Line
from shipper.parse.doc_values import _FAST_MS_MAX, _FAST_MS_MIN, _LEVEL_BYTES, _MS_TEXT, SourceEvent, _event_time
from shipper.parse.ecs import splice_parts
from shipper.parse.timeparse import format_timestamp

if TYPE_CHECKING:
    from shipper.parse.document import DocBuilder


def build_general(b: DocBuilder, incarnation: str, path: str, events: list[Line], now: float,
                  out: list[bytes]) -> int:
    """The Python splice loop, for any index pattern and line filter (see `_build`). With one
    fixed index name the action's start is a constant and no event time is computed for routing."""
    field_keys = b._field_keys
    nbytes = 0
    loads = orjson.loads
    dumps = orjson.dumps
    decode_error = orjson.JSONDecodeError
    join = b"".join
    append = out.append
    to_doc = b.to_doc
    route = b.router.route
    prefix = b._prefix
    static_prefix = b._static_prefix
    line_filter = b.line_filter
    ts_prefix = b._ts_prefix
    ms_text = _MS_TEXT
    level_bytes = _LEVEL_BYTES
    tail = b._fields_bytes + b","
    mid = b._path_bytes(path)
    host = b._host_bytes
    ecs = b.ecs
    ecs_fixed = b.ecs_fixed
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
                    if line_filter is not None and b.line_dropped(data.decode("utf-8", "replace")):
                        continue
                    hostname, ecs_members = ecs_parts
                    t = 0.0
                    tm = d.get("time")
                    if type(tm) is int and _FAST_MS_MIN <= tm < _FAST_MS_MAX:
                        sec = tm // 1000
                        tsp = ts_prefix.get(sec)
                        if tsp is None:
                            tsp = b._second_prefix(sec)
                        ts = ms_text[tm - sec * 1000]
                        if static_prefix is None:
                            t = tm / 1000.0
                    else:
                        t = _event_time(d, now, b.tz)
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


def build_source(b: DocBuilder, events: list[SourceEvent], out: list[bytes]) -> int:
    """Append one bulk pair per event of a non-file source to `out` (each with its own `_id`);
    returns the bytes appended. Like `build`, a line orjson cannot serialise (nested past 255
    levels) goes as text, flagged json_parse_failed."""
    nbytes = 0
    route = b.router.route
    prefix = b._prefix
    for ev in events:
        r = b.source_doc(ev)
        if r is None:
            continue
        doc, t = r
        try:
            body = orjson.dumps(doc)
        except TypeError:
            r = b.source_doc(ev, as_text=True)
            if r is None:
                continue
            doc, t = r
            body = orjson.dumps(doc)
        pair = b"".join((prefix(route(doc, t)), ev.doc_id.encode(), b'"}}\n', body, b"\n"))
        nbytes += len(pair)
        out.append(pair)
    return nbytes
