"""The daemon's own logs: JSON lines on stderr (journald-friendly), with secrets redacted here.

Callers log fixed phrases with values as `extra` fields; redaction happens in the formatter, so no
caller has to remember it. Never named logging.py.
"""

from __future__ import annotations

import logging
import re
import sys
import time
from typing import Any

import orjson

_STD_ATTRS = set(vars(logging.makeLogRecord({}))) | {"message", "asctime", "taskName"}
_URL_CRED = re.compile(r"(https?://)[^/@\s:]+:[^/@\s]*@")
_AUTH_HDR = re.compile(r"(?i)\b(authorization|api[_-]?key|password|token)(\"?\s*[:=]\s*\"?)(basic |apikey |bearer )?[^\s\",}]+")

_secrets: set[str] = set()


def register_secret(value: str | None) -> None:
    """Values that must never appear in any log line (passwords, api keys, tokens in URLs)."""
    if value and len(value) >= 4:
        _secrets.add(value)


def redact(text: str) -> str:
    text = _URL_CRED.sub(r"\1***@", text)
    text = _AUTH_HDR.sub(lambda m: f"{m.group(1)}{m.group(2)}***", text)
    for s in _secrets:
        if s in text:
            text = text.replace(s, "***")
    return text


def _clean(v: Any) -> Any:
    if isinstance(v, str):
        return redact(v)
    if isinstance(v, dict):
        return {k: _clean(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_clean(x) for x in v]
    return v


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": redact(record.getMessage()),
        }
        for k, v in record.__dict__.items():
            if k not in _STD_ATTRS and not k.startswith("_"):
                out[k] = _clean(v)
        if record.exc_info:
            out["error"] = redact(self.formatException(record.exc_info))
        return orjson.dumps(out, default=str).decode()


def setup_logging(level: str = "info", stream: Any = None) -> None:
    root = logging.getLogger()
    for h in list(root.handlers):
        root.removeHandler(h)
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter())
    root.addHandler(handler)
    root.setLevel(getattr(logging, level.upper(), logging.INFO))
    logging.getLogger("watchdog").setLevel(logging.WARNING)
    logging.getLogger("asyncio").setLevel(logging.WARNING)
