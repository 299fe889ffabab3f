"""The index template against osmem (through the FaultProxy where the wire matters): installed
before the first bulk request, an existing one left alone, `--force`, the mapping it gives, the
refusals that only warn, an output that is down, the data-stream request shape, `shipper check`'s
judging and `shipper template`'s exit codes.

osmem answers as OpenSearch 3 and has composable templates but no data streams: the data-stream
test checks what goes on the wire and answers the items in the proxy as Elasticsearch would.
"""

from __future__ import annotations

import calendar
import logging
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiohttp import web

from shipper.commands.main import main
from shipper.config import Config, load_config_text
from shipper.errors import TransportError
from shipper.events import Events
from shipper.model import Attempt
from shipper.ship.sender import Sender
from shipper.ship.template import TemplateGate, ensure_templates, guard_first_bulk, inspect
from shipper.ship.template_body import TEMPLATE_NAME
from tests.support.daemon import free_port
from tests.support.es import ES
from tests.support.fake_clock import FakeClock as SharedFakeClock
from tests.support.proxy import BulkItem, FaultProxy

NOW = calendar.timegm((2026, 12, 1, 10, 0, 0))


def FakeClock() -> SharedFakeClock:  # noqa: N802  (the tests' own name for it)
    """The shared fake clock, its wall time tied to its monotonic time (as these tests expect)."""
    return SharedFakeClock(wall=1_000.0)


def config(url: str, extra: str = "") -> Config:
    return load_config_text(f"inputs: [{{paths: ['/var/log/a.log']}}]\n"
                            f"output:\n  elasticsearch:\n    hosts: ['{url}']\n    compression: none\n{extra}"
                            "retry: {initial_backoff: 100ms, max_backoff: 1s}\n")


def sender(cfg: Config) -> tuple[Sender, TemplateGate]:
    s = Sender(cfg, Events(), FakeClock())
    gate = guard_first_bulk(s.client, cfg)
    assert gate is not None
    return s, gate


def attempt(index: str, seqs: range) -> Attempt:
    body = b"".join(orjson.dumps({"create": {"_index": index, "_id": f"id-{n}"}}) + b"\n" +
                    orjson.dumps({"@timestamp": "2026-12-01T10:00:00.000Z", "message": f"line {n}",
                                  "log": {"level": "info", "offset": n * 10, "file": {"path": "/var/log/a.log"}},
                                  "host": {"name": "h"}, "seq": n}) + b"\n" for n in seqs)
    return Attempt(body, False, len(seqs))


def paths(proxy: FaultProxy) -> list[str]:
    return [f"{x.method} {x.path.split('?')[0]}" for x in proxy.history]


def warnings(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.levelno == logging.WARNING and "index template" in r.getMessage()]


# ---------------------------------------------------------------- installing

async def test_installed_before_the_first_bulk_and_the_mapping_is_shippers(es: ES, fault_proxy: FaultProxy) -> None:
    s, gate = sender(config(fault_proxy.url))
    try:
        assert await s.deliver(attempt("logs-2026.12.01", range(5))) == []
        assert await s.deliver(attempt("logs-2026.12.01", range(5, 10))) == []
    finally:
        await s.client.close()
    assert gate.result is not None and gate.result.state == "installed"
    assert paths(fault_proxy) == ["GET /", "GET /_index_template/shipper", "PUT /_index_template/shipper",
                                  "POST /_bulk", "POST /_bulk"]
    mapping = es.request("GET", "/logs-2026.12.01/_mapping")["logs-2026.12.01"]["mappings"]["properties"]
    assert mapping["log"]["properties"]["level"]["type"] == "keyword"
    assert mapping["log"]["properties"]["offset"]["type"] == "long"
    assert mapping["@timestamp"]["type"] == "date"
    assert mapping["message"]["type"] == "text"                 # osmem answers as OpenSearch
    assert mapping["host"]["properties"]["name"]["type"] == "keyword"
    assert sorted(d["_source"]["seq"] for d in es.all_docs("logs-*")) == list(range(10))


ECS_TYPES = {
    "trace.id": "keyword", "span.id": "keyword", "transaction.id": "keyword", "error.type": "keyword",
    "error.message": "text", "error.stack_trace": "text", "process.pid": "long", "host.hostname": "keyword",
    "service.name": "keyword", "http.request.id": "keyword", "http.request.method": "keyword",
    "url.original": "keyword", "url.path": "keyword", "url.query": "keyword", "client.address": "keyword",
    "client.port": "long", "user_agent.original": "keyword", "http.response.status_code": "long",
    "event.duration": "long",
}


async def test_the_template_maps_every_ecs_field_as_spec_says(es: ES) -> None:
    """Probe documents built from real pino-http lines (tests/fixtures/pino) with `ecs: add`, and one
    with every field (transaction.id too), go into an index the installed template covers: the
    index's mapping has each ECS field with SPEC's type, not what dynamic mapping would guess."""
    from shipper.parse.document import DocBuilder
    fixture = Path(__file__).resolve().parents[1] / "fixtures" / "pino" / "lines.ndjson"
    lines = fixture.read_bytes().splitlines()
    lines.append(b'{"level":30,"time":1796529483413,"transaction_id":"t1","trace_id":"a","err":{"type":"E",'
                 b'"message":"m","stack":"s"},"req":{"id":5,"url":"/a?b=c","remotePort":1},"msg":"all"}')
    cfg = config(es.url)
    out: list[bytes] = []
    DocBuilder(cfg.inputs[0], "ecs-probe-2026.12.01", "h").build(
        "0123456789ab", "/var/log/a.log", [(i * 10, i * 10 + 1, ln, 0) for i, ln in enumerate(lines)], NOW, out)
    s, gate = sender(load_config_text(f"inputs: [{{paths: ['/var/log/a.log']}}]\noutput:\n  elasticsearch:\n"
                                      f"    hosts: ['{es.url}']\n    index: 'ecs-probe-%Y.%m.%d'\n"))
    try:
        assert await s.deliver(Attempt(b"".join(out), False, len(out))) == []
    finally:
        await s.client.close()
    assert gate.result is not None and gate.result.state == "installed"
    mapping = es.request("GET", "/ecs-probe-2026.12.01/_mapping")["ecs-probe-2026.12.01"]["mappings"]
    for field, want in ECS_TYPES.items():
        node: Any = mapping
        for part in field.split("."):
            node = node["properties"][part]
        assert node["type"] == want, (field, node)
    assert len(es.all_docs("ecs-probe-*")) == len(lines)
    # an application's own `event`, `error`, `service` as plain values still index: the template
    # types those ECS fields when they appear, it does not make the objects
    plain = (b'{"create":{"_index":"ecs-probe-2026.12.02","_id":"p1"}}\n'
             b'{"@timestamp":"2026-12-02T10:00:00.000Z","event":"login","error":"boom","service":"api",'
             b'"trace":"t","client":"c","span":1,"transaction":true}\n')
    s, _ = sender(load_config_text(f"inputs: [{{paths: ['/var/log/a.log']}}]\noutput:\n  elasticsearch:\n"
                                   f"    hosts: ['{es.url}']\n    index: 'ecs-probe-%Y.%m.%d'\n"))
    try:
        assert await s.deliver(Attempt(plain, False, 1)) == []
    finally:
        await s.client.close()


async def test_an_existing_template_is_left_alone_unless_forced(es: ES) -> None:
    mine = {"index_patterns": ["logs-*"], "priority": 90,
            "template": {"mappings": {"properties": {"message": {"type": "keyword"}}}}}
    es.request("PUT", f"/_index_template/{TEMPLATE_NAME}", mine)
    cfg = config(es.url)
    s = Sender(cfg, Events(), FakeClock())
    try:
        res = await ensure_templates(s.client, cfg)
        assert res.state == "exists" and "left alone" in res.detail
        kept = es.request("GET", f"/_index_template/{TEMPLATE_NAME}")["index_templates"][0]["index_template"]
        assert kept["template"]["mappings"]["properties"] == {"message": {"type": "keyword"}}   # the user's edit
        res = await ensure_templates(s.client, cfg, force=True)
        assert res.state == "replaced"
        now = es.request("GET", f"/_index_template/{TEMPLATE_NAME}")["index_templates"][0]["index_template"]
        assert now["template"]["mappings"]["properties"]["log"]["properties"]["level"]["type"] == "keyword"
        assert now["_meta"]["managed_by"] == "shipper"
    finally:
        await s.client.close()


async def test_an_existing_template_that_does_not_cover_the_indices_is_a_warning(
        es: ES, fault_proxy: FaultProxy, caplog: pytest.LogCaptureFixture) -> None:
    """Found trying main as a user: a `shipper` template left by another config (patterns `s1-*`)
    was logged at info as "index template already there" with *this* config's patterns, while the
    indices it wrote got Elasticsearch's guessed mappings. The start-up log says it, as `shipper
    check` does; one that covers them stays one info line with the patterns it has."""
    es.request("PUT", f"/_index_template/{TEMPLATE_NAME}", {"index_patterns": ["other-*"], "priority": 90})
    s, gate = sender(config(fault_proxy.url))
    try:
        with caplog.at_level(logging.INFO, logger="shipper.output"):
            assert await s.deliver(attempt("logs-2026.12.01", range(3))) == []
    finally:
        await s.client.close()
    assert gate.result is not None and gate.result.state == "exists"
    (w,) = warnings(caplog)
    assert w.__dict__["patterns"] == ["other-*"] and w.__dict__["not_covered"] == ["logs-*"], w.__dict__
    assert "shipper template --force" in w.getMessage()
    es.request("PUT", f"/_index_template/{TEMPLATE_NAME}", {"index_patterns": ["logs-*"], "priority": 90})
    caplog.clear()
    s, gate = sender(config(fault_proxy.url))
    try:
        with caplog.at_level(logging.INFO, logger="shipper.output"):
            assert await s.deliver(attempt("logs-2026.12.01", range(3, 6))) == []
    finally:
        await s.client.close()
    assert warnings(caplog) == []
    [info] = [r for r in caplog.records if r.getMessage() == "index template already there"]
    assert info.__dict__["patterns"] == ["logs-*"]


async def test_a_conflicting_template_is_one_warning_and_shipping_goes_on(
        es: ES, fault_proxy: FaultProxy, caplog: pytest.LogCaptureFixture) -> None:
    # someone else's template with the same patterns and priority: Elasticsearch (and osmem) answer 400
    es.request("PUT", "/_index_template/theirs", {"index_patterns": ["logs-*"], "priority": 90})
    s, gate = sender(config(fault_proxy.url))
    try:
        with caplog.at_level(logging.INFO, logger="shipper.output"):
            assert await s.deliver(attempt("logs-2026.12.01", range(3))) == []
            assert await s.deliver(attempt("logs-2026.12.01", range(3, 6))) == []
    finally:
        await s.client.close()
    assert gate.result is not None and gate.result.state == "refused"
    (w,) = warnings(caplog)
    assert "same priority" in w.__dict__["reason"] and "shipping goes on" in w.getMessage()
    assert es.count("logs-*") == 6


async def test_refusals_from_a_destination_without_template_rights(caplog: pytest.LogCaptureFixture) -> None:
    """Logsene-like or a key without manage_index_templates: 403 on the template, bulk works."""
    got: list[str] = []

    async def handle(req: web.Request) -> web.Response:
        got.append(f"{req.method} {req.path}")
        if req.path == "/":
            return web.json_response({"version": {"number": "8.15.0"}, "tagline": "You Know, for Search"})
        if req.path.startswith("/_index_template"):
            return web.json_response({"error": {"type": "security_exception", "reason": "action "
                                      "[indices:admin/index_template/get] is unauthorized for API key id [k1]"},
                                      "status": 403}, status=403)
        n = (await req.read()).count(b"\n") // 2
        return web.json_response({"errors": False, "items": [{"create": {"status": 201}}] * n})

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        s, gate = sender(config(f"http://127.0.0.1:{port}"))
        try:
            with caplog.at_level(logging.INFO, logger="shipper.output"):
                assert await s.deliver(attempt("logs-x", range(2))) == []
                assert await s.deliver(attempt("logs-x", range(2, 4))) == []
        finally:
            await s.client.close()
    finally:
        await runner.cleanup()
    assert got == ["GET /", "GET /_index_template/shipper", "POST /_bulk", "POST /_bulk"]
    (w,) = warnings(caplog)
    assert "manage_index_templates" in w.__dict__["reason"]


async def test_an_output_that_is_down_holds_the_first_bulk_until_the_template_is_in(
        es: ES, fault_proxy: FaultProxy) -> None:
    fault_proxy.down()
    s, gate = sender(config(fault_proxy.url))
    try:
        res = await s.post(attempt("logs-2026.12.01", range(3)))
        assert isinstance(res, TransportError) and res.retryable and "index template" in str(res)
        fault_proxy.up()
        assert await s.deliver(attempt("logs-2026.12.01", range(3))) == []
    finally:
        await s.client.close()
    assert paths(fault_proxy)[:4] == ["GET /", "GET /_index_template/shipper", "PUT /_index_template/shipper",
                                      "POST /_bulk"]
    assert gate.result is not None and gate.result.state == "installed"


async def test_a_busy_destination_is_tried_three_times_then_shipping_goes_on(
        es: ES, fault_proxy: FaultProxy, caplog: pytest.LogCaptureFixture) -> None:
    fault_proxy.fail_next(503, times=3)
    s, gate = sender(config(fault_proxy.url))
    try:
        with caplog.at_level(logging.INFO, logger="shipper.output"):
            assert await s.deliver(attempt("logs-2026.12.01", range(3))) == []
    finally:
        await s.client.close()
    assert paths(fault_proxy) == ["GET /"] * 3 + ["POST /_bulk"]
    assert len(warnings(caplog)) == 1 and gate.busy == 3
    assert es.count("logs-*") == 3


async def test_the_data_stream_request_shape_on_the_wire(es: ES, fault_proxy: FaultProxy) -> None:
    items: list[BulkItem] = []

    def answer_like_elasticsearch(item: BulkItem) -> int:
        items.append(item)
        return 201          # osmem has no data streams: the proxy answers as Elasticsearch would

    fault_proxy.item_failures(answer_like_elasticsearch)
    cfg = config(fault_proxy.url, "    data_stream: {dataset: myapp, namespace: prod}\n")
    assert cfg.output.index == "logs-myapp-prod"
    s, gate = sender(cfg)
    try:
        assert await s.deliver(attempt(cfg.output.index, range(4))) == []
    finally:
        await s.client.close()
    stored = es.request("GET", f"/_index_template/{TEMPLATE_NAME}")["index_templates"][0]["index_template"]
    assert stored["index_patterns"] == ["logs-myapp-prod"] and "data_stream" in stored
    assert stored["priority"] == 200                            # above Elasticsearch's logs-*-* (100)
    assert [(i.op, i.index, i.id) for i in items] == [("create", "logs-myapp-prod", f"id-{n}") for n in range(4)]
    assert all(b'"@timestamp"' in (i.source or b"") for i in items)


# ---------------------------------------------------------------- shipper check's judging

async def test_inspect_a_fresh_destination(es: ES) -> None:
    cfg = config(es.url)
    s = Sender(cfg, Events(), FakeClock())
    try:
        found = await inspect(s.client, cfg, NOW)
    finally:
        await s.client.close()
    texts = [f.text for f in found.findings]
    assert found.ok, texts
    assert any("not installed yet" in t and "opensearch 3" in t for t in texts)
    assert any(t.startswith("index logs-2026.12.01 (logs-%Y.%m.%d): template shipper") for t in texts)


async def test_inspect_finds_the_data_stream_trap_and_an_uncovered_input(es: ES) -> None:
    es.request("PUT", "/_index_template/logs", {"index_patterns": ["logs-*-*"], "priority": 100, "data_stream": {}})
    es.request("PUT", f"/_index_template/{TEMPLATE_NAME}", {"index_patterns": ["logs-20*"], "priority": 90})
    cfg = load_config_text(f"inputs:\n  - {{paths: ['/a.log']}}\n"
                           f"  - {{paths: ['/b.log'], index: 'logs-app-%Y.%m.%d'}}\n"
                           f"output:\n  elasticsearch:\n    hosts: ['{es.url}']\n")
    s = Sender(cfg, Events(), FakeClock())
    try:
        found = await inspect(s.client, cfg, NOW)
    finally:
        await s.client.close()
    bad = [f.text for f in found.findings if not f.ok]
    assert not found.ok
    assert any("(logs-20*) do not cover logs-*, logs-app-*" in t for t in bad), bad
    assert any("logs-app-2026.12.01" in t and "data-stream template logs" in t for t in bad), bad


async def test_inspect_a_host_of_another_product() -> None:
    async def logstash(req: web.Request) -> web.Response:
        return web.json_response({"host": "h", "version": "8.15.0", "http_address": "127.0.0.1:9600",
                                  "id": "x", "name": "h", "ephemeral_id": "e"})

    app = web.Application()
    app.router.add_get("/", logstash)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        cfg = config(f"http://127.0.0.1:{port}")
        s = Sender(cfg, Events(), FakeClock())
        try:
            found = await inspect(s.client, cfg, NOW)
        finally:
            await s.client.close()
    finally:
        await runner.cleanup()
    assert [f.text for f in found.findings if not f.ok] == [f"host http://127.0.0.1:{port}: answers as Logstash's "
                                                           "monitoring API, not Elasticsearch"]


# ---------------------------------------------------------------- the commands

def _write(tmp_path: Path, url: str, extra: str = "") -> str:
    p = tmp_path / "shipper.yaml"
    p.write_text(f"state_dir: {tmp_path / 'state'}\ninputs: [{{paths: ['{tmp_path}/*.log']}}]\n"
                 f"output:\n  elasticsearch:\n    hosts: ['{url}']\n    timeout: 5s\n"
                 f"{extra}metrics: {{listen: null}}\n")
    return str(p)


def test_template_command_print_install_exists_force(es: ES, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    path = _write(tmp_path, es.url)
    assert main(["template", "-c", path, "--print"]) == 0
    printed: dict[str, Any] = orjson.loads(capsys.readouterr().out)
    assert printed["index_patterns"] == ["logs-*"]
    assert printed["template"]["mappings"]["properties"]["message"] == {"type": "text"}
    assert es.request("GET", "/_index_template/shipper", ok=(404,))                  # --print installs nothing
    assert main(["template", "-c", path]) == 0
    assert "installed" in capsys.readouterr().out
    assert main(["template", "-c", path]) == 0
    assert "--force replaces it" in capsys.readouterr().out
    assert main(["template", "-c", path, "--force"]) == 0
    assert "replaced" in capsys.readouterr().out


def test_template_command_refused_and_unreachable_exit_1(es: ES, tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    es.request("PUT", "/_index_template/theirs", {"index_patterns": ["logs-*"], "priority": 90})
    assert main(["template", "-c", _write(tmp_path, es.url)]) == 1
    assert "same priority" in capsys.readouterr().err
    down = _write(tmp_path, f"http://127.0.0.1:{free_port()}")
    assert main(["template", "-c", down]) == 1
    assert main(["template", "-c", down, "--print"]) == 0                            # assumes Elasticsearch 8
    out = capsys.readouterr()
    assert "elasticsearch 8 (assumed)" in out.err
    assert orjson.loads(out.out)["template"]["mappings"]["properties"]["message"] == {"type": "match_only_text"}


def test_check_reports_the_template(es: ES, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _write(tmp_path, es.url)
    assert main(["check", "-c", path]) == 0
    out = capsys.readouterr().out
    assert "template shipper: not installed yet" in out and "all well" in out
    es.request("PUT", "/_index_template/logs", {"index_patterns": ["logs-*-*"], "priority": 100, "data_stream": {}})
    trap = _write(tmp_path, es.url, "    index: 'logs-app-%Y.%m.%d'\n    index_template: off\n")
    assert main(["check", "-c", trap]) == 1
    out = capsys.readouterr().out
    assert "WARNING: index logs-app-" in out and "data-stream template logs" in out and "problems found" in out
