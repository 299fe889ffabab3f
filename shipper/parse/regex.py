"""Pure regex parsing: a user's pattern with named groups, or the built-ins nginx, apache, syslog.
A line's text in, nested fields with ECS names out (None when it does not match: shipped as plain
text). Never raises on input, never reads the clock; the shaper adds `message` when no group did."""

from __future__ import annotations

import re
from typing import Any

from shipper.parse.timeparse import format_timestamp, parse_timestamp

__all__ = ["RegexParser", "BUILTIN_PATTERNS"]

BUILTIN_PATTERNS = ("nginx", "apache", "syslog")

# Combined log format (nginx's default `combined`, Apache's `%h %l %u %t "%r" %>s %b
# "%{Referer}i" "%{User-agent}i"`); referrer and user agent are optional so the common log
# format matches too. Anything after them (nginx setups often append fields) stays in message.
_QUOTED = r'"([^"\\]*(?:\\.[^"\\]*)*)"'  # unrolled: faster than (?:[^"\\]|\\.)* (docs/development.md)
_COMBINED_RE = re.compile(
    r"(\S+) \S+ (\S+) \[([^\]]+)\] " + _QUOTED + r" (\d{3}) (\d+|-)"
    r"(?: " + _QUOTED + " " + _QUOTED + ")?")

# RFC 5424: <PRI>1 TIMESTAMP HOSTNAME APP-NAME PROCID MSGID SD [MSG]; `<PRI>` optional.
_RFC5424_RE = re.compile(
    r"(?:<(\d{1,3})>)?1 (-|\d{4}-\d\d-\d\dT\S+) (\S+) (\S+) (\S+) (\S+)(?: (.*))?", re.S)
# RFC 3164 as syslog daemons write it: [<PRI>]TIMESTAMP HOST TAG[PID]: MSG. The timestamp is
# `Oct 11 22:14:15`, or RFC 3339 (rsyslog's high-precision default on current distributions).
_RFC3164_RE = re.compile(
    r"(?:<(\d{1,3})>)?"
    r"([A-Za-z]{3} {1,2}\d{1,2} \d\d:\d\d:\d\d(?:\.\d+)?|\d{4}-\d\d-\d\dT\S+) "
    r"(\S+)"
    r"(?: ([^\s\[\]:]+)(?:\[([^\]]*)\])?:(?= |$))?"
    r"(?: (.*))?", re.S)

_FACILITIES = ("kern", "user", "mail", "daemon", "auth", "syslog", "lpr", "news", "uucp", "cron",
               "authpriv", "ftp", "ntp", "security", "console", "solaris-cron",
               "local0", "local1", "local2", "local3", "local4", "local5", "local6", "local7")
_SEVERITIES = ("Emergency", "Alert", "Critical", "Error", "Warning", "Notice", "Informational",
               "Debug")
_RESERVED = ("message", "timestamp")

# RFC 5424 structured data: one or more `[SD-ID PARAM="VALUE" ...]`; `"`, `\\` and `]` escaped.
_SD_VALUE = r'"[^"\\]*(?:\\.[^"\\]*)*"'
_SD_ELEMENT = r'\[([^\s\]="]+)((?: [^\s\]="]+=' + _SD_VALUE + r')*)\]'
_SD_RE = re.compile(r"(?:" + _SD_ELEMENT + r")+")
_SD_ELEMENT_RE = re.compile(_SD_ELEMENT)
_SD_PARAM_RE = re.compile(r' ([^\s\]="]+)="([^"\\]*(?:\\.[^"\\]*)*)"')
_SD_UNESCAPE_RE = re.compile(r'\\(["\\\]])')


class RegexParser:
    r"""Parses one line's text into nested fields; the rules below.

    Raises ValueError at construction for an invalid pattern, one without named groups, or
    group names that would collide (`a` and `a__b`).

    User patterns: each named group becomes a field. Python forbids dots in group names, so a
    double underscore stands for one: `(?P<http__status>\d+)` gives `{"http": {"status":
    "200"}}`. Values stay strings. A group `message` replaces the message; a group `timestamp`
    sets `@timestamp` when its text parses (else the raw text is kept in the field `timestamp`).
    The pattern is searched anywhere in the line (anchor it with `^` to match from the start).
    """

    def __init__(self, pattern: str, tz: str = "local") -> None:
        self.pattern = pattern
        self.tz = tz
        self._regex: re.Pattern[str] | None = None
        self._groups: list[tuple[str, tuple[str, ...]]] = []
        if pattern in ("nginx", "apache"):
            self._parse = self._parse_combined
        elif pattern == "syslog":
            self._parse = self._parse_syslog
        else:
            self._compile_user(pattern)
            self._parse = self._parse_user

    def parse(self, text: str, now: float) -> dict[str, Any] | None:
        """Fields of `text` as nested dicts, or None when it does not match. `now` is epoch
        seconds, used only to give a year to times that lack one (RFC 3164)."""
        try:
            return self._parse(text, now)
        except (ValueError, IndexError, KeyError, TypeError, OverflowError):
            return None

    # ------------------------------------------------------------ user patterns

    def _compile_user(self, pattern: str) -> None:
        try:
            self._regex = re.compile(pattern)
        except re.error as e:
            raise ValueError(f"invalid regular expression: {e}") from None
        names = list(self._regex.groupindex)
        if not names:
            raise ValueError("a pattern needs at least one named group (?P<name>...)")
        paths: list[tuple[str, tuple[str, ...]]] = []
        for name in names:
            parts = tuple(p for p in name.split("__") if p)
            if not parts:
                raise ValueError(f"group name {name!r} names no field")
            paths.append((name, parts))
        taken = {parts for _, parts in paths}
        for name, parts in paths:
            for i in range(1, len(parts)):
                if parts[:i] in taken:
                    raise ValueError(
                        f"group {name!r} ({'.'.join(parts)}) collides with the field "
                        f"{'.'.join(parts[:i])!r} of another group")
            if len(parts) > 1 and parts[0] in _RESERVED:
                raise ValueError(f"group {name!r}: {parts[0]!r} is a plain field, it cannot "
                                 f"hold {'.'.join(parts)!r}")
        self._groups = paths

    def _parse_user(self, text: str, now: float) -> dict[str, Any] | None:
        assert self._regex is not None
        m = self._regex.search(text)
        if m is None:
            return None
        doc: dict[str, Any] = {}
        for name, parts in self._groups:
            value = m.group(name)
            if value is None:
                continue
            if name == "timestamp" and parts == ("timestamp",):
                if not value:
                    continue
                ts = parse_timestamp(value, now, self.tz)
                if ts is not None:
                    doc["@timestamp"] = format_timestamp(ts)
                else:
                    doc["timestamp"] = value
                continue
            if len(parts) == 1:
                doc[parts[0]] = value
                continue
            node = doc
            for p in parts[:-1]:
                node = node.setdefault(p, {})
            node[parts[-1]] = value
        return doc

    # ------------------------------------------------------------ nginx / apache

    def _parse_combined(self, text: str, now: float) -> dict[str, Any] | None:
        m = _COMBINED_RE.match(text)
        if m is None:
            return None
        addr, user, ts_text, request, status, size, referrer, agent = m.groups()
        response: dict[str, Any] = {"status_code": int(status)}
        if size != "-":
            response["body"] = {"bytes": int(size)}
        http: dict[str, Any] = {"response": response}
        doc: dict[str, Any] = {"source": {"address": addr}, "http": http}
        req: dict[str, Any] = {}
        # "GET /path HTTP/1.1"; HTTP/0.9 has no version; "-" or TLS bytes sent to a plain
        # port ("\x16\x03\x01...") are no request at all and stay only in the message.
        parts = request.split(" ")
        if len(parts) >= 2 and parts[0].isalpha() and parts[0].isascii():
            if len(parts) >= 3 and parts[-1].startswith("HTTP/"):
                http["version"] = parts[-1][5:]
                url = " ".join(parts[1:-1])
            else:
                url = " ".join(parts[1:])
            req["method"] = parts[0]
            doc["url"] = {"original": url}
        if referrer is not None and referrer != "-":
            req["referrer"] = referrer
        if req:
            http["request"] = req
        if user != "-":
            doc["user"] = {"name": user}
        if agent is not None and agent != "-":
            doc["user_agent"] = {"original": agent}
        self._set_time(doc, ts_text, now)
        return doc

    # ------------------------------------------------------------ syslog

    def _parse_syslog(self, text: str, now: float) -> dict[str, Any] | None:
        m = _RFC5424_RE.match(text)
        if m is not None:
            return self._rfc5424(m, now)
        m = _RFC3164_RE.match(text)
        if m is not None:
            return self._rfc3164(m, now)
        return None

    def _rfc5424(self, m: re.Match[str], now: float) -> dict[str, Any] | None:
        pri, ts_text, host, app, procid, msgid, rest = m.groups()
        doc: dict[str, Any] = {}
        syslog: dict[str, Any] = {}
        if pri is not None and not _add_priority(syslog, pri):
            return None
        if host != "-":
            doc["host"] = {"hostname": host}
        process: dict[str, Any] = {}
        if app != "-":
            process["name"] = app
        if procid != "-":
            if procid.isdigit():
                process["pid"] = int(procid)
            else:
                syslog["procid"] = procid
        if process:
            doc["process"] = process
        if msgid != "-":
            syslog["msgid"] = msgid
        message = None
        if rest is not None:
            if rest.startswith("-"):
                message = rest[2:] if rest.startswith("- ") else (rest[1:] or None)
            elif rest.startswith("["):
                sd, tail = _structured_data(rest)
                if sd is not None:
                    syslog["structured_data"] = sd
                    message = tail
                else:
                    message = rest  # malformed SD: keep it all as message, nothing is lost
            else:
                message = rest
        if message:
            if message[0] == "\ufeff":  # RFC 5424 marks a UTF-8 MSG with a BOM
                message = message[1:]
            if message:
                doc["message"] = message
        if syslog:
            doc["log"] = {"syslog": syslog}
        if ts_text != "-":
            self._set_time(doc, ts_text, now)
        return doc

    def _rfc3164(self, m: re.Match[str], now: float) -> dict[str, Any] | None:
        pri, ts_text, host, app, pid, message = m.groups()
        doc: dict[str, Any] = {"host": {"hostname": host}}
        if pri is not None:
            syslog: dict[str, Any] = {}
            if not _add_priority(syslog, pri):
                return None
            doc["log"] = {"syslog": syslog}
        if app is not None:
            process: dict[str, Any] = {"name": app}
            if pid:
                if pid.isdigit():
                    process["pid"] = int(pid)
                else:
                    doc.setdefault("log", {}).setdefault("syslog", {})["procid"] = pid
            doc["process"] = process
        if message:
            doc["message"] = message
        self._set_time(doc, ts_text, now)
        return doc

    # ------------------------------------------------------------ shared

    def _set_time(self, doc: dict[str, Any], ts_text: str, now: float) -> None:
        ts = parse_timestamp(ts_text, now, self.tz)
        if ts is not None:
            doc["@timestamp"] = format_timestamp(ts)
        else:
            doc["timestamp"] = ts_text


def _add_priority(syslog: dict[str, Any], pri_text: str) -> bool:
    pri = int(pri_text)
    if pri > 191:
        return False
    facility, severity = pri >> 3, pri & 7
    syslog["priority"] = pri
    syslog["facility"] = {"code": facility, "name": _FACILITIES[facility]}
    syslog["severity"] = {"code": severity, "name": _SEVERITIES[severity]}
    return True


def _structured_data(text: str) -> tuple[dict[str, Any] | None, str | None]:
    """Parse `[id k="v" ...][id2 ...] MSG` -> ({id: {k: v}}, MSG). (None, None) if malformed.
    A parameter that repeats inside one element becomes a list."""
    m = _SD_RE.match(text)
    if m is None:
        return None, None
    end = m.end()
    if end < len(text) and text[end] != " ":
        return None, None
    sd: dict[str, Any] = {}
    for element in _SD_ELEMENT_RE.finditer(text, 0, end):
        params: dict[str, Any] = {}
        sd[element.group(1)] = params
        for name, value in _SD_PARAM_RE.findall(element.group(2)):
            if "\\" in value:
                value = _SD_UNESCAPE_RE.sub(r"\1", value)
            if name in params:
                prev = params[name]
                params[name] = prev + [value] if isinstance(prev, list) else [prev, value]
            else:
                params[name] = value
    return sd, text[end + 1:] or None
