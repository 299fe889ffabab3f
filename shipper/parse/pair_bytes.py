"""The bytes of one input's bulk pairs that no line changes: the action's start per index, the
constant runs between a pair's fields, the pino time/level head of a spliced pair, and what the C
splice takes. Caches only, pure; the splice loops (doc_splice.py, container_doc.py) join them."""

from __future__ import annotations

from typing import Any

import orjson

from shipper.parse.doc_values import FAST_MS_MAX, FAST_MS_MIN, LEVEL_BYTES, MS_TEXT, event_time
from shipper.parse.index import IndexRouter
from shipper.parse.timeparse import format_timestamp

CACHE_MAX = 4096        # entries per cache; a cache past it starts afresh


class PairBytes:
    """`host`: host.name's start (host.hostname may follow); `fields`: the input's fields as
    `,"k":v` pairs (`tail` with the `,` the line's own fields follow); `static_prefix`: the action's
    start when the index is one fixed name, else None; `reserved_bytes` and `ecs_arg`: the C
    splice's `reserved` and `ecs` arguments."""

    def __init__(self, router: IndexRouter, host_name: str, fields: bytes, reserved: frozenset[str] | None,
                 ecs_arg: tuple[int, int]) -> None:
        self.router = router
        self.host = b',"host":{"name":' + orjson.dumps(host_name)
        self.fields = fields
        self.tail = fields + b","
        self.reserved_bytes = tuple(k.encode() for k in reserved or ())
        self.ecs_arg = ecs_arg
        self._action_prefix: dict[str, bytes] = {}
        self._ts_prefix: dict[int, bytes] = {}    # epoch second -> b'"}}\n{"@timestamp":"YYYY-MM-DDTHH:MM:SS'
        self._path_mid: dict[str, bytes] = {}     # path -> the constant bytes between @timestamp and log.offset
        self.static_prefix = (self.prefix(router.route({}, 0.0))
                               if "%" not in router.pattern and "{" not in router.pattern else None)

    def prefix(self, index: str) -> bytes:
        """The action's start up to the `_id`'s opening quote, for `index`."""
        p = self._action_prefix.get(index)
        if p is None:
            if len(self._action_prefix) > CACHE_MAX:
                self._action_prefix.clear()
            p = b'{"create":{"_index":' + orjson.dumps(index) + b',"_id":"'
            self._action_prefix[index] = p
        return p

    def prefix_at_second(self, sec: int) -> bytes:
        """The action's start for an event in epoch second `sec` (an index named by time alone)."""
        return self.prefix(self.router.route({}, float(sec)))

    def path(self, path: str) -> bytes:
        """The bytes between @timestamp and log.offset's value: log.file.path."""
        mid = self._path_mid.get(path)
        if mid is None:
            if len(self._path_mid) > CACHE_MAX:
                self._path_mid.clear()
            mid = b',"log":{"file":{"path":' + orjson.dumps(path) + b'},"offset":'
            self._path_mid[path] = mid
        return mid

    def second(self, sec: int) -> bytes:
        """The action's end and the document's start up to the @timestamp's seconds, cached per second."""
        tsp = self._ts_prefix.get(sec)
        if tsp is None:
            if len(self._ts_prefix) > CACHE_MAX:
                self._ts_prefix.clear()
            tsp = b'"}}\n{"@timestamp":"' + format_timestamp(sec)[:19].encode()
            self._ts_prefix[sec] = tsp
        return tsp

    def time_level(self, d: dict[str, Any], now: float, tz: str) -> tuple[bytes, bytes, bytes, float]:
        """A spliced line's head: (the action's end and @timestamp up to its seconds, the rest of
        @timestamp with its closing quote, log.level and the `}` closing `log`, the event time).
        pino's epoch-ms `time` is turned into text by integer arithmetic (the C splice's way); any
        other time as `to_doc` reads it. The event time is 0.0 when the index needs none (one name)."""
        t = 0.0
        tm = d.get("time")
        if type(tm) is int and FAST_MS_MIN <= tm < FAST_MS_MAX:
            sec = tm // 1000
            tsp = self._ts_prefix.get(sec) or self.second(sec)
            ts = MS_TEXT[tm - sec * 1000]
            if self.static_prefix is None:
                t = tm / 1000.0
        else:
            t = event_time(d, now, tz)
            tsp = b'"}}\n{"@timestamp":"' + format_timestamp(t).encode()
            ts = b'"'
        lv = d.get("level")
        if type(lv) is int:
            lvb = LEVEL_BYTES.get(lv, b"}")
        elif type(lv) is str and lv:
            lvb = b',"level":' + orjson.dumps(lv) + b"}"
        else:
            lvb = b"}"
        return tsp, ts, lvb, t
