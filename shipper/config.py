"""YAML -> frozen dataclasses: `${ENV}` expansion, sizes and durations, defaults, unknown keys.

Every error is a `ConfigError` naming the key (dotted path) with the file and line where known.
This module opens no logs, sockets or state: it only reads the config file it is given.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import Any, Literal, Mapping

import yaml

from shipper.errors import ConfigError

DEFAULT_CONFIG_PATH = "/etc/shipper/shipper.yaml"
LOGSENE_RECEIVER = "https://logsene-receiver.sematext.com"
LOGSENE_RECEIVER_EU = "https://logsene-receiver.eu.sematext.com"

Format = Literal["auto", "json", "text", "regex", "docker", "cri"]
StartAt = Literal["beginning", "end"]

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
_ENV_RE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")
_INT_RE = re.compile(r"[+-]?\d+")
_JSON_INT_RE = re.compile(r"-?(?:0|[1-9]\d*)")
_JSON_FLOAT_RE = re.compile(r"-?(?:0|[1-9]\d*)(?:\.\d+)?(?:[eE][+-]?\d+)?")
_BOOLS = {"true": True, "yes": True, "on": True, "1": True, "false": False, "no": False, "off": False, "0": False}


class _EnvValue(str):
    """A value that was exactly one `${VAR}`: its text, typed by the key that reads it.

    `bulk_max_events: ${N}` becomes a number and `verify: ${V}` a boolean, while a password such
    as `007`, `0x1F` or `on` stays the text it is (YAML's own typing would turn those into 7, 31, True).
    """

    __slots__ = ()


@dataclass(frozen=True, slots=True)
class MultilineConfig:
    start: str
    max_lines: int = 500
    timeout_s: float = 1.0


@dataclass(frozen=True, slots=True)
class InputConfig:
    paths: tuple[str, ...]
    exclude: tuple[str, ...] = ()
    format: Format = "auto"
    pattern: str | None = None
    multiline: MultilineConfig | None = None
    fields: Mapping[str, Any] = field(default_factory=dict)
    start_at: StartAt = "beginning"
    scan_interval_s: float = 10.0
    index: str | None = None
    max_line_bytes: int = 1024 * 1024
    timezone: str = "local"
    include_lines: tuple[str, ...] = ()
    exclude_lines: tuple[str, ...] = ()
    drop_fields: tuple[str, ...] = ()
    rename_fields: Mapping[str, str] = field(default_factory=dict)
    mask: Mapping[str, str] = field(default_factory=dict)
    close_inactive_s: float = 300.0


@dataclass(frozen=True, slots=True)
class TLSConfig:
    verify: bool = True
    ca_file: str | None = None


@dataclass(frozen=True, slots=True)
class ElasticsearchConfig:
    hosts: tuple[str, ...] = ("http://127.0.0.1:9200",)
    index: str = "logs-%Y.%m.%d"
    username: str | None = None
    password: str | None = None
    api_key: str | None = None
    compression: Literal["gzip", "none"] = "gzip"
    bulk_max_events: int = 2000
    bulk_max_bytes: int = 5 * 1024 * 1024
    flush_interval_s: float = 1.0
    flush_min_interval_s: float = 0.02    # extension: caught up, partial batches leave at most this often
    timeout_s: float = 30.0
    tls: TLSConfig = field(default_factory=TLSConfig)
    pipeline: str | None = None
    max_in_flight: int = 4


@dataclass(frozen=True, slots=True)
class QueueConfig:
    max_bytes: int = 1024**3


@dataclass(frozen=True, slots=True)
class RetryConfig:
    initial_backoff_s: float = 1.0
    max_backoff_s: float = 60.0


@dataclass(frozen=True, slots=True)
class MetricsConfig:
    listen: str | None = "127.0.0.1:9607"
    health_down_after_s: float = 60.0     # /health answers 503 once the output has been down this long


@dataclass(frozen=True, slots=True)
class Config:
    state_dir: str = "/var/lib/shipper"
    log_level: str = "info"
    shutdown_timeout_s: float = 10.0
    inputs: tuple[InputConfig, ...] = ()
    output: ElasticsearchConfig = field(default_factory=ElasticsearchConfig)
    queue: QueueConfig = field(default_factory=QueueConfig)
    retry: RetryConfig = field(default_factory=RetryConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    max_open_files: int = 1024
    clean_removed_after_s: float = 3600.0   # checkpoints of files gone and fully shipped are forgotten after this
    source: str | None = None


# ---------------------------------------------------------------- value parsers

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

    return _ENV_RE.sub(sub, text)


# ---------------------------------------------------------------- the loader

class _Lines:
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
        line = self.lines.get(key)
        probe = key
        while line is None and ("." in probe or "[" in probe):
            probe = re.sub(r"(\.[^.\[]+|\[\d+\])$", "", probe)
            line = self.lines.get(probe)
        return ConfigError(key, message, self.file, line)


class _Section:
    """Reads one mapping, remembers which keys were used, rejects the rest."""

    def __init__(self, data: Any, path: str, lines: _Lines) -> None:
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

    def size(self, name: str, default: int, minimum: int = 0) -> int:
        v = int(self.wrap(name, parse_size, default))
        if v < minimum:
            raise self.lines.error(self.key(name), f"must be at least {minimum} bytes")
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
        if isinstance(v, _EnvValue) and _INT_RE.fullmatch(v.strip()):
            v = int(v)
        if isinstance(v, bool) or not isinstance(v, int):
            raise self.lines.error(self.key(name), f"expected a whole number, got {str(v) if isinstance(v, str) else v!r}")
        if v < minimum:
            raise self.lines.error(self.key(name), f"must be at least {minimum}")
        return v

    def boolean(self, name: str, default: bool) -> bool:
        self.used.add(name)
        v = self.data.get(name, default)
        if v is None:
            return default
        if isinstance(v, _EnvValue) and v.strip().lower() in _BOOLS:
            v = _BOOLS[v.strip().lower()]
        if not isinstance(v, bool):
            raise self.lines.error(self.key(name), f"expected true or false, got {str(v) if isinstance(v, str) else v!r}")
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
        return _json_value(self.mapping(name), self.key(name), self.lines)  # type: ignore[no-any-return]

    def finish(self) -> None:
        unknown = [k for k in self.data if k not in self.used]
        if unknown:
            k = unknown[0]
            raise self.lines.error(self.key(str(k)), "unknown key")


def _json_value(v: Any, key: str, lines: _Lines) -> Any:
    """YAML data -> JSON data. A `${VAR}` value is typed like JSON: `3` a number, `true` a boolean,
    anything else (`007`, `on`) the text it is. Dates and other YAML-only types become strings."""
    if isinstance(v, _EnvValue):
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
            out[k] = _json_value(x, f"{key}.{k}", lines)
        return out
    if isinstance(v, (list, tuple)):
        return [_json_value(x, f"{key}[{i}]", lines) for i, x in enumerate(v)]
    if v is None or isinstance(v, (str, int, float, bool)):
        if isinstance(v, float) and v != v or v in (float("inf"), float("-inf")):
            raise lines.error(key, "NaN and infinity cannot go into a JSON document")
        return v
    if isinstance(v, (set, frozenset)):
        return [_json_value(x, f"{key}[{i}]", lines) for i, x in enumerate(sorted(v, key=repr))]
    if hasattr(v, "isoformat"):
        return v.isoformat()
    if isinstance(v, bytes):
        raise lines.error(key, "binary values cannot go into a JSON document")
    return str(v)


def _regex(value: str, key: str, lines: _Lines) -> str:
    try:
        re.compile(value)
    except re.error as e:
        raise lines.error(key, f"invalid regular expression: {e}") from None
    return value


def _input(data: Any, path: str, lines: _Lines) -> InputConfig:
    s = _Section(data, path, lines)
    paths = s.strings("paths")
    if not paths:
        raise lines.error(s.key("paths"), "at least one glob is required")
    for p in paths:
        if not os.path.isabs(os.path.expanduser(p)):
            raise lines.error(s.key("paths"), f"globs must be absolute paths, got {p!r}")
    fmt = s.string("format", "auto", ("auto", "json", "text", "regex", "docker", "cri"))
    pattern = s.string("pattern", None)
    if fmt == "regex":
        if not pattern:
            raise lines.error(s.key("pattern"), "format regex needs a pattern (a regex with named groups, or nginx, apache, syslog)")
        if pattern not in ("nginx", "apache", "syslog"):
            _regex(pattern, s.key("pattern"), lines)
            if "(?P<" not in pattern:
                raise lines.error(s.key("pattern"), "a pattern needs at least one named group (?P<name>...)")
    multiline = None
    if s.raw("multiline") is not None:
        m = _Section(s.raw("multiline"), s.key("multiline"), lines)
        start = m.string("start", None)
        if not start:
            raise lines.error(m.key("start"), "multiline needs a start regex")
        _regex(start, m.key("start"), lines)
        multiline = MultilineConfig(start=start, max_lines=m.integer("max_lines", 500),
                                    timeout_s=m.duration("timeout", 1.0, positive=True))
        m.finish()
    start_at = s.string("start_at", "beginning", ("beginning", "end"))
    tz = s.string("timezone", "local")
    if tz not in ("local", "UTC", "utc"):
        try:
            from zoneinfo import ZoneInfo
            ZoneInfo(tz)
        except Exception:
            raise lines.error(s.key("timezone"), f"unknown time zone {tz!r}") from None
    include_lines = s.strings("include_lines")
    exclude_lines = s.strings("exclude_lines")
    for i, r in enumerate(include_lines):
        _regex(r, f"{s.key('include_lines')}[{i}]", lines)
    for i, r in enumerate(exclude_lines):
        _regex(r, f"{s.key('exclude_lines')}[{i}]", lines)
    rename = {k: str(v) for k, v in s.mapping("rename_fields").items()}
    mask = {k: ("" if v is None else str(v)) for k, v in s.mapping("mask").items()}
    for r in mask:
        _regex(r, f"{s.key('mask')}.{r}", lines)
    if fmt == "regex" and pattern:
        from shipper.parse.regex import RegexParser
        try:
            RegexParser(pattern, "UTC")
        except ValueError as e:
            raise lines.error(s.key("pattern"), str(e)) from None
    if mask or rename or s.data.get("drop_fields"):
        from shipper.parse.filters import DocTransform
        try:
            DocTransform(s.strings("drop_fields"), rename, mask)
        except ValueError as e:
            raise lines.error(s.key("mask"), str(e)) from None
    cfg = InputConfig(
        paths=paths,
        exclude=s.strings("exclude"),
        format=fmt,
        pattern=pattern,
        multiline=multiline,
        fields=s.json_mapping("fields"),
        start_at=start_at,
        scan_interval_s=s.duration("scan_interval", 10.0, positive=True),
        index=s.string("index", None),
        max_line_bytes=s.size("max_line_bytes", 1024 * 1024, minimum=16),
        timezone="UTC" if tz == "utc" else tz,
        include_lines=include_lines,
        exclude_lines=exclude_lines,
        drop_fields=s.strings("drop_fields"),
        rename_fields=rename,
        mask=mask,
        close_inactive_s=s.duration("close_inactive", 300.0, positive=True),
    )
    s.finish()
    return cfg


def _output(data: Any, lines: _Lines) -> ElasticsearchConfig:
    top = _Section(data, "output", lines)
    es = _Section(top.raw("elasticsearch"), "output.elasticsearch", lines)
    top.finish()
    if es.has("url") and es.has("hosts"):
        raise lines.error("output.elasticsearch.url", "give either url or hosts, not both")
    if es.has("url"):
        hosts: tuple[str, ...] = (es.string("url", None),)
    else:
        hosts = es.strings("hosts", ("http://127.0.0.1:9200",))
    if not hosts or not all(hosts):
        raise lines.error("output.elasticsearch.hosts", "at least one host URL is required")
    for h in hosts:
        if not re.match(r"^https?://[^/\s]+", h):
            raise lines.error("output.elasticsearch.hosts", f"expected http:// or https:// URL, got {h!r}")
    tls = TLSConfig()
    if es.raw("tls") is not None:
        t = _Section(es.raw("tls"), "output.elasticsearch.tls", lines)
        ca = t.string("ca_file", None)
        if ca and not os.path.exists(ca):
            raise lines.error("output.elasticsearch.tls.ca_file", f"file not found: {ca}")
        tls = TLSConfig(verify=t.boolean("verify", True), ca_file=ca)
        t.finish()
    index = es.string("index", "logs-%Y.%m.%d")
    if not index:
        raise lines.error("output.elasticsearch.index", "must not be empty")
    username = es.string("username", None)
    password = es.string("password", None)
    if password is not None and username is None:
        raise lines.error("output.elasticsearch.password", "is set but output.elasticsearch.username is not")
    cfg = ElasticsearchConfig(
        hosts=tuple(h.rstrip("/") for h in hosts),
        index=index,
        username=username,
        password=password,
        api_key=es.string("api_key", None),
        compression=es.string("compression", "gzip", ("gzip", "none")),
        bulk_max_events=es.integer("bulk_max_events", 2000),
        bulk_max_bytes=es.size("bulk_max_bytes", 5 * 1024 * 1024, minimum=1024),
        flush_interval_s=es.duration("flush_interval", 1.0, positive=True),
        flush_min_interval_s=es.duration("flush_min_interval", 0.02),
        timeout_s=es.duration("timeout", 30.0, positive=True),
        tls=tls,
        pipeline=es.string("pipeline", None),
        max_in_flight=es.integer("max_in_flight", 4),
    )
    es.finish()
    return cfg


def _expand_values(data: Any, path: str, lines: _Lines, env: Mapping[str, str] | None) -> Any:
    """Expand `${VAR}` in every string value (never in comments). A value that is exactly one
    `${VAR}` takes the YAML type of what it expands to, so `bulk_max_events: ${N}` is a number."""
    if isinstance(data, dict):
        return {k: _expand_values(v, f"{path}.{k}" if path else str(k), lines, env) for k, v in data.items()}
    if isinstance(data, list):
        return [_expand_values(v, f"{path}[{i}]", lines, env) for i, v in enumerate(data)]
    if isinstance(data, str) and "${" in data:
        try:
            out = expand_env(data, env)
        except ConfigError as e:
            raise lines.error(path, f"{e.key}: {e.message}") from None
        if _ENV_RE.fullmatch(data.strip()):
            # the whole value: typed by the key that reads it; empty means not set
            return _EnvValue(out) if out.strip() else None
        return out
    return data


def load_config_text(text: str, file: str | None = None, env: Mapping[str, str] | None = None) -> Config:
    """Parse and validate config text. Raises ConfigError naming the key."""
    lines = _Lines(file)
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        raise ConfigError("(syntax)", f"invalid YAML: {getattr(e, 'problem', e)}", file,
                          mark.line + 1 if mark else None) from None
    lines.walk(node, "")
    data = _expand_values(data, "", lines, env)
    s = _Section(data, "", lines)
    inputs_raw = s.raw("inputs")
    if inputs_raw is None:
        inputs_raw = []
    if not isinstance(inputs_raw, list):
        raise lines.error("inputs", "expected a list of inputs")
    inputs = tuple(_input(d, f"inputs[{i}]", lines) for i, d in enumerate(inputs_raw))
    state_dir = s.string("state_dir", "/var/lib/shipper")
    if not state_dir:
        raise lines.error("state_dir", "must not be empty")
    if isinstance(s.data.get("log_level"), str) and s.data["log_level"].strip().lower() in ("warn", "warning", "debug", "info", "error"):
        lv = s.data["log_level"].strip().lower()
        s.data["log_level"] = "warning" if lv == "warn" else lv
    level = s.string("log_level", "info", ("debug", "info", "warning", "error"))
    output = _output(s.raw("output"), lines)
    q = _Section(s.raw("queue"), "queue", lines)
    queue = QueueConfig(max_bytes=q.size("max_bytes", 1024**3, minimum=64 * 1024))
    q.finish()
    r = _Section(s.raw("retry"), "retry", lines)
    retry = RetryConfig(initial_backoff_s=r.duration("initial_backoff", 1.0, positive=True),
                        max_backoff_s=r.duration("max_backoff", 60.0, positive=True))
    if retry.max_backoff_s < retry.initial_backoff_s:
        raise lines.error("retry.max_backoff", "must not be below retry.initial_backoff")
    r.finish()
    m = _Section(s.raw("metrics"), "metrics", lines)
    # an explicit null (or an empty ${VAR}) turns metrics off
    listen = None if m.has("listen") and m.raw("listen") is None else m.string("listen", "127.0.0.1:9607")
    if not listen:
        listen = None
    if listen is not None and not re.match(r"^(\[[0-9A-Fa-f:.]+\]|[^:\s\[\]]*):\d{1,5}$", listen):
        raise lines.error("metrics.listen", f"expected HOST:PORT (an IPv6 address in brackets: [::1]:9607), got {listen!r}")
    health_down_after_s = m.duration("health_down_after", 60.0)
    m.finish()
    cfg = Config(
        state_dir=os.path.expanduser(state_dir),
        log_level=level,
        shutdown_timeout_s=s.duration("shutdown_timeout", 10.0),
        inputs=inputs,
        output=output,
        queue=queue,
        retry=retry,
        metrics=MetricsConfig(listen=listen, health_down_after_s=health_down_after_s),
        max_open_files=s.integer("max_open_files", 1024),
        clean_removed_after_s=s.duration("clean_removed_after", 3600.0, positive=True),
        source=file,
    )
    s.finish()
    return cfg


def load_config(path: str, env: Mapping[str, str] | None = None) -> Config:
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError:
        raise ConfigError("-c", f"config file not found: {path}") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError("-c", f"cannot read config file {path}: {e}") from None
    return load_config_text(text, path, env)
