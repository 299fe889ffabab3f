"""The spliced bulk pair (added fields as ready bytes + the line: its own bytes on the C path,
orjson's serialisation of the parsed line on the Python one) equals the fully re-serialised one:
same action, same document (compared as parsed JSON), no duplicate keys, over a corpus of tricky
lines, several input configurations and random JSON. Every test runs on both paths."""

from __future__ import annotations

import json
import os
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shipper.config import InputConfig
from shipper.model import FLAG_TRUNCATED
from shipper.parse import document
from shipper.parse.document import DocBuilder
from tests.support.native import c_function


@pytest.fixture(autouse=True, params=["native", "python"])
def build_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Each test twice: with the C fast path (`_native.c`, which must be built) and without it."""
    monkeypatch.setattr(document, "native_splice", c_function("splice") if request.param == "native" else None)
    return str(request.param)


def test_shipper_pure_python_turns_the_c_paths_off() -> None:
    import subprocess
    import sys
    code = ("from shipper import native; from shipper.parse import document; from shipper.tail import lines; "
            "print(native.PURE_PYTHON, document.native_splice is None, lines.native_split_lines is None)")
    for value, expected in (("1", "True True True"), ("0", "False False False"), ("", "False False False")):
        env = {k: v for k, v in os.environ.items() if k != "SHIPPER_PURE_PYTHON"} | {"SHIPPER_PURE_PYTHON": value}
        done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
        assert done.stdout.split() == expected.split(), done.stderr

NOW = 1_790_000_000.25
PATH = "/var/log/app/ünïcode \"quoted\" path.log"
INC = "0123456789ab"

CORPUS: list[bytes] = [
    # plain pino
    b'{"level":30,"time":1790000000123,"pid":7,"hostname":"h","msg":"hello","seq":1}',
    b'{"level":50,"time":1790000000999,"msg":"boom","err":{"type":"Error","message":"x","stack":"Error: x\\n    at f"}}',
    b'{"level":30,"time":1790000000000,"req":{"method":"GET","url":"/a?b=c","headers":{"host":"h:1"}},"res":{"statusCode":200}}',
    # unicode and escapes
    '{"level":30,"time":1790000000001,"msg":"grüße 日本 \U0001f600","ключ":"значение"}'.encode(),
    b'{"msg":"\\u00e9\\u65e5\\ud83d\\ude00 \\" \\\\ \\/ \\b\\f\\n\\r\\t \\u0000 \\u001f","time":1790000000002}',
    b'{"m\\u0073g":"escaped key","time":1790000000003}',
    b'{"msg":"a\\u2028b\\u2029c","level":"warn"}',
    # duplicate keys (Elasticsearch rejects them; re-serialising keeps the last)
    b'{"a":1,"a":2,"msg":"dup","time":1790000000004}',
    b'{"msg":"first","msg":"second"}',
    b'{"time":1,"time":1790000000005,"x":{"k":1,"k":2}}',
    b'{"level":30,"level":"custom","msg":"x"}',
    # nested objects and arrays
    b'{"a":{"b":{"c":{"d":[1,{"e":null},[],{}]}}},"list":[{"x":1},{"x":1}],"time":1790000000006}',
    # keys enrichment adds, already present
    b'{"@timestamp":"2026-09-21T14:13:20.5+02:00","msg":"has ts"}',
    b'{"@timestamp":1790000000,"msg":"numeric ts"}',
    b'{"log":"a string log","msg":"x"}',
    b'{"log":{"level":"debug","logger":"db"},"level":50,"msg":"x"}',
    b'{"log":{"file":{"path":"/elsewhere","line":3},"offset":-1},"msg":"x"}',
    b'{"host":"db-1","msg":"x"}',
    b'{"host":{"name":"theirs","ip":"10.0.0.1"},"msg":"x"}',
    b'{"host":null,"log":null,"msg":"x"}',
    b'{"message":"already","msg":"other"}',
    b'{"message":null,"msg":"other"}',
    b'{"env":"from the line","msg":"x"}',           # clashes with the input field `env` below
    b'{"service":{"name":"nested"},"msg":"x"}',
    # whitespace around the object
    b' {"msg":"space before","time":1790000000007}',
    b'\t \t{"msg":"tabs before"}',
    b'{"msg":"trailing space","time":1790000000008}   ',
    b'{"msg":"trailing tab"}\t',
    b'{ "msg" : "spaced" , "time" : 1790000000009 , "level" : 40 }',
    b'{\r"msg":"cr inside"}',
    # numbers
    b'{"big":123456789012345678901234567890,"neg":-0,"e":1E2,"f":1.5e-7,"g":-1.0,"time":1790000000010}',
    b'{"n":18446744073709551615,"m":-9223372036854775808,"msg":"int edges"}',
    b'{"time":1e300,"msg":"time out of range"}',
    b'{"time":99999999999,"msg":"seconds"}',
    b'{"time":100000000000,"msg":"10**11: still seconds"}',
    b'{"time":100000000001,"msg":"just ms"}',
    b'{"time":4398046511103,"msg":"2**42 - 1 ms"}',
    b'{"time":4398046511104,"msg":"2**42 ms"}',
    b'{"time":253402300799999,"msg":"last ms of 9999"}',
    b'{"time":253402300800000,"msg":"year 10000"}',
    b'{"time":-5,"msg":"negative"}',
    b'{"time":1790000000123.456,"msg":"float ms"}',
    b'{"time":"2026-09-21T14:13:20Z","msg":"bunyan"}',
    b'{"time":"not a time","timestamp":1790000000999,"msg":"fallback to timestamp"}',
    b'{"time":true,"msg":"bool time"}',
    b'{"time":null,"msg":"null time"}',
    # levels
    b'{"level":10}', b'{"level":60}', b'{"level":35}', b'{"level":true}', b'{"level":30.0}', b'{"level":""}',
    b'{"level":["a"]}', b'{"level":{"x":1}}',
    # msg of other types
    b'{"msg":null}', b'{"msg":12}', b'{"msg":{"a":[1,2]}}', b'{"msg":false}', b'{"msg":""}',
    # invalid UTF-8, NUL bytes
    b'{"msg":"bad \xff\xfe utf8","time":1790000000011}',
    b'{"msg":"cut \xe6\x97"}',
    b'{"msg":"nul \x00 raw"}',
    b'{"msg":"nul \\u0000 escaped","k\\u0000":1}',
    # not objects, not JSON
    b'{}', b'{ }', b'{"":""}', b'[1,2]', b'"string"', b'{not json}', b'{"a":1', b'{"a":1}}', b'{"a":1} {"b":2}',
    b'{"a":NaN}', b'{"a":Infinity}', b'{"a":"\\ud800"}', b"plain text line", b"", b"{",
    # what the C scan must refuse (or take) exactly as orjson does
    b'{"msg":"a multiline join",\n"time":1790000000012}',                 # a newline must not reach the body
    b'{"msg":"nl in string\n","time":1790000000012}', b'{"msg":"raw tab \t in string","time":1790000000012}',
    b'{"msg":"del \x7f ok","time":1790000000012}',
    b'{"msg":"overlong \xc0\xaf","time":1790000000013}', b'{"msg":"overlong \xe0\x80\xaf","time":1790000000013}',
    b'{"msg":"surrogate \xed\xa0\x80","time":1790000000013}', b'{"msg":"past max \xf4\x90\x80\x80","time":1790000000013}',
    b'{"msg":"f5 \xf5\x80\x80\x80","time":1790000000013}', b'{"msg":"cut at end \xe6","time":1790000000013}',
    '{"msg":"max \U0010ffff and \u07ff \uffff","time":1790000000013}'.encode(),
    b'{"msg":"pair \\ud83d\\ude00","time":1790000000014}', b'{"msg":"bad escape \\x","time":1790000000014}',
    b'{"msg":"short \\u12","time":1790000000014}', b'{"msg":"hex \\uZZZZ","time":1790000000014}',
    b'{"a":01,"time":1790000000015}', b'{"a":1.,"time":1790000000015}', b'{"a":.5,"time":1790000000015}',
    b'{"a":-,"time":1790000000015}', b'{"a":1e5,"time":1790000000015}', b'{"a":1.5E+3,"time":1790000000015}',
    b'{"a":-0.0,"b":0.5,"c":-12.25,"time":1790000000015}', b'{"a":123456789012345678,"time":1790000000015}',
    b'{"a":1234567890123456789,"time":1790000000015}', b'{"a":0.12345678901234567,"time":1790000000015}',
    b'{"a":1e308,"b":1.7976931348623157e308,"c":1e-400,"d":-0e-0,"e":1E+0002,"time":1790000000015}',
    b'{"a":1.8e308,"time":1790000000015}', b'{"a":1e99999,"time":1790000000015}', b'{"a":1e,"time":1790000000015}',
    b'{"a":1e+,"time":1790000000015}', b'{"a":' + b'1' + b'0' * 299 + b'.5,"time":1790000000015}',
    b'{"a":' + b'1' + b'0' * 309 + b'.0,"time":1790000000015}', b'{"a":0.' + b'0' * 400 + b'1,"time":1790000000015}',
    b'{"a":18446744073709551615,"b":18446744073709551616,"time":1790000000015}',
    b'{"a":-9223372036854775808,"time":1790000000015}', b'{"a":-9223372036854775809,"time":1790000000015}',
    b'{"a":9223372036854775808,"time":1790000000015}', b'{"time":18446744073709551615}',
    b'{"a":tru,"time":1790000000016}', b'{"a":nul,"time":1790000000016}', b'{"a":True,"time":1790000000016}',
    b'{"a":true,"b":false,"c":null,"d":[true,false,null],"time":1790000000016}',
    b'{"a":{"x":1,"x":2},"time":1790000000017}', b'{"a":{"x":1},"b":{"x":1},"x":0,"time":1790000000017}',
    b'{"a":[{"x":1,"y":{"x":2}},{"x":3}],"time":1790000000017}', b'{"a":[{"x":1,"x":1}],"time":1790000000017}',
    b'{"":"empty key","time":1790000000018}', b'{"level":"w\\u0061rn","msg":"escaped level","time":1790000000018}',
    b'{"time":100000000000,"msg":"ms_min - 1"}', b'{"time":100000000001,"level":20}',
    b'{"time":4398046511103,"level":60}', b'{"time":4398046511104,"level":60}',
    b'{"time":1790000000019,"msg":{"o":[1]},"level":-10}', b'{"time":1790000000019,"msg":[1,"x"],"level":0}',
    b'{"time":1790000000019,"msg":7,"message":"kept"}', b'{"message":"alone","time":1790000000019}',
    b'{"a":1}x', b'{"a":1,"time":1790000000020},', b'{"a":1,"time":1790000000020}\r', b'{"a":1,"time":1790000000020}\r ',
    b'{"a":1,"time":1790000000020,}', b'{"a" 1,"time":1790000000020}', b'{"a":1 "time":1790000000020}',
    b'{"a":[1,2,],"time":1790000000020}', b'{"a":[1 2],"time":1790000000020}', b'{"a":[,"time":1790000000020}',
    b'{"time":1790000000021,"a":"' + b"x" * 5000 + b'"}',
    b'{"time":1790000000022,"d":' + b'[' * 63 + b'1' + b']' * 63 + b'}',
    b'{"time":1790000000022,"d":' + b'{"k":' * 70 + b'1' + b'}' * 70 + b'}',
    b'{"time":1790000000022,"d":' + b'[' * 200 + b']' * 200 + b'}',
    b'{"time":1790000000023,' + b",".join(b'"k%d":%d' % (i, i) for i in range(1100)) + b'}',
    b'{"time":1790000000023,"o":{' + b",".join(b'"k%d":%d' % (i, i) for i in range(300)) + b',"k7":0}}',
    # number tokens past 100 bytes are re-serialised; the time range stops before year 10000
    b'{"time":1790000000024,"n":0.' + b"1" * 98 + b'}', b'{"time":1790000000024,"n":0.' + b"1" * 99 + b'}',
    b'{"time":1790000000024,"n":' + b"9" * 120 + b'e-100}', b'{"time":1790000000024,"n":-0.' + b"0" * 3000 + b'1}',
    b'{"time":253402300799999,"msg":"last ms of 9999"}', b'{"time":253402300800000000,"msg":"far"}',
]

CONFIGS: list[dict[str, Any]] = [
    {},
    {"format": "json"},
    {"index": "app-logs"},                          # one index name: a constant action prefix
    {"index": "app-logs", "fields": {"env": "prod", "nested": {"a": [1, "ü"]}}},
    {"fields": {"env": "prod", "team": "core"}},
    {"fields": {"service": {"name": "api", "tags": ["a", "b"]}, "n": 3, "unicode": "ü"}},
    {"index": "logs-%Y.%m.%d"},
    {"index": "app-{service.name|none}-%Y.%m"},
    {"index": "lv-{log.level}"},                    # reads an added field: never spliced
    {"fields": {"message": "fixed"}},               # overwrites an added field: never spliced
    {"fields": {"log": {"type": "app"}}},
    {"include_lines": ["x", "hello"]},
    {"exclude_lines": ["dup"]},
    {"drop_fields": ["pid"]},                       # a transform: never spliced
]


def builder(**inp: Any) -> DocBuilder:
    inp.setdefault("paths", ("/var/log/app/*.log",))
    return DocBuilder(InputConfig(**inp), "logs-%Y.%m.%d", "web-1 \"ü\"")


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    keys = [k for k, _ in pairs]
    assert len(keys) == len(set(keys)), f"duplicate keys {keys}"
    return dict(pairs)


def _strict(doc: bytes) -> Any:
    """Parse as Elasticsearch would: duplicate keys anywhere are an error."""
    return json.loads(doc.decode("utf-8"), object_pairs_hook=_unique_keys)


def both(b: DocBuilder, events: list[tuple[int, int, bytes, int]]) -> tuple[list[bytes], list[bytes]]:
    fast: list[bytes] = []
    slow: list[bytes] = []
    assert b.build(INC, PATH, events, NOW, fast) == sum(map(len, fast))
    assert b.build_reserialised(INC, PATH, events, NOW, slow) == sum(map(len, slow))
    return fast, slow


def assert_same(fast: list[bytes], slow: list[bytes]) -> None:
    assert len(fast) == len(slow)
    for f, s in zip(fast, slow):
        assert f.endswith(b"\n") and f.count(b"\n") == 2, f
        fa, fd, _ = f.split(b"\n")
        sa, sd, _ = s.split(b"\n")
        assert fa == sa
        assert orjson.loads(fd) == orjson.loads(sd), (fd, sd)
        assert _strict(fd) == _strict(sd)


def _events(lines: list[bytes]) -> list[tuple[int, int, bytes, int]]:
    out, pos = [], 0
    for ln in lines:
        out.append((pos, pos + len(ln) + 1, ln, 0))
        pos += len(ln) + 1
    return out


@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: json.dumps(c, ensure_ascii=False))
def test_corpus_spliced_equals_reserialised(cfg: dict[str, Any]) -> None:
    fast, slow = both(builder(**cfg), _events(CORPUS))
    assert_same(fast, slow)


def test_offsets_past_63_bits_give_the_reserialised_document() -> None:
    """No file has them, but the C path hands them over rather than raise OverflowError."""
    line = b'{"level":30,"time":1790000000123,"msg":"x"}'
    events = [(2**63 - 1, 0, line, 0), (2**63, 0, line, 0), (2**64 - 1, 0, line, 0)]
    fast, slow = both(builder(), events)
    assert_same(fast, slow)
    assert b'"_id":"0123456789ab-18446744073709551615"' in fast[2]


def test_the_corpus_exercises_both_paths() -> None:
    """Spliced docs start with the added @timestamp; re-serialised ones keep the line's key order."""
    fast, _ = both(builder(), _events(CORPUS))
    spliced = [p for p in fast if p.split(b"\n")[1].startswith(b'{"@timestamp":')]
    assert 30 < len(spliced) < len(fast) - 20
    assert fast[0].split(b"\n")[1].startswith(b'{"@timestamp":"2026-09-21T14:13:20.123Z","log":')


@pytest.mark.parametrize("cfg", [{"index": "lv-{log.level}"}, {"fields": {"message": "m"}},
                                 {"fields": {"host": "x"}}, {"drop_fields": ["a"]}, {"format": "text"}])
def test_configs_that_must_never_splice(cfg: dict[str, Any]) -> None:
    fast, slow = both(builder(**cfg), _events([b'{"level":30,"time":1790000000123,"msg":"x","a":1}']))
    assert fast == slow


def test_flagged_lines_take_the_general_path() -> None:
    b = builder()
    line = b'{"msg":"cut but parses","time":1790000000123}'
    fast, slow = both(b, [(0, 10, line, FLAG_TRUNCATED)])
    assert fast == slow and b"truncated" in fast[0]


def test_time_arithmetic_matches_float_formatting_over_the_fast_range() -> None:
    import random
    rng = random.Random(7)
    values = [100_000_000_001, 2**42 - 1, 1790000000000, 1790000000999, 1767225599999, 1767225600000]
    values += [rng.randrange(100_000_000_001, 2**42) for _ in range(3000)]
    lines = [b'{"time":%d,"msg":"t"}' % v for v in values]
    fast, slow = both(builder(index="x-%Y.%m.%d.%H.%M.%S"), _events(lines))
    assert fast == [p for p in fast if p.split(b"\n")[1].startswith(b'{"@timestamp":')]
    assert_same(fast, slow)


def test_repeated_builds_reuse_caches_consistently() -> None:
    b = builder(index="logs-%Y.%m.%d")
    lines = _events(CORPUS[:12])
    first, _ = both(b, lines)
    second, _ = both(b, lines)
    other_path: list[bytes] = []
    b.build(INC, "/other.log", lines, NOW, other_path)
    assert first == second
    assert all(b'"/other.log"' in p for p in other_path if p.split(b"\n")[1].startswith(b'{"@timestamp":'))


# ---------------------------------------------------------------- random JSON

_keys = st.sampled_from(["a", "b", "msg", "message", "time", "level", "log", "host", "@timestamp", "timestamp",
                         "env", "ü", "k\"q", ""])
_scalars = st.one_of(st.none(), st.booleans(), st.integers(min_value=-(2**63), max_value=2**64 - 1),
                     st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=12),
                     st.integers(min_value=100_000_000_000, max_value=300_000_000_000_000))
_values = st.recursive(_scalars, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                         st.dictionaries(_keys, inner, max_size=3)),
                       max_leaves=8)


def _render(obj: dict[str, Any], style: int, dup: tuple[str, Any] | None) -> bytes:
    """The object as different writers put it on a line: compact, spaced, ASCII-escaped; maybe a duplicate key."""
    if style == 0:
        text = orjson.dumps(obj).decode()
    elif style == 1:
        text = json.dumps(obj, ensure_ascii=True)
    else:
        text = json.dumps(obj, ensure_ascii=False, separators=(",", ":"))
    if dup is not None and text != "{}":
        text = "{" + json.dumps(dup[0]) + ":" + json.dumps(dup[1]) + "," + text[1:]
    return text.encode()


@settings(max_examples=400, deadline=None)
@given(obj=st.dictionaries(_keys, _values, max_size=6), style=st.integers(0, 2),
       dup=st.one_of(st.none(), st.tuples(_keys, _scalars)),
       cfg=st.sampled_from(CONFIGS[:8]), pad=st.sampled_from([b"", b" ", b"\t", b"  "]))
def test_random_json_spliced_equals_reserialised(obj: dict[str, Any], style: int, dup: tuple[str, Any] | None,
                                                 cfg: dict[str, Any], pad: bytes) -> None:
    line = _render(obj, style, dup) + pad
    fast, slow = both(builder(**cfg), [(5, 6 + len(line), line, 0)])
    assert_same(fast, slow)


def test_a_static_index_has_a_constant_action_prefix_and_a_pattern_does_not() -> None:
    static, dated = builder(index="app-logs"), builder(index="app-%Y")
    assert static.pairs.static_prefix is not None and dated.pairs.static_prefix is None
    line = b'{"level":30,"time":1790000000123,"msg":"x"}'
    fast, slow = both(static, _events([line, b"text", line]))
    assert_same(fast, slow)
    assert fast[0].startswith(b'{"create":{"_index":"app-logs","_id":"0123456789ab-0"}}\n{"@timestamp":"2026-')
