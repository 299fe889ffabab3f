"""Pure index routing: the index name pattern + a doc + its event time -> an index name.
`%Y.%m.%d`-style directives use the event's time in UTC, `{field}` / `{a.b}` a value of the doc
(`{field|default}` the fallback, else `unknown`); the result is made acceptable to Elasticsearch."""

from __future__ import annotations

import re
import time
from typing import Any

from shipper.parse.filters import MISSING, get_field, split_path

__all__ = ["IndexRouter", "field_refs", "field_text", "sanitize_index"]

_REF_RE = re.compile(r"\{([^{}|]+)(?:\|([^{}]*))?\}")
# Characters Elasticsearch refuses in index names (plus other whitespace, which it accepts but
# no one means).
_REFUSED_RE = re.compile(r'[\\/*?"<>|,#:\s]')
_FINER_THAN_HOUR = set("MSsTXcrRf")
_HOURLY = set("HIpkl")
_CACHE_MAX = 4096
_MAX_NAME_BYTES = 255


class IndexRouter:
    """Index names from a pattern like `logs-%Y.%m.%d` or `{service|app}-%Y.%m`.

    A pattern with neither `%` nor `{` (a plain name, or a Logsene token) is returned as is,
    lower-cased. Otherwise the result is lower-cased; `\\ / * ? " < > | , # :` and whitespace
    become `_`; leading `-`, `_`, `+` are removed; it is cut to 255 bytes; and a name that ends
    up empty, `.` or `..` becomes `unknown`. A field that is missing, empty, or not a scalar
    (an object, a list, null) takes the fallback. A `{` with no matching `}` is literal text.
    """

    def __init__(self, pattern: str) -> None:
        self.pattern = pattern
        self._static: str | None = None
        if "%" not in pattern and "{" not in pattern:
            self._static = pattern.lower()
            return
        self._literals, self._refs = field_refs(pattern)
        directives = {lit[i + 1] for lit in self._literals for i in range(len(lit) - 1) if lit[i] == "%"}
        self._has_time = bool(directives)
        if directives & _FINER_THAN_HOUR:
            self._bucket_s = 1
        elif directives & _HOURLY:
            self._bucket_s = 3600
        else:
            self._bucket_s = 86400
        self._rendered: dict[int, list[str]] = {}        # bucket -> literals with time filled in
        self._names: dict[tuple[Any, ...], str] = {}      # (bucket, *field values) -> final name

    def route(self, doc: dict[str, Any], ts: float) -> str:
        """The index for `doc`, whose event time is `ts` (epoch seconds)."""
        if self._static is not None:
            return self._static
        bucket = int(ts // self._bucket_s) if self._has_time else 0
        if not self._refs:
            name = self._names.get((bucket,))
            if name is None:
                name = self._remember((bucket,), "".join(self._render(bucket)))
            return name
        values = tuple(field_text(get_field(doc, path), default) for path, default in self._refs)
        key = (bucket, *values)
        name = self._names.get(key)
        if name is None:
            lits = self._render(bucket)
            out = [lits[0]]
            for value, lit in zip(values, lits[1:], strict=True):
                out.append(value)
                out.append(lit)
            name = self._remember(key, "".join(out))
        return name

    def _render(self, bucket: int) -> list[str]:
        lits = self._rendered.get(bucket)
        if lits is None:
            try:
                t = time.gmtime(bucket * self._bucket_s)
            except (OverflowError, OSError, ValueError):
                t = time.gmtime(0)
            lits = []
            for lit in self._literals:
                if "%" in lit:
                    try:
                        lit = time.strftime(lit, t)
                    except ValueError:
                        pass
                lits.append(lit)
            if len(self._rendered) >= _CACHE_MAX:
                self._rendered.clear()
            self._rendered[bucket] = lits
        return lits

    def _remember(self, key: tuple[Any, ...], raw: str) -> str:
        name = sanitize_index(raw)
        if len(self._names) >= _CACHE_MAX:
            self._names.clear()
        self._names[key] = name
        return name


def sanitize_index(raw: str) -> str:
    """Make `raw` a name Elasticsearch accepts (see IndexRouter)."""
    name = _REFUSED_RE.sub("_", raw.lower()).lstrip("-_+")
    encoded = name.encode("utf-8")
    if len(encoded) > _MAX_NAME_BYTES:
        name = encoded[:_MAX_NAME_BYTES].decode("utf-8", "ignore")
    if name in ("", ".", ".."):
        return "unknown"
    return name


def field_refs(pattern: str) -> tuple[list[str], list[tuple[tuple[str, ...], str]]]:
    """A pattern's literal parts and, between them, its `{field|fallback}` references as (dotted
    path, fallback: `unknown` when none is given). len(literals) == len(refs) + 1."""
    literals: list[str] = []
    refs: list[tuple[tuple[str, ...], str]] = []
    pos = 0
    for m in _REF_RE.finditer(pattern):
        literals.append(pattern[pos:m.start()])
        default = m.group(2)
        refs.append((split_path(m.group(1).strip()), "unknown" if default is None else default))
        pos = m.end()
    literals.append(pattern[pos:])
    return literals, refs


def field_text(value: Any, default: str) -> str:
    """A field's value as a `{field}` reference renders it: missing, empty, null or not a scalar
    gives the fallback."""
    if value is MISSING or value is None or value == "" or isinstance(value, (dict, list)):
        return default
    if value is True:
        return "true"
    if value is False:
        return "false"
    return str(value)
