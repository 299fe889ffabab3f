"""One input's documents as dicts: a line's content parsed (JSON, regex, text) with its time and
level, the input's fields, log.*, host.name, flags for bad input, the transform. Pure; the bytes
of the pairs are pair_bytes.py's, the loops that build them doc_splice.py's and container_doc.py's."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import orjson

from shipper.config import EcsMode, InputConfig
from shipper.model import FLAG_CONTAINER_UNPARSED, FLAG_MULTILINE_CAPPED, FLAG_TRUNCATED
from shipper.parse.doc_values import LEVEL_NAMES, SourceEvent, add_absent, epoch, event_time, merge, usable
from shipper.parse.ecs import ROOTS as ECS_ROOTS
from shipper.parse.ecs import apply_ecs
from shipper.parse.timeparse import format_timestamp, parse_timestamp

if TYPE_CHECKING:
    from shipper.parse.filters import DocTransform, LineFilter
    from shipper.parse.regex import RegexParser


class DocShaper:
    """The documents of one input. `dropped`: the events its line filter dropped since
    `take_dropped`, by reason (the builder's processors count theirs here too)."""

    def __init__(self, inp: InputConfig, host_name: str) -> None:
        self.format = inp.format
        # docker/cri: the joined text of a record is parsed as format auto parses a line
        self.line_format = "auto" if inp.format in ("docker", "cri") else inp.format
        self.tz = inp.timezone
        self.fields = dict(inp.fields)
        self._fields_flat = not any(isinstance(v, (dict, list)) for v in self.fields.values())
        # the input's field names when every one is a string (a spliced line must have none of them)
        self.field_keys: frozenset[str] | None = (frozenset(self.fields) or None
                                                  if all(isinstance(k, str) for k in self.fields) else None)
        self.host_name = host_name
        self.ecs: EcsMode = inp.ecs
        # the ECS objects the input's fields write (merged after the mapping): a line with an ECS
        # field for one of them is built whole, where the two merge (`ecs.splice_parts`)
        self.ecs_fixed = frozenset(k for k in inp.fields if isinstance(k, str)) & ECS_ROOTS
        self.regex: RegexParser | None = None
        if inp.format == "regex" and inp.pattern:
            from shipper.parse.regex import RegexParser
            self.regex = RegexParser(inp.pattern, inp.timezone)
        self.line_filter: LineFilter | None = None
        if inp.include_lines or inp.exclude_lines:
            from shipper.parse.filters import LineFilter
            self.line_filter = LineFilter(inp.include_lines, inp.exclude_lines)
        self.dropped: dict[str, int] = {}
        self.transform: DocTransform | None = None
        if inp.drop_fields or inp.rename_fields or inp.mask:
            from shipper.parse.filters import DocTransform
            self.transform = DocTransform(inp.drop_fields, inp.rename_fields, inp.mask)

    def to_doc(self, data: bytes, flags: int, path: str, offset: int, now: float,
               parsed: dict[str, Any] | None = None, *, as_text: bool = False, stream: str = "",
               meta: Callable[[dict[str, Any]], None] | None = None) -> tuple[dict[str, Any], float] | None:
        """One event -> (document, event time). None when a line filter drops it.
        `parsed`: `data` already parsed (orjson.loads of the bytes gave this dict).
        `as_text`: JSON that cannot be shipped as such: the line as text, flagged json_parse_failed.
        `stream`: a container record's (`now` is then the runtime's time), with `meta`, which adds
        the record's own fields (the path's, docker.attrs) to the parsed document."""
        r = self._parse(data, flags, now, parsed, as_text, meta if stream else None)
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
            add_absent(doc, ev.added)
        out = self._finish(doc, t, log, fl, bad_ts, ev.host_name or self.host_name)
        if out[0].get("log") == {}:
            del out[0]["log"]      # a file's always holds log.file; this one nothing: no empty object
        return out

    def _parse(self, data: bytes, flags: int, now: float, parsed: dict[str, Any] | None, as_text: bool,
               meta: Callable[[dict[str, Any]], None] | None = None, taken: dict[str, Any] | None = None,
               ) -> tuple[dict[str, Any], float, dict[str, Any], list[str] | None, Any] | None:
        """The line's own content: parsed fields, @timestamp, the input's fields, `log` (a dict
        in the doc) with the line's level. -> (doc, time, log, flags to add, bad @timestamp).
        `meta`: adds a container record's fields, before the input's.
        `taken`: a source's fields, added after this, that no ECS field takes the place of."""
        fl: list[str] | None = ["json_parse_failed"] if as_text else None
        obj: Any = parsed
        fmt = self.line_format
        if obj is not None:
            pass
        elif (fmt == "auto" or fmt == "json") and not as_text:
            head = data[:1]
            if head in b" \t" and head:
                head = data.lstrip(b" \t")[:1]
            if head == b"{":
                try:
                    obj = orjson.loads(data)
                except orjson.JSONDecodeError:
                    try:
                        obj = orjson.loads(data.decode("utf-8", "replace"))
                    except orjson.JSONDecodeError:
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
            t = epoch(bad_ts, now, self.tz) if bad_ts is not None else None
            if t is None:
                t = event_time(doc, now, self.tz)
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
                        if pt is not None and usable(pt):
                            t, ts_text = pt, pts
        if t is None or not usable(t):
            t = now
        doc["@timestamp"] = ts_text or format_timestamp(t)
        if meta is not None:
            meta(doc)
        if self.fields:
            # before the fields SPEC always adds, so `fields: {log: {...}}` cannot drop log.offset
            if self._fields_flat:
                doc.update(self.fields)
            else:
                merge(doc, self.fields)
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
            log["original_timestamp"] = bad_ts if isinstance(bad_ts, str) else orjson.dumps(bad_ts).decode()
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

    def line_dropped(self, text: str) -> bool:
        """Does `include_lines`/`exclude_lines` drop this line? Counted when it does."""
        assert self.line_filter is not None          # asked only where there is one
        why = self.line_filter.drop_reason(text)
        if why is None:
            return False
        self.dropped[why] = self.dropped.get(why, 0) + 1
        return True

    def take_dropped(self) -> dict[str, int]:
        """The events dropped since the last call, by reason (`shipper_events_dropped_total`)."""
        d, self.dropped = self.dropped, {}
        return d
