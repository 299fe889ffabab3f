"""Pure: the Elastic Common Schema fields of a pino, bunyan or pino-http line (SPEC: "ECS fields for
pino, bunyan and pino-http"), added to a parsed JSON line before enrichment's. The reference of the
C mapping in _native.c, which hands every line it cannot map exactly to `apply_ecs`."""

from __future__ import annotations

import math
from typing import Any

import orjson

from shipper.config import EcsMode

_INT64_MIN = -(2 ** 63)
_INT64_END = 2 ** 63
_NS_END = 9.223372036854775808e18     # 2**63 as a float: event.duration must fit a long


def _string(v: Any) -> Any:
    return v if type(v) is str else None


def _int64(v: Any) -> Any:
    return v if type(v) is int and _INT64_MIN <= v < _INT64_END else None


def _request_id(v: Any) -> Any:
    """pino-http's default genReqId counts (a number); a keyword either way: a number as its text."""
    if type(v) is str:
        return v
    return str(v) if type(v) is int and _INT64_MIN <= v < _INT64_END else None


def duration_ns(v: Any) -> int | None:
    """pino-http's `responseTime` (milliseconds, a JSON number) -> integer nanoseconds, rounded half
    to even from the double `ms * 1e6` (as the C path computes it); None when out of a long's range."""
    if type(v) is not int and type(v) is not float:
        return None
    ns = float(v) * 1e6
    if not (-_NS_END <= ns < _NS_END) or math.isnan(ns):
        return None
    return round(ns)


# (source path, target path, the value's check and conversion: None leaves the source alone)
_MAP: tuple[tuple[tuple[str, ...], tuple[str, ...], Any], ...] = (
    (("trace_id",), ("trace", "id"), _string),
    (("span_id",), ("span", "id"), _string),
    (("transaction_id",), ("transaction", "id"), _string),
    (("err", "type"), ("error", "type"), _string),
    (("err", "message"), ("error", "message"), _string),
    (("err", "stack"), ("error", "stack_trace"), _string),
    (("pid",), ("process", "pid"), _int64),
    (("hostname",), ("host", "hostname"), _string),
    (("name",), ("service", "name"), _string),
    (("req", "id"), ("http", "request", "id"), _request_id),
    (("req", "method"), ("http", "request", "method"), _string),
    (("req", "url"), ("url", "original"), _string),
    (("req", "remoteAddress"), ("client", "address"), _string),
    (("req", "remotePort"), ("client", "port"), _int64),
    (("req", "headers", "user-agent"), ("user_agent", "original"), _string),
    (("res", "statusCode"), ("http", "response", "status_code"), _int64),
    (("responseTime",), ("event", "duration"), duration_ns),
)
# the top-level keys the mapping writes under (in the order of _native.c's R_x bits), and the ones it reads
ROOT_BITS = ("trace", "span", "transaction", "error", "process", "host", "service", "http", "url", "client",
             "user_agent", "event")
ROOTS = frozenset(t[0] for _s, t, _c in _MAP)
_PRIMARY = frozenset(t for _s, t, _c in _MAP)
SOURCE_KEYS = frozenset(s[0] for s, _t, _c in _MAP)


def _source(doc: dict[str, Any], path: tuple[str, ...]) -> Any:
    v: Any = doc
    for k in path:
        if type(v) is not dict:
            return None
        v = v.get(k)
    return v


# the table's rows by the top-level key they read, in the table's order
_BY_KEY: dict[str, list[tuple[tuple[str, ...], tuple[str, ...], Any]]] = {}
for _row in _MAP:
    _BY_KEY.setdefault(_row[0][0], []).append(_row)


def ecs_values(doc: dict[str, Any]) -> list[tuple[tuple[str, ...], tuple[str, ...], Any]]:
    """(source path, target path, value) for every source of the right type in `doc`, in the
    order of SPEC's table by top-level key (`req.url` gives url.original, url.path and, when not
    empty, url.query). Whether the target is free is not looked at here."""
    out: list[tuple[tuple[str, ...], tuple[str, ...], Any]] = []
    rows = [r for k in _BY_KEY if k in doc for r in _BY_KEY[k]]
    for src, tgt, check in rows:
        raw = doc[src[0]]
        if raw is None:
            continue
        v = check(_source(doc, src) if len(src) > 1 else raw)
        if v is None:
            continue
        out.append((src, tgt, v))
        if tgt == ("url", "original"):
            path, _sep, query = v.partition("?")
            out.append((src, ("url", "path"), path))
            if query:
                out.append((src, ("url", "query"), query))
    return out


def _dotted(node: dict[str, Any]) -> list[str]:
    """The keys of `node` with a dot in them (JSON logs carry `"url.path": ...`); usually none."""
    return [k for k in node if "." in k] if "." in "".join(node) else []


def _is_free(node: dict[str, Any], parts: tuple[str, ...], i: int) -> bool:
    """Can the field parts[i:] be set under `node` without overwriting a value or putting a
    value where an object is (or an object where a value is), read as Elasticsearch reads
    objects and dotted keys alike?"""
    last = i == len(parts) - 1
    v = node.get(parts[i])
    if parts[i] in node:
        if last or type(v) is not dict or not _is_free(v, parts, i + 1):
            return False
    for k in _dotted(node):
        kp = k.split(".")
        rest = parts[i:]
        n = min(len(kp), len(rest))
        if tuple(kp[:n]) != rest[:n]:
            continue
        if len(kp) >= len(rest):
            return False               # the field itself, or something inside it, is there
        sub = node[k]
        if type(sub) is not dict or not _is_free(sub, parts, i + len(kp)):
            return False
    return True


def _set(doc: dict[str, Any], parts: tuple[str, ...], value: Any) -> None:
    node = doc
    for k in parts[:-1]:
        nxt = node.get(k)
        if nxt is None:
            nxt = node[k] = {}
        node = nxt
    node[parts[-1]] = value


def apply_ecs(doc: dict[str, Any], mode: EcsMode, taken: dict[str, Any] | None = None) -> None:
    """Add the ECS fields to a parsed JSON line, in place. `replace` then removes each original
    that was copied, and an object (`err`, `req`, `req.headers`, `res`) left empty by that.
    `taken`: fields a source adds after this, which win over the mapping (the journal's `_PID` as
    process.pid: what the kernel vouches for, not what the line says).

    Rules: a source of the wrong type is left where it is; a field the line already has in its
    ECS form (nested or with dotted keys) is never overwritten, and nothing is put where the
    line has a value that is not an object (no mapping conflict of our making).
    tests/unit/test_ecs.py holds the C mapping equal to this one by hypothesis.
    """
    if mode == "off" or SOURCE_KEYS.isdisjoint(doc):
        return
    copied: list[tuple[str, ...]] = []
    dotted = [k.split(".", 1)[0] for k in _dotted(doc)]
    made: set[str] = set()          # objects this call made: they hold nothing but its own fields
    for src, tgt, v in ecs_values(doc):
        # the usual line has no object of the target's name, nor a dotted key under it: free
        root = tgt[0]
        free = root in made or (root not in doc and root not in dotted) or _is_free(doc, tgt, 0)
        if free and (taken is None or _is_free(taken, tgt, 0)):
            if root not in doc and root not in dotted:
                made.add(root)
            _set(doc, tgt, v)
            if mode == "replace" and tgt in _PRIMARY:
                copied.append(src)      # url.path and url.query alone do not hold all of req.url
    for src in copied:
        _remove(doc, src)


def _remove(doc: dict[str, Any], src: tuple[str, ...]) -> None:
    chain = [doc]
    for k in src[:-1]:
        chain.append(chain[-1][k])
    del chain[-1][src[-1]]
    for depth in range(len(src) - 1, 0, -1):
        if chain[depth]:
            break
        del chain[depth - 1][src[depth - 1]]


_NOTHING = (b"", b"")


def root_mask(keys: frozenset[str]) -> int:
    """The C path's bits for the ECS objects among `keys` (the input's fields)."""
    return sum(1 << i for i, r in enumerate(ROOT_BITS) if r in keys)


def splice_parts(d: dict[str, Any], mode: EcsMode, fixed: frozenset[str] = frozenset()) -> tuple[bytes, bytes] | None:
    """For the splice paths, which write added fields in front of the line and leave the line as it
    is: (`,"hostname":..` to go inside host, the other ECS objects as `,"root":{..}` members); None
    when the line needs `apply_ecs` (an ECS field would go where the line has that object already,
    which it merges; `replace` with anything to map, which edits the line). `fixed`: the ECS
    objects the input's fields write (merged after the mapping): taken as the line's own. The same
    document as `apply_ecs` gives."""
    if mode == "off" or SOURCE_KEYS.isdisjoint(d):
        return _NOTHING
    vals = ecs_values(d)
    if not vals:
        return _NOTHING
    if mode == "replace":
        return None
    tree: dict[str, Any] = {}
    for _src, tgt, v in vals:
        _set(tree, tgt, v)
    dotted = _dotted(d)
    for root in tree:
        if root in d or root in fixed or any(k.startswith(root + ".") for k in dotted):
            return None
    host = tree.pop("host", None)
    dumps = orjson.dumps
    hostname = b',"hostname":' + dumps(host["hostname"]) if host is not None else b""
    return hostname, b"".join(b',"' + k.encode() + b'":' + dumps(v) for k, v in tree.items())


def copies_of(path: tuple[str, ...]) -> list[tuple[str, ...]]:
    """The ECS fields the source at `path` is copied to (`("req", "url")` -> url.original, url.path,
    url.query); [] when it is no source. Redacting a source removes these copies too."""
    out = [tgt for src, tgt, _c in _MAP if src == path]
    if ("url", "original") in out:
        out += [("url", "path"), ("url", "query")]
    return out
