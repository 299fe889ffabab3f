"""Pure values and helpers of documents: the `_id` of a file event, event times (pino epoch ms,
texts, the usable range), JSON merges of added fields, and `SourceEvent` for non-file sources.
No builder state here; `document.py` builds with them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from shipper.parse.timeparse import parse_timestamp

LEVEL_NAMES = {10: "trace", 20: "debug", 30: "info", 40: "warn", 50: "error", 60: "fatal"}
LEVEL_BYTES = {k: b',"level":"' + v.encode() + b'"}' for k, v in LEVEL_NAMES.items()}   # closes `log`
# pino's `time` in epoch ms, within which integer arithmetic gives exactly what format_timestamp
# (float seconds) gives: 1973-03-03 .. 2109-05-15 (beyond 2**42 ms float rounding may differ)
FAST_MS_MIN = 100_000_000_001
FAST_MS_MAX = 2 ** 42
MS_TEXT = tuple(b".%03dZ\"" % i for i in range(1000))


_FIELD_REF_RE = re.compile(r"\{([^{}|]+)(?:\|[^{}]*)?\}")


def index_field_refs(pattern: str) -> list[str]:
    """The fields an index pattern names (`logs-{service.name|none}` -> ["service.name"])."""
    return [m.group(1).strip() for m in _FIELD_REF_RE.finditer(pattern)]


def doc_id(incarnation: str, offset: int) -> str:
    """Deterministic: a re-sent event is a 409, a new incarnation never collides with an old one."""
    return f"{incarnation}-{offset}"


MAX_EPOCH_S = 253402300800.0   # 10000-01-01: past it no ISO 8601 @timestamp (nor index date) exists


def usable(t: float | None) -> bool:
    return t is not None and 0.0 <= t < MAX_EPOCH_S


def epoch(value: Any, now: float, tz: str) -> float | None:
    """Epoch seconds from a JSON time value: a number (ms when it is too large for seconds) or a
    text in a known layout; None when unusable (unparseable, or outside years 1970..9999)."""
    if isinstance(value, bool):
        return None
    t: float | None
    if isinstance(value, (int, float)):
        t = value / 1000.0 if value > 1e11 else float(value)
    elif isinstance(value, str):
        t = parse_timestamp(value, now, tz)
    else:
        return None
    return t if usable(t) else None


def event_time(doc: dict[str, Any], now: float, tz: str) -> float:
    """Epoch seconds of the event: an existing `@timestamp`, pino's `time` (epoch ms) or bunyan's
    (ISO), `timestamp`; the first usable one wins, else `now` (the time it was read)."""
    for key in ("@timestamp", "time", "timestamp"):
        value = doc.get(key)
        if value is not None:
            t = epoch(value, now, tz)
            if t is not None:
                return t
    return now


def copy_json(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: copy_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [copy_json(v) for v in value]
    return value


def merge(doc: dict[str, Any], extra: dict[str, Any]) -> None:
    """Deep-merge `extra` (the input's fields) into doc: objects merge, anything else replaces.
    Inserted objects are copies, so later changes to one document never reach the config."""
    for k, v in extra.items():
        if isinstance(v, dict):
            cur = doc.get(k)
            if isinstance(cur, dict):
                merge(cur, v)
                continue
        doc[k] = copy_json(v)


def add_absent(doc: dict[str, Any], added: dict[str, Any]) -> None:
    """Merge `added` (a source's own fields) where the document has nothing: objects merge, a
    value the line already has is kept; a non-object where an object goes is kept as `original`.
    `added`'s objects go into the document as they are (a source makes them fresh per event)."""
    for k, v in added.items():
        cur = doc.get(k)
        if type(v) is dict:
            if cur is None:
                doc[k] = v
            elif type(cur) is dict:
                add_absent(cur, v)
            else:
                v.setdefault("original", cur)
                doc[k] = v
        elif k not in doc:
            doc[k] = v


@dataclass(frozen=True, slots=True)
class SourceEvent:
    """An event of a source other than a file (the journal): its line and what the source knows.

    `doc_id` is the document's `_id` (deterministic, JSON-safe: no quotes or backslashes); `time`
    (epoch seconds) is `@timestamp` unless the parsed line gives its own; `added` holds the
    source's fields (`{"systemd": {"unit": ...}}`, plain dicts made for this event: the document
    takes them over), merged where the line has nothing;
    `host_name` is `host.name` (None: the builder's)."""

    doc_id: str
    data: bytes
    flags: int
    time: float
    added: dict[str, Any]
    host_name: str | None = None
