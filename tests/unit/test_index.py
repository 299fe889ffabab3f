"""Unit tests for shipper.parse.index: strftime in UTC, field references, name sanitising."""

from __future__ import annotations

import calendar

from shipper.parse.index import IndexRouter, sanitize_index

T = calendar.timegm((2026, 11, 30, 23, 59, 59)) + 0.999


def test_default_daily_pattern_across_a_day_boundary() -> None:
    r = IndexRouter("logs-%Y.%m.%d")
    assert r.route({}, T) == "logs-2026.11.30"
    assert r.route({}, T + 0.001) == "logs-2026.12.01"        # midnight UTC
    assert r.route({}, T) == "logs-2026.11.30"                 # cached buckets don't leak
    assert r.route({}, calendar.timegm((2026, 12, 31, 23, 0, 0))) == "logs-2026.12.31"
    assert r.route({}, calendar.timegm((2027, 1, 1, 0, 0, 0))) == "logs-2027.01.01"


def test_hourly_pattern() -> None:
    r = IndexRouter("logs-%Y.%m.%d-%H")
    assert r.route({}, T) == "logs-2026.11.30-23"
    assert r.route({}, T - 3600) == "logs-2026.11.30-22"


def test_logsene_token_and_plain_names_are_returned_as_is_lowercased() -> None:
    token = "1a2b3c4d-5E6F-7a8b-9c0d-1e2f3a4b5c6d"
    assert IndexRouter(token).route({"service": "x"}, T) == token.lower()
    assert IndexRouter("my-app").route({}, T) == "my-app"


def test_field_references_nested_and_missing() -> None:
    r = IndexRouter("{service.name}-{env|prod}-%Y.%m")
    assert r.route({"service": {"name": "Billing-API"}, "env": "staging"}, T) == "billing-api-staging-2026.11"
    assert r.route({"service": {"name": "billing"}}, T) == "billing-prod-2026.11"
    assert r.route({}, T) == "unknown-prod-2026.11"
    assert r.route({"service": {"name": {"nested": 1}}}, T) == "unknown-prod-2026.11"   # not a scalar
    assert r.route({"service": {"name": ["a"]}}, T) == "unknown-prod-2026.11"
    assert r.route({"service": {"name": None}}, T) == "unknown-prod-2026.11"
    assert r.route({"service": {"name": ""}}, T) == "unknown-prod-2026.11"
    assert r.route({"service.name": "flat"}, T) == "flat-prod-2026.11"                  # flat dotted key


def test_field_values_are_not_strftime_directives() -> None:
    r = IndexRouter("app-{tag}-%Y")
    assert r.route({"tag": "%Y"}, T) == "app-%y-2026"


def test_scalar_types() -> None:
    r = IndexRouter("x-{v}")
    assert r.route({"v": 42}, T) == "x-42"
    assert r.route({"v": True}, T) == "x-true"
    assert r.route({"v": 1.5}, T) == "x-1.5"


def test_refused_characters_are_replaced() -> None:
    r = IndexRouter("logs-{app}")
    assert r.route({"app": 'My App/v2:*?"<>|,#\\x'}, T) == "logs-my_app_v2__________x"


def test_sanitize_rules() -> None:
    assert sanitize_index("-_+Logs") == "logs"
    assert sanitize_index(".") == "unknown"
    assert sanitize_index("..") == "unknown"
    assert sanitize_index("___") == "unknown"
    assert sanitize_index(".hidden") == ".hidden"
    long = sanitize_index("ü" * 200)                  # 400 bytes of UTF-8
    assert len(long.encode()) <= 255 and long == "ü" * 127


def test_field_only_pattern_with_bad_value() -> None:
    r = IndexRouter("{app}")
    assert r.route({"app": ".."}, T) == "unknown"
    assert r.route({"app": "-x"}, T) == "x"


def test_unmatched_brace_is_literal() -> None:
    assert IndexRouter("logs-{oops-%Y").route({}, T) == "logs-{oops-2026"
