"""Unit tests for shipper.parse.filters: include/exclude lines, drop/rename fields, masking."""

from __future__ import annotations

from typing import Any

import pytest

from shipper.parse.filters import MISSING, DocTransform, LineFilter, get_field


def test_line_filter_noop() -> None:
    f = LineFilter((), ())
    assert f.is_noop and f.keep("anything")


def test_include_only() -> None:
    f = LineFilter([r"\bERROR\b", r"\bWARN"], [])
    assert not f.is_noop
    assert f.keep("2026-11-30 12:00:00 ERROR db down")
    assert f.keep("2026-11-30 12:00:00 WARNING slow query")
    assert not f.keep("2026-11-30 12:00:00 INFO ok")


def test_exclude_only() -> None:
    f = LineFilter([], [r'"GET /health(z)? ', r"kube-probe/"])
    assert not f.keep('10.0.0.5 - - [30/Nov/2026:12:00:00 +0000] "GET /healthz HTTP/1.1" 200 2 "-" "kube-probe/1.29"')
    assert f.keep('10.0.0.5 - - [30/Nov/2026:12:00:00 +0000] "GET /api HTTP/1.1" 200 2 "-" "curl/8"')


def test_include_then_exclude() -> None:
    # Filebeat: include_lines first, then exclude_lines
    f = LineFilter([r"ERROR"], [r"ERROR .*expected"])
    assert f.keep("ERROR payment failed")
    assert not f.keep("ERROR cache miss (expected)")
    assert not f.keep("INFO all good")


def test_transform_noop() -> None:
    t = DocTransform((), {}, {})
    doc = {"message": "x"}
    assert t.is_noop and t.apply(doc) is doc and doc == {"message": "x"}


def test_drop_nested_and_flat_dotted_fields() -> None:
    t = DocTransform(["req.headers.cookie", "password", "res.headers.set-cookie", "no.such.field"], {}, {})
    doc = {"message": "GET /cart", "password": "hunter2",
           "req": {"method": "GET", "headers": {"cookie": "sid=abc", "accept": "*/*"}},
           "res.headers": {"set-cookie": "sid=def", "etag": "x"}}
    assert t.apply(doc) is doc
    assert doc == {"message": "GET /cart",
                   "req": {"method": "GET", "headers": {"accept": "*/*"}},
                   "res.headers": {"etag": "x"}}


def test_rename_moves_values_and_creates_objects() -> None:
    t = DocTransform([], {"req.url": "url.original", "lvl": "log.level", "gone": "x"}, {})
    doc = {"message": "m", "lvl": "warn", "req": {"url": "/a", "method": "GET"}, "log": {"logger": "app"}}
    t.apply(doc)
    assert doc == {"message": "m", "req": {"method": "GET"}, "url": {"original": "/a"},
                   "log": {"logger": "app", "level": "warn"}}


def test_rename_never_overwrites() -> None:
    t = DocTransform([], {"a": "b", "c": "d.e"}, {})
    doc = {"a": 1, "b": 2, "c": 3, "d": "scalar"}
    t.apply(doc)
    assert doc == {"a": 1, "b": 2, "c": 3, "d": "scalar"}


def test_drop_runs_before_rename() -> None:
    t = DocTransform(["req.headers"], {"req": "http.request"}, {})
    doc = {"req": {"method": "GET", "headers": {"cookie": "x"}}}
    t.apply(doc)
    assert doc == {"http": {"request": {"method": "GET"}}}


CARD = r"\b(?:\d[ -]?){12,15}\d\b"
BEARER = r"(?i)\b(bearer\s+)[A-Za-z0-9._~+/-]+=*"


def test_mask_card_numbers_and_bearer_tokens_everywhere() -> None:
    t = DocTransform([], {}, {CARD: "****", BEARER: r"\1[REDACTED]"})
    doc: dict[str, Any] = {
        "@timestamp": "2026-11-30T12:00:00.000Z",
        "message": "charge card 4111 1111 1111 1111 for order 991 failed",
        "req": {"headers": {"authorization": "Bearer eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiI0MiJ9.c2lnbmF0dXJl"}},
        "cards": ["5500-0000-0000-0004", "none"],
        "attempts": 3,
        "ok": False,
    }
    t.apply(doc)
    assert doc["message"] == "charge card **** for order 991 failed"
    assert doc["req"]["headers"]["authorization"] == "Bearer [REDACTED]"
    assert doc["cards"] == ["****", "none"]
    assert doc["attempts"] == 3 and doc["ok"] is False
    assert doc["@timestamp"] == "2026-11-30T12:00:00.000Z"


def test_mask_leaves_timestamp_alone_even_if_it_matches() -> None:
    t = DocTransform([], {}, {r"\d{4}": "####"})
    doc = t.apply({"@timestamp": "2026-11-30T12:00:00.000Z", "message": "pin 1234"})
    assert doc == {"@timestamp": "2026-11-30T12:00:00.000Z", "message": "pin ####"}


def test_mask_replacement_with_bad_group_reference_fails_early() -> None:
    with pytest.raises(ValueError):
        DocTransform([], {}, {r"(secret)=\S+": r"\2=***"})


def test_get_field() -> None:
    doc = {"a": {"b": {"c": 1}}, "x.y": 2, "k": {"l.m": 3}}
    assert get_field(doc, ("a", "b", "c")) == 1
    assert get_field(doc, ("x", "y")) == 2
    assert get_field(doc, ("k", "l", "m")) == 3
    assert get_field(doc, ("a", "z")) is MISSING
    assert get_field(doc, ("nope",)) is MISSING
