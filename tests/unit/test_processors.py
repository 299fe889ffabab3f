"""The processors (SPEC: "Dropping, sampling, throttling, redacting"; parse/processors.py): the
conditions, `sample` by `_id`, the throttle's token buckets on the injected clock, `redact` on
nested and dotted keys, the builder counting by reason (include_lines/exclude_lines too), and
the config errors that name the key and exit 2."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shipper.commands.main import main
from shipper.config import ConditionConfig, InputConfig, ThrottleConfig, load_config_text
from shipper.errors import ConfigError
from shipper.parse.document import DocBuilder
from shipper.parse.filters import get_field, split_path
from shipper.parse.processors import REDACTED, Condition, Processors, Redactor, Throttle, lookup, sample_point

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "pino" / "lines.ndjson"


def cond(field: str, op: str, value: Any) -> Condition:
    return Condition(ConditionConfig(field, op, value))  # type: ignore[arg-type]


DOC = {"req": {"url": "/healthz", "headers": {"user-agent": "kube-probe/1.30"}}, "log": {"level": "debug"},
       "http.response.status_code": 200, "n": 3, "f": 2.5, "ok": True, "none": None, "obj": {"a": [1]},
       "message": "GET /static/app.js"}


@pytest.mark.parametrize("field, op, value, want", [
    ("req.url", "equals", "/healthz", True), ("req.url", "equals", "/health", False),
    ("n", "equals", 3, True), ("n", "equals", 3.0, True), ("n", "equals", "3", False), ("ok", "equals", 1, False),
    ("ok", "equals", True, True), ("none", "equals", None, True), ("missing", "equals", None, False),
    ("log.level", "in", ("trace", "debug"), True), ("log.level", "in", ("info",), False), ("n", "in", (1, 3), True),
    ("message", "prefix", "GET /static/", True), ("n", "prefix", "3", False), ("req", "prefix", "/", False),
    ("message", "matches", r"^GET /static/", True), ("message", "matches", r"^POST", False),
    ("n", "matches", r"^3$", True), ("f", "matches", r"2\.5", True), ("obj", "matches", r'"a":\[1\]', True),
    ("ok", "matches", "^true$", True), ("none", "matches", "^null$", True), ("missing", "matches", ".*", False),
    ("http.response.status_code", "equals", 200, True),           # a key with dots
    ("req.headers.user-agent", "prefix", "kube-probe/", True),
    ("none", "exists", True, True), ("missing", "exists", False, True), ("missing", "exists", True, False),
    ("req.url", "exists", False, False), ("req.url.deeper", "exists", False, True),
])
def test_conditions(field: str, op: str, value: Any, want: bool) -> None:
    assert cond(field, op, value).holds(DOC) is want


def test_sample_is_decided_by_the_id_alone_and_keeps_the_fraction() -> None:
    ids = [f"0123456789ab-{off}".encode() for off in range(0, 4_000_000, 400)]
    assert [sample_point(i) for i in ids] == [sample_point(i) for i in ids]
    p = Processors(InputConfig(paths=("/x",), sample=_samples({"field": "url.path", "prefix": "/static/"}, 0.1)))
    doc = {"url": {"path": "/static/app.js"}}
    kept = [i for i in ids if p.verdict(doc, i, 0.0) is None]
    assert 0.085 * len(ids) < len(kept) < 0.115 * len(ids)
    assert kept == [i for i in ids if p.verdict(doc, i, 5.0) is None]          # not the time, not the order
    assert p.verdict({"url": {"path": "/api"}}, ids[0], 0.0) is None            # no rule matches: kept
    none = Processors(InputConfig(paths=("/x",), sample=_samples({"field": "a", "exists": True}, 0.0)))
    every = Processors(InputConfig(paths=("/x",), sample=_samples({"field": "a", "exists": True}, 1.0)))
    assert all(none.verdict({"a": 1}, i, 0) == "sample" and every.verdict({"a": 1}, i, 0) is None for i in ids)


def _samples(c: dict[str, Any], keep: float) -> Any:
    from shipper.config import SampleConfig
    field = c.pop("field")
    ((op, value),) = c.items()
    return (SampleConfig(ConditionConfig(field, op, value), keep),)  # type: ignore[arg-type]  # op: one of the Literal's, from the test's dict


def test_the_first_matching_sample_rule_decides() -> None:
    from shipper.config import SampleConfig
    rules = (SampleConfig(ConditionConfig("a", "exists", True), 1.0), SampleConfig(ConditionConfig("b", "exists", True), 0.0))
    p = Processors(InputConfig(paths=("/x",), sample=rules))
    assert p.verdict({"a": 1, "b": 1}, b"x-1", 0) is None and p.verdict({"b": 1}, b"x-1", 0) == "sample"


def test_throttle_token_bucket_per_key_on_the_read_clock() -> None:
    t = Throttle(ThrottleConfig(key="{service.name}", events_per_s=2.0, burst=5.0))
    a, b = {"service": {"name": "a"}}, {"service": {"name": "b"}}
    now = 1000.0
    assert [t.admit(a, now) for _ in range(7)] == [True] * 5 + [False] * 2      # starts full: the burst
    assert [t.admit(b, now) for _ in range(6)] == [True] * 5 + [False]          # its own bucket
    assert t.admit(a, now + 0.4) is False                                        # 0.8 tokens so far
    assert t.admit(a, now + 0.5) is True                                         # 1.0: one more
    assert [t.admit(a, now + 100) for _ in range(6)] == [True] * 5 + [False]    # refills to the burst, no more
    assert t.key({}) == "unknown" and t.key({"service": {"name": ["x"]}}) == "unknown"
    t2 = Throttle(ThrottleConfig(key="{host.hostname|nohost}-{log.level}", events_per_s=1, burst=1))
    assert t2.key({"log": {"level": "info"}}) == "nohost-info"
    whole = Throttle(ThrottleConfig(key=None, events_per_s=1, burst=1))
    assert whole.admit(a, now) and not whole.admit(b, now)                      # one bucket for the input


def test_throttle_keeps_at_most_max_buckets(monkeypatch: pytest.MonkeyPatch) -> None:
    from shipper.parse import processors
    monkeypatch.setattr(processors, "MAX_BUCKETS", 100)
    t = Throttle(ThrottleConfig(key="{k}", events_per_s=1.0, burst=2.0))
    for i in range(100):
        assert t.admit({"k": i}, 0.0)
    assert t.admit({"k": "new"}, 0.0)                  # none full yet: all forgotten, new ones start full
    assert len(t._buckets) == 1
    for i in range(99):
        t.admit({"k": i}, 0.0)
    t.admit({"k": "late"}, 10.0)                       # 10 s later every bucket is full again: forgotten
    assert set(t._buckets) == {"late"}


def test_redact_nested_dotted_mixed_and_wildcard() -> None:
    doc: dict[str, Any] = {"req": {"headers": {"authorization": "Bearer x", "cookie": "c", "host": "h"}},
           "req.headers.authorization": "flat", "req.headers": {"authorization": "mixed"},
           "password": "p", "user": {"password": "u", "name": "n"}, "other": {"password": "o"},
           "list": [{"password": "in a list"}]}
    r = Redactor(("req.headers.authorization", "req.headers.cookie", "password", "*.password", "absent.x"))
    assert r.apply(doc)
    assert doc["req"]["headers"] == {"authorization": REDACTED, "cookie": REDACTED, "host": "h"}
    assert doc["req.headers.authorization"] == REDACTED and doc["req.headers"] == {"authorization": REDACTED}
    assert doc["password"] == REDACTED and doc["user"] == {"password": REDACTED, "name": "n"}
    assert doc["other"]["password"] == REDACTED and doc["list"] == [{"password": "in a list"}]
    assert not Redactor(("nothing",)).apply({"a": 1})


def test_redacting_a_source_removes_its_ecs_copies() -> None:
    line = [ln for ln in FIXTURE.read_bytes().splitlines() if b"/api/cart" in ln and b"request completed" in ln][0]
    b = DocBuilder(InputConfig(paths=("/x/*.log",), redact=("req.url", "req.headers.user-agent", "trace_id")),
                   "logs", "h")
    out: list[bytes] = []
    b.build("inc", "/x/a.log", [(0, len(line) + 1, line, 0)], 0.0, out)
    d = orjson.loads(out[0].split(b"\n")[1])
    assert d["req"]["url"] == REDACTED and d["req"]["headers"]["user-agent"] == REDACTED and d["trace_id"] == REDACTED
    assert "url" not in d and "user_agent" not in d and "trace" not in d
    assert b"/api/cart" not in out[0] and b"shop-test" not in out[0]
    assert d["http"]["response"]["status_code"] == 200          # the rest is mapped as ever


def _build(inp: dict[str, Any], lines: list[bytes], now: float = 0.0, native: bool = True) -> tuple[DocBuilder, list[Any]]:
    b = DocBuilder(InputConfig(paths=("/x/*.log",), **inp), "logs", "h")
    if not native:
        b.splice = None
    out: list[bytes] = []
    n = b.build("0123456789ab", "/x/a.log", [(i * 100, i * 100 + 1, ln, 0) for i, ln in enumerate(lines)], now, out)
    assert n == sum(map(len, out))
    return b, [orjson.loads(p.split(b"\n")[1]) for p in out]


def test_the_builder_drops_counts_by_reason_and_keeps_the_rest_unchanged() -> None:
    lines = FIXTURE.read_bytes().splitlines()
    inp = {"drop_when": (ConditionConfig("url.path", "equals", "/healthz"),),
           "exclude_lines": ("report is late",)}
    for native in (True, False):
        b, docs = _build(inp, lines, native=native)
        assert b.take_dropped() == {"drop_when": 1, "exclude_lines": 1} and b.take_dropped() == {}
        _, everything = _build({}, lines, native=native)
        assert docs == [d for d in everything if d.get("url", {}).get("path") != "/healthz"
                        and d["message"] != "report is late"]
    assert b.drop_reasons == ("exclude_lines", "drop_when")


def test_include_lines_drops_are_counted_on_every_path() -> None:
    lines = [b'{"time":1790000000000,"msg":"keep me"}', b'{"time":1790000000000,"msg":"not this"}', b"text keep",
             b"text no"]
    for native in (True, False):
        b, docs = _build({"include_lines": ("keep",)}, lines, native=native)
        assert [d["message"] for d in docs] == ["keep me", "text keep"]
        assert b.take_dropped() == {"include_lines": 2}


def test_a_retried_batch_counts_each_drop_once() -> None:
    """A line orjson cannot write back makes `build` build the batch again one line at a time: the
    drops of the first try are not counted twice."""
    deep = b'{"x":' + b"[" * 300 + b"]" * 300 + b',"time":1790000000007}'
    b, docs = _build({"exclude_lines": ("drop",)}, [b"drop me", deep, b"drop me too", b"keep"])
    assert b.take_dropped() == {"exclude_lines": 2} and len(docs) == 2


def test_sample_and_throttle_in_the_builder_use_the_id_and_the_read_time() -> None:
    lines = [b'{"time":1790000000000,"msg":"m%d","service":{"name":"s%d"}}' % (i, i % 2) for i in range(40)]
    inp = {"throttle": ThrottleConfig(key="{service.name}", events_per_s=1.0, burst=3.0)}
    b, docs = _build(inp, lines, now=100.0)
    assert len(docs) == 6 and b.take_dropped() == {"throttle": 34}
    out: list[bytes] = []
    b.build("0123456789ab", "/x/a.log", [(5000, 5001, lines[0], 0)], 100.5, out)
    assert out == [] and b.take_dropped() == {"throttle": 1}                    # half a token
    b.build("0123456789ab", "/x/a.log", [(5000, 5001, lines[0], 0)], 101.0, out)
    assert len(out) == 1


@pytest.mark.parametrize("snippet, key", [
    ("drop_when: [{field: a, matches: '(unclosed'}]", "inputs[0].drop_when[0].matches"),
    ("sample: [{field: a, exists: true, keep: 1.5}]", "inputs[0].sample[0].keep"),
    ("sample: [{field: a, exists: true, keep: -0.1}]", "inputs[0].sample[0].keep"),
    ("sample: [{field: a, exists: true}]", "inputs[0].sample[0].keep"),
    ("drop_when: [{field: a, startswith: x}]", "inputs[0].drop_when[0].startswith"),
    ("drop_when: [{field: a}]", "inputs[0].drop_when[0]"),
    ("drop_when: [{field: a, equals: 1, prefix: x}]", "inputs[0].drop_when[0]"),
    ("drop_when: [{equals: 1}]", "inputs[0].drop_when[0].field"),
    ("drop_when: [{field: a, in: x}]", "inputs[0].drop_when[0].in"),
    ("drop_when: [{field: a, equals: [1]}]", "inputs[0].drop_when[0].equals"),
    ("drop_when: [{field: a, exists: true, keep: 1}]", "inputs[0].drop_when[0].keep"),
    ("drop_when: {field: a, equals: 1}", "inputs[0].drop_when"),
    ("throttle: {events_per_s: 0}", "inputs[0].throttle.events_per_s"),
    ("throttle: {key: '{a}'}", "inputs[0].throttle.events_per_s"),
    ("throttle: {events_per_s: 10, burst: 0.5}", "inputs[0].throttle.burst"),
    ("throttle: {events_per_s: 10, rate: 1}", "inputs[0].throttle.rate"),
    ("redact: ['a..b']", "inputs[0].redact[0]"),
])
def test_config_errors_name_the_key_and_exit_2(tmp_path: Path, snippet: str, key: str,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    text = f"inputs:\n  - paths: ['/var/log/x/*.log']\n    {snippet}\n"
    with pytest.raises(ConfigError) as err:
        load_config_text(text)
    assert err.value.key == key
    cfg = tmp_path / "shipper.yaml"
    cfg.write_text(text + f"state_dir: {tmp_path / 'state'}\n")
    cfg.chmod(0o600)
    assert main(["check", "-c", str(cfg)]) == 2
    assert key in capsys.readouterr().err


def test_a_valid_config_reads_as_spec_writes_it() -> None:
    cfg = load_config_text("""
inputs:
  - paths: ['/var/log/app/*.log']
    drop_when:
      - {field: req.url, equals: /healthz}
      - {field: log.level, in: [trace, debug]}
      - {field: message, matches: '^GET /static/'}
    sample:
      - {field: url.path, prefix: /static/, keep: 0.01}
    throttle: {key: '{service.name}', events_per_s: 1000, burst: 5000}
    redact: [req.headers.authorization, req.headers.cookie, password]
""").inputs[0]
    assert [(c.field, c.op, c.value) for c in cfg.drop_when] == [
        ("req.url", "equals", "/healthz"), ("log.level", "in", ("trace", "debug")),
        ("message", "matches", "^GET /static/")]
    assert cfg.sample[0].keep == 0.01 and cfg.sample[0].condition.op == "prefix"
    assert cfg.throttle == ThrottleConfig("{service.name}", 1000.0, 5000.0)
    assert cfg.redact == ("req.headers.authorization", "req.headers.cookie", "password")
    assert load_config_text("inputs: [{paths: ['/x/*.log'], throttle: {events_per_s: 0.5}}]").inputs[0].throttle \
        == ThrottleConfig(None, 0.5, 1.0)
    json.dumps([c.value for c in cfg.drop_when])


_keys = st.sampled_from(["a", "b", "a.b", "b.c", "a.b.c", "c", "x.y"])


@settings(max_examples=400, deadline=None)
@given(doc=st.recursive(st.integers(0, 3), lambda inner: st.dictionaries(_keys, inner, max_size=4), max_leaves=10),
       path=st.sampled_from(["a", "a.b", "a.b.c", "b.c", "x.y", "a.x", "c.d.e"]))
def test_lookup_finds_what_get_field_finds(doc: Any, path: str) -> None:
    """The conditions' quick lookup reads a document exactly as filters.get_field does."""
    if isinstance(doc, dict):
        got, want = lookup(doc, split_path(path)), get_field(doc, split_path(path))
        assert got is want or got == want
