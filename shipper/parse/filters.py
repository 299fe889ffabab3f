"""Pure per-input shaping: which lines to keep (`include_lines`/`exclude_lines`) and what to do
to a built doc (`drop_fields`, `rename_fields`, `mask`). Config regexes in, decisions out.
Called by `document.py` on a line's text before parsing and on the doc before it is queued.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["LineFilter", "DocTransform", "split_path", "get_field"]

MISSING: Any = object()


class LineFilter:
    """Filebeat semantics: with `include` patterns only lines matching one of them are kept;
    then lines matching any `exclude` pattern are dropped. Patterns are searched anywhere in
    the line (anchor them with `^`)."""

    def __init__(self, include: Sequence[str], exclude: Sequence[str]) -> None:
        self._include = [re.compile(p) for p in include]
        self._exclude = [re.compile(p) for p in exclude]

    @property
    def is_noop(self) -> bool:
        return not self._include and not self._exclude

    def keep(self, text: str) -> bool:
        return self.drop_reason(text) is None

    def drop_reason(self, text: str) -> str | None:
        """None: the line is kept; else the key that drops it (`include_lines`, `exclude_lines`)."""
        if self._include:
            for p in self._include:
                if p.search(text) is not None:
                    break
            else:
                return "include_lines"
        for p in self._exclude:
            if p.search(text) is not None:
                return "exclude_lines"
        return None


class DocTransform:
    """Applies, in this order: `drop_fields`, then `rename_fields` (both name fields of the doc
    as parsed, dotted names reaching into nested objects), then `mask`.

    - drop: a missing field is no error.
    - rename `{from: to}` moves the value, creating nested objects for `to`. It never
      overwrites: when `to` already exists (or a part of its path is not an object) the field
      stays where it was.
    - mask `{regex: replacement}` runs `re.sub` on every string value of the doc, `message`
      included, at any depth and inside lists; `@timestamp` and keys are left alone.
      The replacement may use `\\1` / `\\g<name>`.

    Raises ValueError at construction for a replacement that refers to a missing group.
    """

    def __init__(self, drop_fields: Sequence[str], rename_fields: Mapping[str, str],
                 mask: Mapping[str, str]) -> None:
        self._drop = [split_path(f) for f in drop_fields]
        self._rename = [(split_path(a), split_path(b)) for a, b in rename_fields.items()]
        self._mask: list[tuple[re.Pattern[str], str]] = []
        for pattern, replacement in mask.items():
            regex = re.compile(pattern)
            replacement = "" if replacement is None else str(replacement)
            try:
                regex.sub(replacement, "")  # compiles the template: bad group refs fail now
            except (re.error, IndexError) as e:
                raise ValueError(f"mask {pattern!r}: invalid replacement {replacement!r}: {e}") from None
            self._mask.append((regex, replacement))

    @property
    def is_noop(self) -> bool:
        return not self._drop and not self._rename and not self._mask

    def apply(self, doc: dict[str, Any]) -> dict[str, Any]:
        """Changes `doc` in place and returns it."""
        for parts in self._drop:
            found = _locate(doc, parts)
            if found is not None:
                del found[0][found[1]]
        for src, dst in self._rename:
            found = _locate(doc, src)
            if found is None:
                continue
            container, key = found
            value = container.pop(key)
            if not _insert(doc, dst, value):
                container[key] = value
        if self._mask:
            for key, value in doc.items():
                if key != "@timestamp":
                    doc[key] = self._masked(value)
        return doc

    def _masked(self, value: Any) -> Any:
        if isinstance(value, str):
            for regex, replacement in self._mask:
                value = regex.sub(replacement, value)
            return value
        if isinstance(value, dict):
            for k, v in value.items():
                value[k] = self._masked(v)
            return value
        if isinstance(value, list):
            return [self._masked(v) for v in value]
        return value


# ---------------------------------------------------------------- dotted paths

def split_path(name: str) -> tuple[str, ...]:
    return tuple(name.split("."))


def get_field(doc: dict[str, Any], parts: tuple[str, ...]) -> Any:
    """The value at a dotted path, or MISSING. `a.b` finds `{"a": {"b": v}}` and also
    `{"a.b": v}` (JSON logs carry such flat keys); the nested reading wins when both exist."""
    if len(parts) == 1:
        return doc.get(parts[0], MISSING)
    found = _locate(doc, parts)
    return MISSING if found is None else found[0][found[1]]


def _locate(d: dict[str, Any], parts: tuple[str, ...], i: int = 0) -> tuple[dict[str, Any], str] | None:
    """(container, key) holding the value at parts[i:], trying nested objects first, then keys
    that contain dots."""
    n = len(parts)
    for j in range(i + 1, n + 1):
        key = parts[i] if j == i + 1 else ".".join(parts[i:j])
        if key not in d:
            continue
        if j == n:
            return d, key
        sub = d[key]
        if isinstance(sub, dict):
            found = _locate(sub, parts, j)
            if found is not None:
                return found
    return None


def _insert(doc: dict[str, Any], parts: tuple[str, ...], value: Any) -> bool:
    """Set a new field at a dotted path, creating objects; False (doc unchanged) if taken."""
    node = doc
    for p in parts[:-1]:
        nxt = node.get(p, MISSING)
        if nxt is MISSING:
            nxt = node[p] = {}
        elif not isinstance(nxt, dict):
            return False
        node = nxt
    if parts[-1] in node:
        return False
    node[parts[-1]] = value
    return True
