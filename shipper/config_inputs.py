"""`inputs[]` of the config: the dataclasses an input is read into, and the reader of one entry
(globs or journald, format, multiline, filters, processors). Errors are ConfigErrors naming the
key; config.py reads the rest of the file and re-exports these names."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from shipper.config_processors import (
    ConditionConfig,
    SampleConfig,
    ThrottleConfig,
    read_conditions,
    read_redact,
    read_sample,
    read_throttle,
)
from shipper.config_values import Lines, Section, check_regex

Format = Literal["auto", "json", "text", "regex", "docker", "cri"]
EcsMode = Literal["add", "replace", "off"]
StartAt = Literal["beginning", "end"]
Symlinks = Literal["owner", "all", "none"]     # `symlinks: owner | true | false` (SPEC, Trust boundaries)


# max_line_bytes' upper bound, 64MiB: a longer line could not be indexed anyway (Elasticsearch
# refuses a request over http.max_content_length, 100mb by default, and a line's document is
# larger than the line: added fields, JSON escapes), every line is held whole in memory on its
# way, and it keeps lengths far below the 2**31 where 32-bit counters of C parsers wrap.
MAX_LINE_BYTES_LIMIT = (64 * 1024 * 1024, "64MiB: a longer line could not be indexed, Elasticsearch refuses "
                        "requests over 100mb by default, and each line is held whole in memory")


@dataclass(frozen=True, slots=True)
class MultilineConfig:
    start: str
    max_lines: int = 500
    timeout_s: float = 1.0


@dataclass(frozen=True, slots=True)
class JournaldConfig:
    """`inputs[].journald`: the systemd journal instead of `paths`."""

    directory: str | None = None          # None: the system journal; else a directory of journal files
    units: tuple[str, ...] = ()           # only entries of these units (_SYSTEMD_UNIT); () = every entry


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
    symlinks: Symlinks = "owner"              # which symbolic links are followed: see tail/opening.py
    journald: JournaldConfig | None = None    # set: a journald input (and `paths` is empty)
    ecs: EcsMode = "add"                      # the ECS fields of pino/bunyan/pino-http keys (parse/ecs.py)
    # the processors (parse/processors.py): drop, sample, throttle, redact built documents
    drop_when: tuple[ConditionConfig, ...] = ()
    sample: tuple[SampleConfig, ...] = ()
    throttle: ThrottleConfig | None = None
    redact: tuple[str, ...] = ()


_INPUT_DEFAULTS = InputConfig(paths=())
_MULTILINE_DEFAULTS = MultilineConfig(start="")


def _journald(s: Section, lines: Lines) -> JournaldConfig | None:
    """`journald:` of an input; an input has exactly one of `paths` and `journald`."""
    if not s.has("journald"):
        return None
    if s.has("paths"):
        raise lines.error(s.key("journald"), "an input has either paths or journald, not both")
    raw = s.raw("journald")
    j = Section({} if raw is None else raw, s.key("journald"), lines)
    directory = j.string("directory", None)
    if directory is not None:
        directory = os.path.expanduser(directory)
        if not os.path.isabs(directory):
            raise lines.error(j.key("directory"), f"must be an absolute path, got {directory!r}")
    units = j.strings("units")
    for i, u in enumerate(units):
        if not u or "/" in u or any(c.isspace() for c in u):
            raise lines.error(f"{j.key('units')}[{i}]", f"expected a unit name such as app.service, got {u!r}")
    j.finish()
    for key in ("exclude", "scan_interval", "close_inactive", "symlinks"):
        if s.has(key):
            raise lines.error(s.key(key), "applies to paths only, not to a journald input")
    return JournaldConfig(directory=directory, units=units)


def read_input(data: Any, path: str, lines: Lines) -> InputConfig:
    """One entry of `inputs:` (`path` is its dotted key, for errors)."""
    s = Section(data, path, lines)
    journald = _journald(s, lines)
    paths = s.strings("paths")
    if not paths and journald is None:
        raise lines.error(s.key("paths"), "at least one glob is required (or journald: for the systemd journal)")
    for p in paths:
        if not os.path.isabs(os.path.expanduser(p)):
            raise lines.error(s.key("paths"), f"globs must be absolute paths, got {p!r}")
    fmt = s.string("format", _INPUT_DEFAULTS.format, ("auto", "json", "text", "regex", "docker", "cri"))
    pattern = s.string("pattern", None)
    if fmt == "regex":
        if not pattern:
            raise lines.error(s.key("pattern"), "format regex needs a pattern "
                                                "(a regex with named groups, or nginx, apache, syslog)")
        if pattern not in ("nginx", "apache", "syslog"):
            check_regex(pattern, s.key("pattern"), lines)
            if "(?P<" not in pattern:
                raise lines.error(s.key("pattern"), "a pattern needs at least one named group (?P<name>...)")
    multiline = None
    if s.raw("multiline") is not None:
        m = Section(s.raw("multiline"), s.key("multiline"), lines)
        start = m.string("start", None)
        if not start:
            raise lines.error(m.key("start"), "multiline needs a start regex")
        check_regex(start, m.key("start"), lines)
        multiline = MultilineConfig(start=start, max_lines=m.integer("max_lines", _MULTILINE_DEFAULTS.max_lines),
                                    timeout_s=m.duration("timeout", _MULTILINE_DEFAULTS.timeout_s, positive=True))
        m.finish()
    start_at = s.string("start_at", _INPUT_DEFAULTS.start_at, ("beginning", "end"))
    tz = s.string("timezone", _INPUT_DEFAULTS.timezone)
    if tz not in ("local", "UTC", "utc"):
        try:
            from zoneinfo import ZoneInfo
            ZoneInfo(tz)
        except Exception:
            raise lines.error(s.key("timezone"), f"unknown time zone {tz!r}") from None
    include_lines = s.strings("include_lines")
    exclude_lines = s.strings("exclude_lines")
    for i, r in enumerate(include_lines):
        check_regex(r, f"{s.key('include_lines')}[{i}]", lines)
    for i, r in enumerate(exclude_lines):
        check_regex(r, f"{s.key('exclude_lines')}[{i}]", lines)
    rename = {k: str(v) for k, v in s.mapping("rename_fields").items()}
    mask = {k: ("" if v is None else str(v)) for k, v in s.mapping("mask").items()}
    for r in mask:
        check_regex(r, f"{s.key('mask')}.{r}", lines)
    cfg = InputConfig(
        paths=paths,
        exclude=s.strings("exclude"),
        format=fmt,
        pattern=pattern,
        multiline=multiline,
        fields=s.json_mapping("fields"),
        start_at=start_at,
        scan_interval_s=s.duration("scan_interval", _INPUT_DEFAULTS.scan_interval_s, positive=True),
        index=s.string("index", None),
        max_line_bytes=s.size("max_line_bytes", _INPUT_DEFAULTS.max_line_bytes, minimum=16,
                              maximum=MAX_LINE_BYTES_LIMIT),
        timezone="UTC" if tz == "utc" else tz,
        include_lines=include_lines,
        exclude_lines=exclude_lines,
        drop_fields=s.strings("drop_fields"),
        rename_fields=rename,
        mask=mask,
        close_inactive_s=s.duration("close_inactive", _INPUT_DEFAULTS.close_inactive_s, positive=True),
        symlinks=_symlinks(s, lines),
        journald=journald,
        ecs=_ecs(s),
        drop_when=read_conditions(s, "drop_when", lines),
        sample=read_sample(s, lines),
        throttle=read_throttle(s, lines),
        redact=read_redact(s, lines),
    )
    s.finish()
    return cfg



def _symlinks(s: Section, lines: Lines) -> Symlinks:
    """`symlinks: owner | true | false` (YAML's true/false, or the words quoted)."""
    v = s.raw("symlinks")
    if isinstance(v, str):              # quoted, or from ${ENV}
        v = {"true": True, "false": False}.get(v.strip().lower(), v.strip())
    if v is None or v == "owner":
        return "owner"
    if v is True:
        return "all"
    if v is False:
        return "none"
    raise lines.error(s.key("symlinks"), f"expected owner, true or false, got {v!r}")


def _ecs(s: Section) -> EcsMode:
    if s.raw("ecs") is False:               # YAML 1.1 reads a bare `off` as false
        return "off"
    mode: EcsMode = s.string("ecs", _INPUT_DEFAULTS.ecs, ("add", "replace", "off"))
    return mode
