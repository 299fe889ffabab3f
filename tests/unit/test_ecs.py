"""The ECS fields of pino, pino-http and OpenTelemetry lines (`inputs[].ecs`, parse/ecs.py and the C
path in _native.c): each field with its value and JSON type from lines the real libraries wrote
(tests/fixtures/pino/lines.ndjson, a run of tests/fixtures/pino/app.js), for add, replace and off;
wrong types left alone; the line's own ECS fields win; no object where a value is (or the reverse);
and the C path equal to the Python reference on arbitrary JSON objects (hypothesis)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shipper.config import InputConfig
from shipper.parse import document
from shipper.parse.document import DocBuilder
from shipper.parse.ecs import apply_ecs, duration_ns
from tests.support.native import c_function

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "pino" / "lines.ndjson"
LINES = FIXTURE.read_bytes().splitlines()
NOW = 1_796_529_500.0
PATH = "/var/log/checkout/app.log"


def by_msg(msg: str, nth: int = 0) -> bytes:
    return [ln for ln in LINES if orjson.loads(ln)["msg"] == msg][nth]


def builder(**inp: Any) -> DocBuilder:
    inp.setdefault("paths", ("/var/log/checkout/*.log",))
    return DocBuilder(InputConfig(**inp), "logs-%Y.%m.%d", "node-7")


def docs(lines: list[bytes], path: str = "python", **inp: Any) -> list[dict[str, Any]]:
    """The documents of `lines` built by one path: `c` (the C splice), `python` (the Python
    splice), `full` (parse, apply_ecs, one serialisation: the reference)."""
    b = builder(**inp)
    b.splice = c_function("splice") if path == "c" else None
    out: list[bytes] = []
    events = [(i * 1000, i * 1000 + len(ln) + 1, ln, 0) for i, ln in enumerate(lines)]
    if path == "full":
        b.build_reserialised("0123456789ab", PATH, events, NOW, out)
    else:
        b.build("0123456789ab", PATH, events, NOW, out)
    return [json.loads(p.split(b"\n")[1], object_pairs_hook=_unique) for p in out]


def _unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object as Elasticsearch reads it: a key twice is an error (orjson keeps the last)."""
    keys = [k for k, _ in pairs]
    assert len(keys) == len(set(keys)), f"duplicate keys {keys}"
    return dict(pairs)


def get(doc: dict[str, Any], dotted: str) -> Any:
    v: Any = doc
    for k in dotted.split("."):
        if not isinstance(v, dict) or k not in v:
            return KeyError(dotted)
        v = v[k]
    return v


# ---------------------------------------------------------------- real pino output

HEALTHZ = {
    "trace.id": "d13b51e79e872b07189fa8ae93ef902b", "span.id": "b76cac78fb5e75bf",
    "process.pid": 22626, "host.hostname": "vm", "host.name": "node-7", "service.name": "checkout",
    "http.request.id": "1", "http.request.method": "GET", "url.original": "/healthz", "url.path": "/healthz",
    "client.address": "127.0.0.1", "client.port": 45528, "user_agent.original": "kube-probe/1.30",
    "http.response.status_code": 200, "event.duration": 1_000_000, "message": "request completed",
    "log.level": "info", "@timestamp": "2026-12-06T03:58:03.404Z",
}
PAY_ERROR = {
    "trace.id": "4536b3ecd4f59a6aaba82274cc631d66", "span.id": "b80ac7bfcc74d970",
    "error.type": "Error", "error.message": "card declined", "http.request.id": "4",
    "url.original": "/pay?order=991", "url.path": "/pay", "url.query": "order=991", "log.level": "error",
}
CART = {"url.original": "/api/cart?user=42&sort=recent", "url.path": "/api/cart", "url.query": "user=42&sort=recent",
        "user_agent.original": "Mozilla/5.0 (X11; Linux x86_64) shop-test/1.0", "http.request.id": "2"}
OWN_SPAN = {"trace.id": "e7a8b24391abe64068363a3ce87ece23", "span.id": "9030fdc856401a14",
            "log.level": "warn", "service.name": "checkout", "process.pid": 22626}


@pytest.mark.parametrize("path", ["c", "python", "full"])
@pytest.mark.parametrize("msg, nth, want", [
    ("request completed", 0, HEALTHZ), ("payment failed", 0, PAY_ERROR), ("cart loaded", 0, CART),
    ("report is late", 0, OWN_SPAN),
])
def test_each_field_of_real_pino_output_with_its_value_and_type(path: str, msg: str, nth: int,
                                                                  want: dict[str, Any]) -> None:
    d = docs([by_msg(msg, nth)], path)[0]
    for field, value in want.items():
        got = get(d, field)
        assert got == value and type(got) is type(value), (field, got)


def test_the_stack_trace_and_a_fields_absence() -> None:
    d = docs([by_msg("payment failed")])[0]
    assert d["error"]["stack_trace"].startswith("Error: card declined\n    at Server.<anonymous>")
    assert "query" not in d["url"] or d["url"]["query"]
    listening = docs([by_msg("listening")])[0]
    for root in ("http", "url", "client", "user_agent", "event", "trace", "span", "error"):
        assert root not in listening
    assert listening["service"] == {"name": "checkout"} and listening["process"] == {"pid": 22626}
    healthz = docs([by_msg("request completed")])[0]
    assert "query" not in healthz["url"] and "transaction" not in healthz


@pytest.mark.parametrize("path", ["c", "python", "full"])
def test_add_keeps_the_originals(path: str) -> None:
    for line, d in zip(LINES, docs(LINES, path), strict=True):
        original = orjson.loads(line)
        for k, v in original.items():
            assert d[k] == v, k


def test_replace_removes_the_originals_it_mapped_and_objects_left_empty() -> None:
    line = by_msg("request completed")
    for path in ("c", "python", "full"):
        d = docs([line], path, ecs="replace")[0]
        for gone in ("trace_id", "span_id", "pid", "hostname", "name", "responseTime"):
            assert gone not in d, (path, gone)
        assert d["res"] == {"headers": {}}        # not emptied by the mapping: pino-http's own empty headers
        # req keeps what was not mapped: headers but user-agent, nothing else
        assert d["req"] == {"headers": {"traceparent": "00-d13b51e79e872b07189fa8ae93ef902b-eeac626acc144cbd-01",
                                        "host": "127.0.0.1:44957", "connection": "keep-alive"}}
        assert d["trace_flags"] == "01" and d["msg"] == "request completed" and d["level"] == 30
        assert d["time"] == 1796529483404
        assert get(d, "http.response.status_code") == 200 and get(d, "event.duration") == 1_000_000
        assert d["host"] == {"name": "node-7", "hostname": "vm"}
    err = docs([by_msg("payment failed")], ecs="replace")[0]
    assert err["err"] == {"code": "E_DECLINED"}                     # only what was not mapped
    assert err["error"]["message"] == "card declined"


def test_replace_drops_an_object_only_when_it_emptied_it() -> None:
    d = docs([b'{"time":1790000000000,"err":{"message":"x"},"res":{},"req":{"headers":{"user-agent":"u"}}}'],
             ecs="replace")[0]
    assert "err" not in d and d["res"] == {} and "req" not in d
    assert d["error"] == {"message": "x"} and d["user_agent"] == {"original": "u"}


def test_off_adds_nothing() -> None:
    for path in ("c", "python", "full"):
        for line, d in zip(LINES, docs(LINES, path, ecs="off"), strict=True):
            assert set(d) - set(orjson.loads(line)) == {"@timestamp", "log", "host", "message"}
            assert d["host"] == {"name": "node-7"}


# ---------------------------------------------------------------- rules

@pytest.mark.parametrize("line, absent", [
    (b'{"pid":"7","hostname":1,"name":{"a":1},"trace_id":5,"responseTime":"12"}',
     ["process", "host.hostname", "service", "trace", "event"]),
    (b'{"req":"GET /","res":[200],"err":"boom"}', ["http", "url", "error"]),
    (b'{"req":{"url":7,"method":null,"id":true,"remotePort":"80","headers":"x"},"res":{"statusCode":"200"}}',
     ["url", "http", "client", "user_agent"]),
    (b'{"pid":1.5,"res":{"statusCode":200.0},"req":{"remotePort":9223372036854775808}}',
     ["process", "http", "client"]),
    (b'{"req":{"id":18446744073709551615},"responseTime":1e300,"pid":true}', ["http", "event", "process"]),
])
def test_a_source_of_the_wrong_type_is_left_where_it_is(line: bytes, absent: list[str]) -> None:
    for path in ("python", "full"):
        d = docs([line], path)[0]
        for field in absent:
            assert isinstance(get(d, field), KeyError), (path, field)
        for k, v in orjson.loads(line).items():
            assert d[k] == v


@pytest.mark.parametrize("line, want", [
    # the line's own ECS field wins; the other fields of that object are merged in
    (b'{"http":{"request":{"method":"POST"}},"req":{"method":"GET","id":"r1"},"res":{"statusCode":500}}',
     {"http": {"request": {"method": "POST", "id": "r1"}, "response": {"status_code": 500}}}),
    (b'{"trace":{"id":"mine"},"trace_id":"otel","span_id":"s"}', {"trace": {"id": "mine"}, "span": {"id": "s"}}),
    (b'{"url.original":"/mine","req":{"url":"/a?b"}}', {"url.original": "/mine", "url": {"path": "/a", "query": "b"}}),
    (b'{"service.name":"svc","name":"app"}', {"service.name": "svc"}),
    (b'{"event":{"duration":5,"kind":"x"},"responseTime":1}', {"event": {"duration": 5, "kind": "x"}}),
    # a value where an object goes: nothing is put under it
    (b'{"url":"http://x/y","req":{"url":"/y"}}', {"url": "http://x/y"}),
    (b'{"http":"1.1","req":{"method":"GET"},"res":{"statusCode":200}}', {"http": "1.1"}),
    (b'{"error":"boom","err":{"message":"m","type":"T"}}', {"error": "boom"}),
    (b'{"trace":"t","trace_id":"abc"}', {"trace": "t"}),
    (b'{"process":7,"pid":7}', {"process": 7}),
    (b'{"process":[1],"pid":7}', {"process": [1]}),
    (b'{"host":"db-1","hostname":"h"}', {"host": {"name": "node-7", "original": "db-1"}}),
    (b'{"http":{"request":"GET /"},"req":{"method":"GET"},"res":{"statusCode":200}}',
     {"http": {"request": "GET /", "response": {"status_code": 200}}}),
    (b'{"http.request":"x","req":{"method":"GET"}}', {"http.request": "x"}),
    (b'{"url.path.x":1,"req":{"url":"/p?q"}}', {"url.path.x": 1, "url": {"original": "/p?q", "query": "q"}}),
    (b'{"event.duration":3,"responseTime":1}', {"event.duration": 3}),
])
def test_the_lines_own_fields_win_and_nothing_conflicts(line: bytes, want: dict[str, Any]) -> None:
    line = line[:-1] + b',"time":1790000000000}'
    for path in ("c", "python", "full"):
        d = docs([line], path)[0]
        for k, v in want.items():
            assert d[k] == v, (path, k, d.get(k))
        if "event.duration" in want or "url.path.x" in want:
            assert "event" not in d or "duration" not in d["event"]


def test_url_split_is_on_the_first_question_mark_and_keeps_the_query_as_written() -> None:
    for url, path, query in [("/a?b=%20c&d=?e", "/a", "b=%20c&d=?e"), ("/a?", "/a", None), ("?q", "", "q"),
                             ("/plain", "/plain", None), ("", "", None), ("/ü?ß=1", "/ü", "ß=1")]:
        for p in ("c", "python", "full"):
            line = orjson.dumps({"time": 1790000000000, "req": {"url": url}})
            d = docs([line], p)[0]
            assert d["url"].get("path") == path and d["url"].get("query") == query, (p, url, d["url"])
            assert d["url"]["original"] == url


def test_request_id_is_a_keyword_and_duration_integer_nanoseconds() -> None:
    line = b'{"time":1790000000000,"req":{"id":-0},"responseTime":0.0000005}'
    d = docs([line], "c")[0]
    assert d["http"]["request"]["id"] == "0" and d["event"]["duration"] == 0     # 0.5 ns: half to even
    assert duration_ns(1.5e-6) == 2 and duration_ns(2.5e-6) == 2 and duration_ns(-0.0) == 0
    assert duration_ns(9.2e12) == 9_200_000_000_000_000_000 and duration_ns(9.3e12) is None
    assert duration_ns(True) is None and duration_ns("1") is None


def test_apply_ecs_leaves_a_line_without_sources_alone() -> None:
    doc = {"a": {"b": 1}, "http": "x"}
    apply_ecs(doc, "add")
    assert doc == {"a": {"b": 1}, "http": "x"}


def test_journald_and_container_messages_get_the_fields_too() -> None:
    from shipper.parse.doc_values import SourceEvent
    b = builder()
    out: list[bytes] = []
    b.build_source([SourceEvent("j-1-1", by_msg("request completed"), 0, NOW, {"process": {"pid": 1}})], out, NOW)
    d = orjson.loads(out[0].split(b"\n")[1])
    # the journal's _PID wins over the line's pid (what the kernel vouches for); the rest is mapped
    assert d["process"] == {"pid": 1} and d["http"]["response"]["status_code"] == 200
    assert d["pid"] == 22626 and d["host"]["hostname"] == "vm"


@pytest.mark.parametrize("mode", ["add", "replace"])
def test_the_c_path_takes_the_usual_pino_http_line(mode: str) -> None:
    """Lines of the benchmark's kind (bench/gen.py) and the real ones are mapped in C (with
    `replace`, the originals cut out of the line's bytes), not handed to Python, and give the
    reference's documents."""
    import sys
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
    from gen import PinoGenerator
    lines = [ln.encode() for ln in PinoGenerator().batch(300)] + LINES
    handed: list[int] = []
    b = builder(ecs=mode)
    b.splice = c_function("splice")
    orig = b.build_general

    def counting(inc: str, path: str, events: Any, now: float, out: list[bytes]) -> int:
        handed.extend(ev[0] for ev in events)
        return orig(inc, path, events, now, out)

    b.build_general = counting  # type: ignore[method-assign,assignment]
    out: list[bytes] = []
    b.build("0123456789ab", PATH, [(i, i + 1, ln, 0) for i, ln in enumerate(lines)], NOW, out)
    assert handed == [] and len(out) == len(lines)
    assert all(b'"process":{"pid":' in p for p in out)
    full: list[bytes] = []
    b.build_reserialised("0123456789ab", PATH, [(i, i + 1, ln, 0) for i, ln in enumerate(lines)], NOW, full)
    assert [json.loads(p.split(b"\n")[1], object_pairs_hook=_unique) for p in out] == \
        [json.loads(p.split(b"\n")[1]) for p in full]


# ---------------------------------------------------------------- the C path equals the reference

_ecs_keys = st.sampled_from([
    "trace_id", "span_id", "transaction_id", "err", "pid", "hostname", "name", "req", "res", "responseTime",
    "trace", "span", "transaction", "error", "process", "service", "http", "url", "client", "user_agent", "event",
    "url.original", "http.request.method", "event.duration", "host.hostname", "trace.id", "error.x", "a", "msg",
    "level", "id", "method", "url", "remoteAddress", "remotePort", "headers", "user-agent", "statusCode", "type",
    "message", "stack", "request", "response", "status_code", "original", "duration", "pid.x", "urlx",
])
_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(2**63) - 2, max_value=2**64 - 1),
    st.floats(allow_nan=False, allow_infinity=False, width=64), st.floats(min_value=-1e7, max_value=1e7),
    st.text(max_size=10), st.sampled_from(["/a?b=c", "/x?", "?", "/p/ü?q=ß", "GET", "1.1", "a\\b?c", "a\"?b"]),
)
_json = st.recursive(_scalars, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                       st.dictionaries(_ecs_keys, inner, max_size=4)),
                     max_leaves=12)


def _line(obj: dict[str, Any], escaped: bool) -> bytes:
    obj = dict(obj, time=1790000000123)
    return json.dumps(obj, ensure_ascii=escaped, separators=(",", ":")).encode()


@settings(max_examples=600, deadline=None)
@given(objs=st.lists(st.dictionaries(_ecs_keys, _json, max_size=7), min_size=1, max_size=4),
       escaped=st.booleans(), mode=st.sampled_from(["add", "replace", "off"]),
       fields=st.sampled_from([{}, {"env": "prod"}, {"service": {"name": "api"}}, {"http": {"v": 1}, "event": "x"}]))
def test_c_equals_python_equals_the_reference_on_arbitrary_json(objs: list[dict[str, Any]], escaped: bool,
                                                                 mode: str, fields: dict[str, Any]) -> None:
    lines = [_line(o, escaped) for o in objs]
    c, py, full = (docs(lines, p, ecs=mode, fields=fields) for p in ("c", "python", "full"))
    assert c == py == full


@settings(max_examples=300, deadline=None)
@given(req=st.fixed_dictionaries({}, optional={
    "id": st.one_of(st.integers(min_value=-(2**63), max_value=2**63 - 1), st.text(max_size=8)),
    "method": st.sampled_from(["GET", "POST", "DELETE"]), "url": st.text(max_size=20),
    "remoteAddress": st.text(max_size=15), "remotePort": st.integers(min_value=-(2**63), max_value=2**63 - 1),
    "headers": st.dictionaries(st.sampled_from(["user-agent", "host", "accept"]), st.text(max_size=10))}),
    status=st.integers(min_value=-(2**63), max_value=2**63 - 1),
    rt=st.one_of(st.floats(min_value=-1e250, max_value=1e250),        # past ~1e300 a float is Python's
                 st.integers(min_value=-(2**63), max_value=2**64 - 1)))
def test_every_pino_http_line_is_taken_by_c_and_equals_the_reference(req: dict[str, Any], status: int,
                                                                      rt: float) -> None:
    """Lines with nothing but pino-http's keys are mapped in C (none handed over) and give the
    reference's document, for any values of the right types."""
    line = orjson.dumps({"level": 30, "time": 1790000000123, "pid": 1, "hostname": "h", "req": req,
                         "res": {"statusCode": status}, "responseTime": rt, "msg": "request completed"})
    assert docs([line], "c") == docs([line], "full")
    out: list[bytes] = []
    handed: list[Any] = []

    def fallback(ev: Any) -> int:
        handed.append(ev)
        return 0

    c_function("splice")([(0, 1, line, 0)], out, b'{"create":{"_index":"x","_id":"', None, b"i-",
                         b',"log":{"offset":', b',"host":{"name":"h"', b",", (b"@timestamp", b"log", b"host"),
                         fallback, 100_000_000_001, 2**42, (1, 0))
    assert handed == [] or b"\\" in orjson.dumps(req.get("url", ""))      # an escaped url is Python's


def test_document_module_passes_the_mode_to_c() -> None:
    assert document._ECS_CODE == {"off": 0, "add": 1, "replace": 2}
    b = builder(fields={"service": {"name": "api"}, "event": "x", "env": "prod"})
    assert b.shaper.ecs_fixed == {"service", "event"} and b.pairs.ecs_arg == (1, 1 << 6 | 1 << 11)


@pytest.mark.parametrize("fields", [{"service": {"name": "api", "env": "prod"}}, {"event": "x", "http": {"v": 1}},
                                    {"error": {"kind": "k"}, "trace": None}, {"env": "prod"}])
def test_the_inputs_fields_in_an_ecs_object_merge_on_every_path(fields: dict[str, Any]) -> None:
    """`fields` are merged over the ECS fields (objects deep, values replace): the C path, which
    writes the fields as bytes after the line's ECS fields, hands over a line that maps into one of
    those objects, so no key is written twice (a fuzzer found `"http"` twice)."""
    lines = LINES + [b'{"time":1790000000000,"name":"svc","responseTime":2,"err":{"type":"T"}}']
    c, py, full = (docs(lines, p, fields=fields) for p in ("c", "python", "full"))
    assert c == py == full
    for d in c:
        for k, v in fields.items():
            if not isinstance(v, dict):
                assert d[k] == v
            else:
                assert all(d[k][kk] == vv for kk, vv in v.items())


def _indices(lines: list[bytes], path: str, **inp: Any) -> list[str]:
    """The `_index` of each pair `lines` give on one path: `c`, the builder as it is (the C splice
    where it takes the input: never for an index named by a field), `python`, `full` (as `docs`)."""
    b = builder(**inp)
    if path != "c":
        b.splice = None
    out: list[bytes] = []
    events = [(i * 1000, i * 1000 + len(ln) + 1, ln, 0) for i, ln in enumerate(lines)]
    if path == "full":
        b.build_reserialised("0123456789ab", PATH, events, NOW, out)
    else:
        b.build("0123456789ab", PATH, events, NOW, out)
    return [orjson.loads(p.split(b"\n")[0])["create"]["_index"] for p in out]


@pytest.mark.parametrize(("index", "ecs", "want"), [
    ("app-{service.name|none}", "add", "app-checkout"),      # service.name <- name: the document has it
    ("app-{service.name|none}", "replace", "app-checkout"),
    ("app-{service.name|none}", "off", "app-none"),
    ("app-{name|none}", "replace", "app-none"),              # replace removes `name` from the document
    ("app-{name|none}", "add", "app-checkout"),
])
def test_an_index_named_by_a_field_reads_the_document_ecs_made_on_every_path(index: str, ecs: str, want: str) -> None:
    """The index is the document's: a pattern reading a field the ECS mapping writes (or, with
    replace, removes) names the same index on the C, the Python and the reference path (the splice
    fuzzer found the Python splice routing on the line before the mapping: `app-none`)."""
    line = b'{"level":30,"time":1796529483413,"pid":7,"hostname":"vm","name":"checkout","msg":"x"}'
    got = {p: _indices([line], p, index=index, ecs=ecs) for p in ("c", "python", "full")}
    assert got == {p: [want] for p in ("c", "python", "full")}
