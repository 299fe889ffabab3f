"""Our own logs: JSON lines, and secrets redacted in messages, fields and tracebacks."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator

import pytest

from shipper import logs


@pytest.fixture
def capture() -> Iterator[io.StringIO]:
    buf = io.StringIO()
    logs.setup_logging("debug", buf)
    yield buf
    logging.getLogger().handlers.clear()


def _lines(buf: io.StringIO) -> list[dict]:
    return [json.loads(x) for x in buf.getvalue().splitlines()]


def test_registered_secrets_never_appear(capture: io.StringIO) -> None:
    logs.register_secret("hunter2-very-secret")
    log = logging.getLogger("shipper.test")
    log.warning("output failed", extra={"error": "auth failed for hunter2-very-secret", "nested": {"a": ["hunter2-very-secret"]}})
    try:
        raise RuntimeError("boom hunter2-very-secret")
    except RuntimeError:
        log.exception("with traceback")
    out = capture.getvalue()
    assert "hunter2-very-secret" not in out
    first, second = _lines(capture)
    assert first["msg"] == "output failed" and first["level"] == "warning" and "***" in first["error"]
    assert first["nested"] == {"a": ["***"]}
    assert "***" in second["error"]


def test_credentials_in_urls_and_headers_are_redacted_even_unregistered() -> None:
    assert logs.redact("GET http://elastic:changeme@es:9200/_bulk") == "GET http://***@es:9200/_bulk"
    assert "c2VjcmV0" not in logs.redact("Authorization: Basic c2VjcmV0")
    assert "abc123key" not in logs.redact('{"api_key": "abc123key"}')
    assert "pw-xyz" not in logs.redact("password=pw-xyz")


def test_short_values_are_not_registered() -> None:
    logs.register_secret("ab")                # would blank out every "ab" in every line
    logs.register_secret(None)
    assert logs.redact("about tab") == "about tab"
