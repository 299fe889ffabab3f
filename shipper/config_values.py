"""The values under the config loader: sizes, durations, `${ENV}`, cloud ids, fingerprints, and the
YAML walkers that give every error its dotted key, file and line (`Lines`, `Section`). Pure: no
file is read here; config.py builds its dataclasses on these and re-exports the public parsers."""

from __future__ import annotations

import base64
import binascii
import os
import re
from collections.abc import Mapping
from typing import Any

import yaml

from shipper.errors import ConfigError

__all__ = ["ENV_RE", "EnvValue", "Lines", "Section", "check_regex", "decode_cloud_id", "expand_env", "expand_values",
           "json_value", "line_of", "parse_duration", "parse_fingerprint", "parse_size"]

_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]i?B|B|[KMGT])?\s*$", re.IGNORECASE)
_SIZE_UNITS = {
    None: 1, "b": 1,
    "k": 1024, "kb": 1000, "kib": 1024,
    "m": 1024**2, "mb": 1000**2, "mib": 1024**2,
    "g": 1024**3, "gb": 1000**3, "gib": 1024**3,
    "t": 1024**4, "tb": 1000**4, "tib": 1024**4,
}
_DUR_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")
_DUR_UNITS = {"ms": 0.001, "s": 1.0, None: 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
ENV_RE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")
_INT_RE = re.compile(r"[+-]?\d+")
_JSON_INT_RE = re.compile(r"-?(?:0|[1-9]\d*)")
_JSON_FLOAT_RE = re.compile(r"-?(?:0|[1-9]\d*)(?:\.\d+)?(?:[eE][+-]?\d+)?")
_BOOLS = {"true": True, "yes": True, "on": True, "1": True, "false": False, "no": False, "off": False, "0": False}


class EnvValue(str):
    """A value that was exactly one `${VAR}`: its text, typed by the key that reads it.

    `bulk_max_events: ${N}` becomes a number and `verify: ${V}` a boolean, while a password such
    as `007`, `0x1F` or `on` stays the text it is (YAML's own typing would turn those into 7, 31, True).
    """

    __slots__ = ()




def parse_size(value: Any, key: str = "size") -> int:
    """`512KiB`, `5MiB`, `1GiB`, `100` (bytes) -> bytes."""
    if isinstance(value, bool):
        raise ConfigError(key, f"expected a size like 5MiB, got {value!r}")
    if isinstance(value, int):
        if value < 0:
            raise ConfigError(key, "must not be negative")
        return value
    m = _SIZE_RE.match(str(value))
    if not m:
        raise ConfigError(key, f"expected a size like 512KiB, 5MiB or 1GiB, got {value!r}")
    unit = m.group(2).lower() if m.group(2) else None
    return int(float(m.group(1)) * _SIZE_UNITS[unit])


def parse_duration(value: Any, key: str = "duration") -> float:
    """`250ms`, `10s`, `5m`, `1h`, or a number of seconds -> seconds."""
    if isinstance(value, bool):
        raise ConfigError(key, f"expected a duration like 10s, got {value!r}")
    if isinstance(value, (int, float)):
        if value < 0:
            raise ConfigError(key, "must not be negative")
        return float(value)
    m = _DUR_RE.match(str(value))
    if not m:
        raise ConfigError(key, f"expected a duration like 250ms, 10s or 5m, got {value!r}")
    return float(m.group(1)) * _DUR_UNITS[m.group(2)]


def decode_cloud_id(cloud_id: str, key: str = "cloud_id") -> str:
    """An Elastic Cloud id (`label:base64(host[:port]$es_uuid[:port]$kibana_uuid)`) -> the https URL
    of its Elasticsearch, as Beats decode it: the label is ignored, the port defaults to 443."""
    text = cloud_id.strip()
    encoded = text.rsplit(":", 1)[-1] if ":" in text else text
    try:
        decoded = base64.b64decode(encoded + "=" * (-len(encoded) % 4), validate=True).decode("utf-8")
    except (binascii.Error, ValueError, UnicodeDecodeError):
        raise ConfigError(key, "is not a cloud id (label:base64 from the deployment's page)") from None
    parts = decoded.split("$")
    if len(parts) < 2 or not parts[0] or not parts[1]:
        raise ConfigError(key, "does not decode to host$elasticsearch_id$kibana_id")
    host, port = _split_port(parts[0], "443", key)
    es_id, port = _split_port(parts[1], port, key)
    if not re.fullmatch(r"[A-Za-z0-9.-]+", host) or not re.fullmatch(r"[A-Za-z0-9-]+", es_id):
        raise ConfigError(key, "decodes to an invalid host name")
    return f"https://{es_id}.{host}:{port}"


def _split_port(word: str, default: str, key: str) -> tuple[str, str]:
    if ":" not in word:
        return word, default
    name, port = word.rsplit(":", 1)
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(key, f"decodes to an invalid port {port!r}")
    return name, port




def parse_fingerprint(value: str, key: str = "ca_fingerprint") -> str:
    """`3A:F1:..` (openssl), `3af1..` (what Elasticsearch 8 prints at first start) -> 64 lower-case hex digits."""
    hexed = re.sub(r"[\s:]", "", value).lower()
    if not re.fullmatch(r"[0-9a-f]{64}", hexed):
        raise ConfigError(key, "expected the SHA-256 fingerprint of a CA certificate: 64 hex digits, "
                               "with or without colons")
    return hexed


def expand_env(text: str, env: Mapping[str, str] | None = None) -> str:
    """Replace `${VAR}` (and `${VAR:-default}`) anywhere in the file's text."""
    env = os.environ if env is None else env

    def sub(m: re.Match[str]) -> str:
        name, default = m.group(1), m.group(2)
        if name in env:
            return env[name]
        if default is not None:
            return default
        raise ConfigError(f"${{{name}}}", "environment variable is not set")

    return ENV_RE.sub(sub, text)


class Lines:
    """Maps dotted key paths to 1-based line numbers, from the composed YAML node tree."""

    def __init__(self, file: str | None) -> None:
        self.file = file
        self.lines: dict[str, int] = {}

    def walk(self, node: yaml.Node | None, path: str) -> None:
        if node is None:
            return
        if isinstance(node, yaml.MappingNode):
            seen: set[str] = set()
            for k, v in node.value:
                sub = f"{path}.{k.value}" if path else str(k.value)
                if k.value in seen:   # YAML would silently keep the last one
                    raise ConfigError(sub, "duplicate key", self.file, k.start_mark.line + 1)
                seen.add(k.value)
                self.lines[sub] = k.start_mark.line + 1
                self.walk(v, sub)
        elif isinstance(node, yaml.SequenceNode):
            for i, v in enumerate(node.value):
                sub = f"{path}[{i}]"
                self.lines[sub] = v.start_mark.line + 1
                self.walk(v, sub)

    def error(self, key: str, message: str) -> ConfigError:
        return ConfigError(key, message, self.file, line_of(self.lines, key))


def line_of(lines: Mapping[str, int], key: str) -> int | None:
    """The line of `key`, else of the nearest enclosing key that has one (`a.b[2].c` -> `a.b[2]` -> `a.b`)."""
    line = lines.get(key)
    probe = key
    while line is None and ("." in probe or "[" in probe):
        probe = re.sub(r"(\.[^.\[]+|\[\d+\])$", "", probe)
        line = lines.get(probe)
    return line


class Section:
    """Reads one mapping, remembers which keys were used, rejects the rest."""

    def __init__(self, data: Any, path: str, lines: Lines) -> None:
        self.path = path
        self.lines = lines
        if data is None:
            data = {}
        if not isinstance(data, dict):
            raise lines.error(path or "(top level)", f"expected a mapping, got {type(data).__name__}")
        self.data: dict[str, Any] = data
        self.used: set[str] = set()

    def key(self, name: str) -> str:
        return f"{self.path}.{name}" if self.path else name

    def has(self, name: str) -> bool:
        return name in self.data

    def raw(self, name: str, default: Any = None) -> Any:
        self.used.add(name)
        return self.data.get(name, default)

    def wrap(self, name: str, fn: Any, default: Any) -> Any:
        self.used.add(name)
        if name not in self.data or self.data[name] is None:
            return default
        try:
            return fn(self.data[name], self.key(name))
        except ConfigError as e:
            raise self.lines.error(self.key(name), e.message) from None

    def size(self, name: str, default: int, minimum: int = 0, maximum: tuple[int, str] | None = None) -> int:
        """`maximum`: (bytes, why), the why said in the error."""
        v = int(self.wrap(name, parse_size, default))
        if v < minimum:
            raise self.lines.error(self.key(name), f"must be at least {minimum} bytes")
        if maximum is not None and v > maximum[0]:
            raise self.lines.error(self.key(name), f"must be at most {maximum[0]} bytes ({maximum[1]})")
        return v

    def duration(self, name: str, default: float, positive: bool = False) -> float:
        v = float(self.wrap(name, parse_duration, default))
        if positive and v <= 0:
            raise self.lines.error(self.key(name), "must be greater than zero")
        return v

    def integer(self, name: str, default: int, minimum: int = 1) -> int:
        self.used.add(name)
        v = self.data.get(name, default)
        if v is None:
            return default
        if isinstance(v, EnvValue) and _INT_RE.fullmatch(v.strip()):
            v = int(v)
        if isinstance(v, bool) or not isinstance(v, int):
            shown = str(v) if isinstance(v, str) else repr(v)
            raise self.lines.error(self.key(name), f"expected a whole number, got {shown}")
        if v < minimum:
            raise self.lines.error(self.key(name), f"must be at least {minimum}")
        return v

    def boolean(self, name: str, default: bool) -> bool:
        self.used.add(name)
        v = self.data.get(name, default)
        if v is None:
            return default
        if isinstance(v, EnvValue) and v.strip().lower() in _BOOLS:
            v = _BOOLS[v.strip().lower()]
        if not isinstance(v, bool):
            shown = str(v) if isinstance(v, str) else repr(v)
            raise self.lines.error(self.key(name), f"expected true or false, got {shown}")
        return v

    def string(self, name: str, default: str | None, choices: tuple[str, ...] | None = None) -> Any:
        self.used.add(name)
        v = self.data.get(name)
        if v is None:                      # absent or null: the default
            return default
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            v = str(v)
        if not isinstance(v, str):
            raise self.lines.error(self.key(name), f"expected a string, got {type(v).__name__}")
        v = str(v)
        if choices is not None and v not in choices:
            raise self.lines.error(self.key(name), f"must be one of {', '.join(choices)}, got {v!r}")
        return v

    def strings(self, name: str, default: tuple[str, ...] = ()) -> tuple[str, ...]:
        self.used.add(name)
        v = self.data.get(name)
        if v is None:
            return default
        if isinstance(v, str):
            v = [v]
        if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
            raise self.lines.error(self.key(name), "expected a list of strings")
        return tuple(str(x) for x in v)

    def mapping(self, name: str) -> dict[str, Any]:
        self.used.add(name)
        v = self.data.get(name)
        if v is None:
            return {}
        if not isinstance(v, dict):
            raise self.lines.error(self.key(name), "expected a mapping")
        return {str(k): x for k, x in v.items()}

    def json_mapping(self, name: str) -> dict[str, Any]:
        """A free-form mapping that goes into documents as JSON (`fields`): string keys, JSON values."""
        return json_value(self.mapping(name), self.key(name), self.lines)  # type: ignore[no-any-return]

    def finish(self) -> None:
        unknown = [k for k in self.data if k not in self.used]
        if unknown:
            k = unknown[0]
            raise self.lines.error(self.key(str(k)), "unknown key")


def json_value(v: Any, key: str, lines: Lines) -> Any:
    """YAML data -> JSON data. A `${VAR}` value is typed like JSON: `3` a number, `true` a boolean,
    anything else (`007`, `on`) the text it is. Dates and other YAML-only types become strings."""
    if isinstance(v, EnvValue):
        t = v.strip()
        if _JSON_INT_RE.fullmatch(t):
            return int(t)
        if _JSON_FLOAT_RE.fullmatch(t):
            return float(t)
        if t in ("true", "false"):
            return t == "true"
        return str(v)
    if isinstance(v, dict):
        out = {}
        for k, x in v.items():
            if not isinstance(k, str):
                k = str(k).lower() if isinstance(k, bool) else str(k)
            out[k] = json_value(x, f"{key}.{k}", lines)
        return out
    if isinstance(v, (list, tuple)):
        return [json_value(x, f"{key}[{i}]", lines) for i, x in enumerate(v)]
    if v is None or isinstance(v, (str, int, float, bool)):
        if isinstance(v, float) and v != v or v in (float("inf"), float("-inf")):
            raise lines.error(key, "NaN and infinity cannot go into a JSON document")
        return v
    if isinstance(v, (set, frozenset)):
        return [json_value(x, f"{key}[{i}]", lines) for i, x in enumerate(sorted(v, key=repr))]
    if hasattr(v, "isoformat"):
        return v.isoformat()
    if isinstance(v, bytes):
        raise lines.error(key, "binary values cannot go into a JSON document")
    return str(v)


def check_regex(value: str, key: str, lines: Lines) -> str:
    try:
        re.compile(value)
    except re.error as e:
        raise lines.error(key, f"invalid regular expression: {e}") from None
    return value


def expand_values(data: Any, path: str, lines: Lines, env: Mapping[str, str] | None) -> Any:
    """Expand `${VAR}` in every string value (never in comments). A value that is exactly one
    `${VAR}` takes the YAML type of what it expands to, so `bulk_max_events: ${N}` is a number."""
    if isinstance(data, dict):
        return {k: expand_values(v, f"{path}.{k}" if path else str(k), lines, env) for k, v in data.items()}
    if isinstance(data, list):
        return [expand_values(v, f"{path}[{i}]", lines, env) for i, v in enumerate(data)]
    if isinstance(data, str) and "${" in data:
        try:
            out = expand_env(data, env)
        except ConfigError as e:
            raise lines.error(path, f"{e.key}: {e.message}") from None
        if ENV_RE.fullmatch(data.strip()):
            # the whole value: typed by the key that reads it; empty means not set
            return EnvValue(out) if out.strip() else None
        return out
    return data
