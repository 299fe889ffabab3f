"""Pure: events -> Elasticsearch documents per SPEC, serialised as bulk `create` pairs.

JSON lines (pino, bunyan) keep their fields; text lines become `message`; regex formats add their
groups. Always added: @timestamp, host.name, log.file.path, log.offset, the input's fields.
Bad input is flagged in `log.flags`, never raised. The `_id` is `<incarnation>-<offset>`.
"""

from __future__ import annotations

from typing import Any, Callable

import orjson

from shipper.config import InputConfig
from shipper.model import FLAG_MULTILINE_CAPPED, FLAG_TRUNCATED, Line
from shipper.parse.index import IndexRouter
from shipper.parse.timeparse import format_timestamp, parse_timestamp

LEVEL_NAMES = {10: "trace", 20: "debug", 30: "info", 40: "warn", 50: "error", 60: "fatal"}

_loads = orjson.loads
_dumps = orjson.dumps
_JSONDecodeError = orjson.JSONDecodeError


def doc_id(incarnation: str, offset: int) -> str:
    """Deterministic: a re-sent event is a 409, a new incarnation never collides with an old one."""
    return f"{incarnation}-{offset}"


def _event_time(doc: dict[str, Any], now: float, tz: str) -> tuple[float, str | None]:
    """(epoch seconds, @timestamp text or None to format it) from pino/bunyan/@timestamp/timestamp."""
    ts = doc.get("@timestamp")
    if isinstance(ts, str):
        t = parse_timestamp(ts, now, tz)
        if t is not None:
            return t, format_timestamp(t)
    t_raw = doc.get("time")
    if isinstance(t_raw, (int, float)) and not isinstance(t_raw, bool):
        # pino: epoch milliseconds (seconds if it is implausibly small)
        return (t_raw / 1000.0 if t_raw > 1e11 else float(t_raw)), None
    if isinstance(t_raw, str):
        t = parse_timestamp(t_raw, now, tz)
        if t is not None:
            return t, None
    ts2 = doc.get("timestamp")
    if isinstance(ts2, str):
        t = parse_timestamp(ts2, now, tz)
        if t is not None:
            return t, None
    elif isinstance(ts2, (int, float)) and not isinstance(ts2, bool):
        return (ts2 / 1000.0 if ts2 > 1e11 else float(ts2)), None
    return now, None


class DocBuilder:
    """Builds the bulk pairs for one input. Holds compiled patterns and caches, no I/O."""

    def __init__(self, inp: InputConfig, default_index: str, host_name: str) -> None:
        self.format = inp.format
        self.tz = inp.timezone
        self.fields = dict(inp.fields)
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

    def _prefix(self, index: str) -> bytes:
        p = self._action_prefix.get(index)
        if p is None:
            if len(self._action_prefix) > 4096:
                self._action_prefix.clear()
            p = b'{"create":{"_index":' + _dumps(index) + b',"_id":"'
            self._action_prefix[index] = p
        return p

    def to_doc(self, data: bytes, flags: int, path: str, offset: int, now: float) -> tuple[dict[str, Any], float] | None:
        """One event -> (document, event time). None when a line filter drops it."""
        fl: list[str] | None = None
        obj: Any = None
        fmt = self.format
        if fmt == "auto" or fmt == "json":
            if data[:1] == b"{":
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
            t, ts_text = _event_time(doc, now, self.tz)
            msg = doc.get("msg")
            if msg is not None and "message" not in doc:
                doc["message"] = msg
            level = doc.get("level")
        else:
            text = data.decode("utf-8", "replace")
            if self.line_filter is not None and not self.line_filter.keep(text):
                return None
            doc = {"message": text}
            t, ts_text, level = now, None, None
            if self.regex is not None:
                parsed = self.regex.parse(text, now)
                if parsed is None:
                    fl = (fl or []) + ["regex_no_match"]
                else:
                    doc.update(parsed)
                    pts = parsed.get("@timestamp")
                    if isinstance(pts, str):
                        pt = parse_timestamp(pts, now, "UTC")
                        if pt is not None:
                            t, ts_text = pt, pts
        doc["@timestamp"] = ts_text or format_timestamp(t)
        if flags:
            fl = fl or []
            if flags & (FLAG_TRUNCATED | FLAG_MULTILINE_CAPPED):
                fl.append("truncated")
        log = doc.get("log")
        if not isinstance(log, dict):
            log = {} if log is None else {"original": log}
            doc["log"] = log
        if isinstance(level, int) and not isinstance(level, bool) and "level" not in log:
            name = LEVEL_NAMES.get(level)
            if name:
                log["level"] = name
        log["file"] = {"path": path}
        log["offset"] = offset
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
        if self.fields:
            doc.update(self.fields)
        if self.transform is not None:
            doc = self.transform.apply(doc)
        return doc, t

    def build(self, incarnation: str, path: str, events: list[Line], now: float,
              out: list[bytes]) -> int:
        """Append one bulk pair per event to `out`; returns the bytes appended."""
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


BuildFn = Callable[[str, str, list[Line], float, list[bytes]], int]
