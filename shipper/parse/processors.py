"""Pure: an input's processors (SPEC: "Dropping, sampling, throttling, redacting") on the pairs a
`DocBuilder` appended, each document read back: `drop_when`, `sample` (by `_id`) and `throttle`
(refilled with the read time, passed in) decide whether it goes, `redact` rewrites it. Decisions
only: the builder counts the drops, the source tells the metrics.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any

import orjson

from shipper.config import ConditionConfig, InputConfig, ThrottleConfig
from shipper.parse.ecs import copies_of
from shipper.parse.filters import MISSING, get_field, split_path
from shipper.parse.index import field_refs, field_text

__all__ = ["REDACTED", "Condition", "Processors", "Redactor", "Throttle", "lookup", "sample_point"]

REDACTED = "[Redacted]"            # pino's own censor
MAX_BUCKETS = 10_000               # throttle keys tracked at once (see Throttle)


def _same(a: Any, b: Any) -> bool:
    """JSON equality of a document's value and a config value: 200 == 200.0, but true is not 1."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b
    return type(a) is type(b) and a == b


def _text(v: Any) -> str:
    """The value's text, for `matches`: a string as it is, anything else as JSON."""
    return v if isinstance(v, str) else orjson.dumps(v).decode()


class Condition:
    """One condition of `drop_when` or `sample` on a document; a missing field matches only
    `exists: false`."""

    def __init__(self, cfg: ConditionConfig) -> None:
        self.path = split_path(cfg.field)
        self.op = cfg.op
        self.value = cfg.value
        self._regex = re.compile(cfg.value) if cfg.op == "matches" else None

    def holds(self, doc: dict[str, Any]) -> bool:
        v = lookup(doc, self.path)
        op = self.op
        if op == "exists":
            return (v is not MISSING) is self.value
        if v is MISSING:
            return False
        if op == "equals":
            return _same(v, self.value)
        if op == "in":
            return any(_same(v, x) for x in self.value)
        if op == "prefix":
            return isinstance(v, str) and v.startswith(self.value)
        assert self._regex is not None
        return self._regex.search(_text(v)) is not None


def lookup(doc: dict[str, Any], parts: tuple[str, ...]) -> Any:
    """`filters.get_field` (nested objects first, then keys with dots), quicker for the usual
    document: the nested walk, and the full search only where a key with a dot could lead on."""
    v: Any = doc
    for k in parts:
        if type(v) is not dict or k not in v:
            break
        v = v[k]
    else:
        return v
    node: Any = doc                 # not there as nested objects: could a key with a dot lead on?
    for k in parts:
        if type(node) is not dict:
            break
        if "." in "".join(node):
            return get_field(doc, parts)
        node = node.get(k)
    return MISSING


def sample_point(doc_id: bytes) -> int:
    """Where an `_id` falls in 0..2**64-1: the same for the same `_id` on every host and run."""
    return int.from_bytes(hashlib.blake2b(doc_id, digest_size=8).digest(), "big")


class Throttle:
    """A token bucket per value of `key` (a `{field}` pattern), `burst` tokens when first seen,
    refilled at `events_per_s` with the read time. At most MAX_BUCKETS keys are kept: past that,
    the buckets that have refilled to full are forgotten (a full bucket is what a new key gets),
    and if none has, all of them."""

    def __init__(self, cfg: ThrottleConfig) -> None:
        self.rate = cfg.events_per_s
        self.burst = cfg.burst
        self._literals, self._refs = field_refs(cfg.key or "")
        self._buckets: dict[str, list[float]] = {}     # key -> [tokens, time of the last refill]

    def key(self, doc: dict[str, Any]) -> str:
        if not self._refs:
            return self._literals[0]
        out = [self._literals[0]]
        for (path, default), lit in zip(self._refs, self._literals[1:], strict=True):
            out.append(field_text(lookup(doc, path), default))
            out.append(lit)
        return "".join(out)

    def admit(self, doc: dict[str, Any], now: float) -> bool:
        key = self.key(doc)
        b = self._buckets.get(key)
        if b is None:
            if len(self._buckets) >= MAX_BUCKETS:
                self._forget_full(now)
            b = self._buckets[key] = [self.burst, now]
        elif now > b[1]:
            b[0] = min(self.burst, b[0] + (now - b[1]) * self.rate)
            b[1] = now
        if b[0] >= 1.0:
            b[0] -= 1.0
            return True
        return False

    def _forget_full(self, now: float) -> None:
        full = [k for k, (tokens, at) in self._buckets.items() if tokens + (now - at) * self.rate >= self.burst]
        if not full:
            self._buckets.clear()
        for k in full:
            del self._buckets[k]


class Redactor:
    """`redact`: the value of each named field, wherever the path leads (nested objects, keys
    with dots, any mix; `*` stands for any one key), becomes "[Redacted]"; the ECS fields copied
    from it (`req.url` -> url.*) are removed, so the value leaves in none of its copies."""

    def __init__(self, paths: tuple[str, ...]) -> None:
        self.paths = [split_path(p) for p in paths]
        self.copies = [c for p in self.paths for c in copies_of(p)]

    def apply(self, doc: dict[str, Any]) -> bool:
        """Rewrite `doc` in place; whether anything changed."""
        changed = False
        for parts in self.paths:
            changed = _redact(doc, parts, 0) or changed
        for parts in self.copies:
            changed = _remove(doc, parts) or changed
        return changed


def _redact(node: dict[str, Any], parts: tuple[str, ...], i: int) -> bool:
    changed = False
    n = len(parts)
    if parts[i] == "*":
        for k, v in node.items():
            if i + 1 == n:
                node[k] = REDACTED
                changed = True
            elif isinstance(v, dict):
                changed = _redact(v, parts, i + 1) or changed
        return changed
    for j in range(i + 1, n + 1):
        key = parts[i] if j == i + 1 else ".".join(parts[i:j])
        if key not in node:
            continue
        if j == n:
            node[key] = REDACTED
            changed = True
        elif isinstance(node[key], dict):
            changed = _redact(node[key], parts, j) or changed
    return changed


def _remove(doc: dict[str, Any], parts: tuple[str, ...]) -> bool:
    """Remove the field at `parts` (nested objects) and the objects it leaves empty."""
    chain: list[Any] = [doc]
    for k in parts[:-1]:
        node = chain[-1].get(k)
        if not isinstance(node, dict):
            return False
        chain.append(node)
    if parts[-1] not in chain[-1]:
        return False
    del chain[-1][parts[-1]]
    for depth in range(len(parts) - 1, 0, -1):
        if chain[depth]:
            break
        del chain[depth - 1][parts[depth - 1]]
    return True


class Processors:
    """An input's processors, or none (`active` False: nothing to do)."""

    def __init__(self, inp: InputConfig) -> None:
        self.drop_when = [Condition(c) for c in inp.drop_when]
        self.sample = [(Condition(s.condition), min(int(s.keep * 2**64), 2**64)) for s in inp.sample]
        self.throttle = Throttle(inp.throttle) if inp.throttle is not None else None
        self.redactor = Redactor(inp.redact) if inp.redact else None
        self.active = bool(self.drop_when or self.sample or self.throttle or self.redactor)
        self.reasons = tuple(r for r, on in (("drop_when", self.drop_when), ("sample", self.sample),
                                             ("throttle", self.throttle)) if on)

    def verdict(self, doc: dict[str, Any], doc_id: bytes, now: float) -> str | None:
        """Why the document is dropped (`drop_when`, `sample`, `throttle`), or None: it goes."""
        for c in self.drop_when:
            if c.holds(doc):
                return "drop_when"
        for cond, threshold in self.sample:
            if cond.holds(doc):
                if sample_point(doc_id) >= threshold:
                    return "sample"
                break                      # the first matching rule decides
        if self.throttle is not None and not self.throttle.admit(doc, now):
            return "throttle"
        return None

    def filter(self, out: list[bytes], n0: int, now: float, dropped: dict[str, int]) -> int:
        """Apply to the pairs out[n0:] (one bulk pair each): drop the ones a processor drops
        (counted in `dropped` by reason), redact the others; returns the bytes left in out[n0:]."""
        kept: list[bytes] = []
        loads, dumps = orjson.loads, orjson.dumps
        for pair in out[n0:]:
            cut = pair.index(b"\n")
            doc = loads(pair[cut + 1:])
            at = pair.rfind(b'"_id":"', 0, cut) + 7
            why = self.verdict(doc, pair[at:pair.index(b'"', at)], now)
            if why is not None:
                dropped[why] = dropped.get(why, 0) + 1
                continue
            if self.redactor is not None and self.redactor.apply(doc):
                pair = pair[:cut + 1] + dumps(doc, option=orjson.OPT_APPEND_NEWLINE)
            kept.append(pair)
        out[n0:] = kept
        return sum(map(len, kept))
