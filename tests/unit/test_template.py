"""The index template's pure parts: patterns from the configured indices, the priority rule, the
distribution from `GET /`, the body per distribution, and the judging of server templates."""

from __future__ import annotations

import calendar
from typing import Any

import pytest

from shipper.config import Config, load_config_text
from shipper.ship.template_body import (
    PRIORITY_BROAD,
    PRIORITY_NARROW,
    Distribution,
    ServerTemplate,
    build_template,
    identify,
    index_pattern,
    index_patterns,
    judge_indices,
    parse_templates,
    priority_for,
    uncovered,
    unsupported,
    winner,
)

NOW = calendar.timegm((2026, 12, 1, 10, 0, 0))
ES8 = Distribution("elasticsearch", (8, 15, 0), "default", "elasticsearch 8.15.0")
OS2 = Distribution("opensearch", (2, 19, 1), "default", "opensearch 2.19.1")
# Elasticsearch 8's built-in template for Elastic Agent's data streams
BUILTIN_LOGS = ServerTemplate("logs", ("logs-*-*",), 100, True)


def cfg(yaml_text: str = "") -> Config:
    return load_config_text("inputs: [{paths: ['/var/log/a.log']}]\n" + yaml_text)


@pytest.mark.parametrize("index, pattern", [
    ("logs-%Y.%m.%d", "logs-*"),
    ("logs-%Y-%m-%d", "logs-*"),
    ("Logs-App-%Y.%m", "logs-app-*"),
    ("{service|app}-%Y.%m.%d", "*"),
    ("app-{service}-%Y.%m", "app-*"),
    ("%Y.%m.%d-nginx", "*-nginx"),
    ("logs-myapp-default", "logs-myapp-default"),
    ("0f1e2d3c-aaaa-bbbb-cccc-0123456789ab", "0f1e2d3c-aaaa-bbbb-cccc-0123456789ab"),   # a Logsene token
])
def test_index_pattern(index: str, pattern: str) -> None:
    assert index_pattern(index) == pattern


def test_patterns_cover_every_index_the_config_writes() -> None:
    c = load_config_text("inputs:\n  - {paths: ['/a/*.log']}\n  - {paths: ['/b/*.log'], index: 'nginx-%Y.%m'}\n"
                         "  - {paths: ['/c/*.log'], index: 'logs-%Y.%m.%d'}\n"
                         "  - {paths: ['/d/*.log'], index: '{service}-%Y.%m'}\n")
    # `{service}-%Y.%m` would need `*`, a template for every new index on the cluster: left out
    assert index_patterns(c) == ("logs-*", "nginx-*")
    assert uncovered(c) == ["{service}-%Y.%m"]


@pytest.mark.parametrize("patterns, priority", [
    (("logs-*",), PRIORITY_BROAD),          # would take Elastic Agent's logs-*-* data streams
    (("*",), PRIORITY_BROAD),
    (("metrics-*",), PRIORITY_BROAD),
    (("logs-app-*",), PRIORITY_NARROW),     # must beat the built-in logs-*-* (100): no data stream a day
    (("logs-myapp-default",), PRIORITY_NARROW),
    (("app-*", "nginx-*"), PRIORITY_NARROW),
    (("app-*", "logs-*"), PRIORITY_BROAD),
])
def test_priority_rule(patterns: tuple[str, ...], priority: int) -> None:
    assert priority_for(patterns) == priority
    assert PRIORITY_BROAD < 100 < PRIORITY_NARROW


ES8_ROOT = {"name": "n1", "cluster_name": "c", "version": {"number": "8.15.0", "build_flavor": "default"},
            "tagline": "You Know, for Search"}


@pytest.mark.parametrize("status, body, headers, product, version, flavor", [
    (200, ES8_ROOT, {"X-Elastic-Product": "Elasticsearch"}, "elasticsearch", (8, 15, 0), "default"),
    (200, {"version": {"number": "8.11.0", "build_flavor": "serverless"}, "tagline": "You Know, for Search"}, {},
     "elasticsearch", (8, 11, 0), "serverless"),
    (200, {"version": {"number": "7.10.2", "build_flavor": "oss"}, "tagline": "You Know, for Search"}, {},
     "elasticsearch", (7, 10, 2), "oss"),
    (200, {"version": {"distribution": "opensearch", "number": "2.19.1"},
           "tagline": "The OpenSearch Project: https://opensearch.org/"}, {}, "opensearch", (2, 19, 1), "default"),
    # osmem-server: OpenSearch 3 in the body (and X-Elastic-Product in its headers): the body decides
    (200, {"version": {"distribution": "opensearch", "number": "3.8.0"}, "tagline": "The OpenSearch Project"},
     {"X-Elastic-Product": "Elasticsearch"}, "opensearch", (3, 8, 0), "default"),
    (200, {"host": "h", "version": "8.15.0", "http_address": "127.0.0.1:9600", "id": "x", "name": "h",
           "ephemeral_id": "y"}, {}, "other", (), "default"),
    (200, "<!DOCTYPE html><html>Kibana</html>", {}, "other", (), "default"),
    (404, {"error": "no handler"}, {}, "other", (), "default"),
])
def test_identify(status: int, body: Any, headers: dict[str, str], product: str, version: tuple[int, ...],
                  flavor: str) -> None:
    d = identify(status, body, headers)
    assert (d.product, d.version, d.flavor) == (product, version, flavor)
    assert d.detail


def test_what_cannot_take_a_composable_template() -> None:
    assert unsupported(ES8) is None and unsupported(OS2) is None
    old = Distribution("elasticsearch", (7, 7, 1), "default", "elasticsearch 7.7.1")
    assert "7.8 or later" in (unsupported(old) or "")
    assert "Logstash" in (unsupported(identify(200, {"http_address": "x", "ephemeral_id": "y"})) or "")


def _field(mappings: dict[str, Any], dotted: str) -> dict[str, Any]:
    node: dict[str, Any] = {"properties": mappings["properties"]}
    for part in dotted.split("."):
        node = node["properties"][part]
    return node


SPEC_KEYWORDS = ("log.level", "log.file.path", "host.name", "log.flags", "log.stream", "systemd.unit")
SPEC_NUMBERS = ("log.offset", "process.pid", "log.syslog.priority", "http.response.status_code",
                "http.response.body.bytes")


def test_the_template_maps_what_spec_lists_for_elasticsearch_8() -> None:
    body = build_template(cfg(), ES8)
    assert body["index_patterns"] == ["logs-*"] and body["priority"] == PRIORITY_BROAD
    assert "data_stream" not in body and body["_meta"]["managed_by"] == "shipper"
    m = body["template"]["mappings"]
    assert _field(m, "@timestamp") == {"type": "date"}
    assert _field(m, "message") == {"type": "match_only_text"}
    for f in SPEC_KEYWORDS:
        assert _field(m, f)["type"] == "keyword", f
    for f in SPEC_NUMBERS:
        assert _field(m, f)["type"] == "long", f
    dyn = {next(iter(d)): next(iter(d.values())) for d in m["dynamic_templates"]}
    assert dyn["kubernetes_as_keyword"]["path_match"] == "kubernetes.*"
    assert dyn["container_as_keyword"]["path_match"] == "container.*"
    # SPEC, ECS fields for pino: "keywords; numbers for process.pid, client.port,
    # http.response.status_code, event.duration; text for error.message and error.stack_trace"
    ecs = {d["path_match"]: d["mapping"]["type"] for name, d in dyn.items() if name.startswith("ecs_")}
    assert ecs == {"trace.id": "keyword", "span.id": "keyword", "transaction.id": "keyword",
                   "service.name": "keyword", "error.type": "keyword", "error.message": "match_only_text",
                   "error.stack_trace": "match_only_text", "client.address": "keyword", "client.port": "long",
                   "event.duration": "long"}
    assert all(d["mapping"]["type"] == "keyword" for name, d in dyn.items() if not name.startswith("ecs_"))
    assert list(dyn)[-1] == "strings_as_keyword"          # the ECS paths are matched before it
    for f in ("http.request.id", "url.path", "url.query", "host.hostname", "user_agent.original"):
        assert _field(m, f)["type"] == "keyword", f
    assert body["template"]["settings"]["index"]["mapping"]["total_fields"]["limit"] == 10000


def test_opensearch_gets_text_and_serverless_no_settings() -> None:
    body = build_template(cfg(), OS2)
    assert _field(body["template"]["mappings"], "message") == {"type": "text"}
    types = repr(body)
    assert "match_only_text" not in types and "flattened" not in types and "wildcard" not in types
    old = build_template(cfg(), Distribution("elasticsearch", (7, 10, 2), "oss", "elasticsearch 7.10.2"))
    assert _field(old["template"]["mappings"], "message") == {"type": "text"}
    serverless = build_template(cfg(), Distribution("elasticsearch", (8, 11, 0), "serverless", "x"))
    assert "settings" not in serverless["template"]


def test_a_data_stream_template() -> None:
    c = cfg("output:\n  elasticsearch:\n    data_stream: {dataset: myapp}\n")
    body = build_template(c, ES8)
    assert body["index_patterns"] == ["logs-myapp-default"] and body["data_stream"] == {}
    assert body["priority"] == PRIORITY_NARROW


def test_parse_templates_and_winner() -> None:
    listed = {"index_templates": [
        {"name": "logs", "index_template": {"index_patterns": ["logs-*-*"], "priority": 100, "data_stream": {}}},
        {"name": "shipper", "index_template": {"index_patterns": ["logs-app-*"], "priority": 200}},
        {"name": "legacyish", "index_template": {"index_patterns": "web-*"}},
    ]}
    ts = parse_templates(listed)
    assert ts == [BUILTIN_LOGS, ServerTemplate("shipper", ("logs-app-*",), 200, False),
                  ServerTemplate("legacyish", ("web-*",), 0, False)]
    assert winner("logs-app-2026.12.01", ts) == ts[1]
    assert winner("logs-nginx-default", ts) == BUILTIN_LOGS
    assert winner("logs-2026.12.01", ts) is None
    assert winner("web-1", ts) == ts[2]


def test_judging_finds_the_data_stream_trap() -> None:
    # beats #37117's trap: logs-app-%Y.%m.%d on Elasticsearch 8 without a template of its own
    c = cfg("output:\n  elasticsearch:\n    index: 'logs-app-%Y.%m.%d'\n    index_template: off\n")
    (f,) = judge_indices(c, [BUILTIN_LOGS], NOW)
    assert not f.ok and "logs-app-2026.12.01" in f.text and "data-stream template logs" in f.text
    ours = ServerTemplate("shipper", ("logs-app-*",), PRIORITY_NARROW, False)
    (f,) = judge_indices(c, [BUILTIN_LOGS, ours], NOW)
    assert f.ok and "template shipper" in f.text


def test_judging_finds_an_index_without_template_and_another_winner() -> None:
    off = cfg("output:\n  elasticsearch:\n    index_template: off\n")
    (f,) = judge_indices(off, [BUILTIN_LOGS], NOW)
    assert not f.ok and "no index template matches" in f.text and "logs-2026.12.01" in f.text
    auto = cfg()
    other = ServerTemplate("custom", ("logs-*",), 300, False)
    ours = ServerTemplate("shipper", ("logs-*",), PRIORITY_BROAD, False)
    (f,) = judge_indices(auto, [other, ours], NOW)
    assert not f.ok and "gets template custom" in f.text


def test_judging_a_data_stream() -> None:
    ds = cfg("output:\n  elasticsearch:\n    data_stream: {dataset: myapp}\n    index_template: off\n")
    (f,) = judge_indices(ds, [BUILTIN_LOGS], NOW)
    assert f.ok and "(data stream)" in f.text
    (f,) = judge_indices(ds, [ServerTemplate("plain", ("logs-myapp-*",), 500, False)], NOW)
    assert not f.ok and "plain index" in f.text
