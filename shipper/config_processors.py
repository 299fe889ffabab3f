"""The processors of an input and their dataclasses (SPEC: "Dropping, sampling, throttling,
redacting"): `drop_when` and `sample` conditions, `throttle`, `redact`. Read by `shipper.config`'s
`_input`; every error names the key (`inputs[0].drop_when[1].matches`). What they do to documents
is `shipper/parse/processors.py`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from shipper.config_values import Lines, Section, check_regex

__all__ = ["ConditionConfig", "SampleConfig", "ThrottleConfig", "read_conditions", "read_redact", "read_sample",
           "read_throttle"]

Op = Literal["equals", "in", "prefix", "matches", "exists"]
OPS: tuple[Op, ...] = ("equals", "in", "prefix", "matches", "exists")


@dataclass(frozen=True, slots=True)
class ConditionConfig:
    """`{field: a.b, <op>: value}`: `field` is a dotted name (or a key with dots); `value` is a JSON
    scalar (`equals`), a tuple of them (`in`), a string (`prefix`, `matches`: a regex searched in
    the value's text) or a bool (`exists`)."""

    field: str
    op: Op
    value: Any


@dataclass(frozen=True, slots=True)
class SampleConfig:
    """`{<condition>, keep: 0.01}`: of the events the condition matches, this fraction is kept."""

    condition: ConditionConfig
    keep: float


@dataclass(frozen=True, slots=True)
class ThrottleConfig:
    """`{key: '{service.name}', events_per_s: 1000, burst: 5000}`: a token bucket per value of `key`."""

    key: str | None          # a `{field}` pattern as in index names; None: one bucket for the input
    events_per_s: float
    burst: float


def _scalar(v: Any) -> bool:
    return v is None or isinstance(v, (str, int, float, bool))


def _condition(c: Section, lines: Lines) -> ConditionConfig:
    """One condition; reads `field` and exactly one of OPS from `c` (the caller finishes it)."""
    field = c.string("field", None)
    if not field:
        raise lines.error(c.key("field"), "a condition needs the field it looks at (a dotted name)")
    ops = [k for k in c.data if k in OPS]
    unknown = [k for k in c.data if k not in OPS and k not in ("field", "keep")]
    if unknown:
        raise lines.error(c.key(str(unknown[0])), f"unknown condition; one of {', '.join(OPS)}")
    if len(ops) != 1:
        raise lines.error(c.path, f"a condition has exactly one of {', '.join(OPS)}"
                                  + (f", got {', '.join(ops)}" if ops else ""))
    op = ops[0]
    value = c.raw(op)
    if op == "equals":
        if not _scalar(value):
            raise lines.error(c.key(op), "expected a string, number, true, false or null")
    elif op == "in":
        if not isinstance(value, list) or not all(_scalar(v) for v in value):
            raise lines.error(c.key(op), "expected a list of strings, numbers, true, false or null")
        value = tuple(value)
    elif op == "exists":
        value = c.boolean(op, True)
    else:
        value = c.string(op, None)
        if value is None:
            raise lines.error(c.key(op), "expected a string")
        if op == "matches":
            check_regex(value, c.key(op), lines)
    return ConditionConfig(field=field, op=op, value=value)


def _entries(s: Section, name: str, lines: Lines) -> list[Section]:
    raw = s.raw(name)
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise lines.error(s.key(name), "expected a list of conditions ({field: ..., equals: ...})")
    return [Section(entry, f"{s.key(name)}[{i}]", lines) for i, entry in enumerate(raw)]


def read_conditions(s: Section, name: str, lines: Lines) -> tuple[ConditionConfig, ...]:
    """`drop_when`: a list of conditions, any of which drops the event."""
    out = []
    for c in _entries(s, name, lines):
        if c.has("keep"):
            raise lines.error(c.key("keep"), "unknown key (keep belongs to sample)")
        out.append(_condition(c, lines))
        c.finish()
    return tuple(out)


def read_sample(s: Section, lines: Lines) -> tuple[SampleConfig, ...]:
    """`sample`: conditions with the fraction `keep` (0..1) of the events each matches."""
    out = []
    for c in _entries(s, "sample", lines):
        cond = _condition(c, lines)
        keep = c.raw("keep")
        if isinstance(keep, bool) or not isinstance(keep, (int, float)):
            raise lines.error(c.key("keep"), "expected a number between 0 and 1 (the fraction kept)")
        if not 0.0 <= float(keep) <= 1.0:
            raise lines.error(c.key("keep"), f"must be between 0 and 1 (the fraction kept), got {keep}")
        out.append(SampleConfig(cond, float(keep)))
        c.finish()
    return tuple(out)


def _rate(t: Section, name: str, default: float | None, lines: Lines) -> float:
    v = t.raw(name)
    if v is None:
        if default is None:
            raise lines.error(t.key(name), "required: events a second")
        return default
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v <= 0:
        raise lines.error(t.key(name), f"expected a number greater than zero, got {v!r}")
    return float(v)


def read_throttle(s: Section, lines: Lines) -> ThrottleConfig | None:
    raw = s.raw("throttle")
    if raw is None:
        return None
    t = Section(raw, s.key("throttle"), lines)
    key = t.string("key", None)
    rate = _rate(t, "events_per_s", None, lines)
    burst = _rate(t, "burst", max(rate, 1.0), lines)
    if burst < 1:
        raise lines.error(t.key("burst"), f"must be at least 1 (one event), got {burst:g}")
    t.finish()
    return ThrottleConfig(key=key or None, events_per_s=rate, burst=burst)


def read_redact(s: Section, lines: Lines) -> tuple[str, ...]:
    paths = s.strings("redact")
    for i, p in enumerate(paths):
        if not p or any(not part for part in p.split(".")):
            raise lines.error(f"{s.key('redact')}[{i}]", f"expected a dotted field name, got {p!r}")
    return paths
