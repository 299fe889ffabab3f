"""Document building per SPEC: pino/bunyan/@timestamp/timestamp times, message, log.level, the fields
always added, flags for bad input (never an exception), format json|text|auto, deterministic `_id`."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shipper.config import InputConfig
from shipper.model import FLAG_MULTILINE_CAPPED, FLAG_TRUNCATED
from shipper.parse.doc_values import doc_id
from shipper.parse.document import DocBuilder
from shipper.parse.timeparse import format_timestamp

NOW = 1_790_000_000.25           # 2026-09-21T...: the time the line was read
PATH = "/var/log/app/app.log"


def builder(**inp: Any) -> DocBuilder:
    inp.setdefault("paths", ("/var/log/app/*.log",))
    return DocBuilder(InputConfig(**inp), "logs-%Y.%m.%d", "web-1")


def doc(line: bytes, flags: int = 0, offset: int = 1234, **inp: Any) -> dict[str, Any]:
    r = builder(**inp).to_doc(line, flags, PATH, offset, NOW)
    assert r is not None
    d, t = r
    assert d["@timestamp"] == format_timestamp(t)      # the routed time is the stored time
    orjson.dumps(d)                                   # always serialisable
    return d


def flags_of(d: dict[str, Any]) -> list[str]:
    return d["log"].get("flags", [])


# ---------------------------------------------------------------- JSON logs

def test_pino_line() -> None:
    line = b'{"level":40,"time":1790000000123,"pid":7,"hostname":"h","msg":"disk almost full","seq":3}'
    d = doc(line, fields={"env": "prod"})
    assert d["@timestamp"] == "2026-09-21T14:13:20.123Z"
    assert d["message"] == "disk almost full" and d["msg"] == "disk almost full"
    assert d["log"] == {"level": "warn", "file": {"path": PATH}, "offset": 1234}
    assert d["host"] == {"name": "web-1", "hostname": "h"}     # ecs: add (the default) maps hostname and pid
    assert d["process"] == {"pid": 7}
    assert d["env"] == "prod" and d["pid"] == 7 and d["hostname"] == "h" and d["seq"] == 3 and d["level"] == 40


@pytest.mark.parametrize("level, name", [(10, "trace"), (20, "debug"), (30, "info"), (40, "warn"),
                                         (50, "error"), (60, "fatal")])
def test_pino_levels(level: int, name: str) -> None:
    assert doc(b'{"level":%d,"msg":"x"}' % level)["log"]["level"] == name


def test_unknown_numeric_level_and_string_level() -> None:
    assert "level" not in doc(b'{"level":35,"msg":"x"}')["log"]
    assert doc(b'{"level":"warning","msg":"x"}')["log"]["level"] == "warning"
    assert doc(b'{"level":30,"log":{"level":"custom"}}')["log"]["level"] == "custom"   # theirs wins


def test_bunyan_iso_time() -> None:
    d = doc(b'{"name":"app","hostname":"h","pid":1,"level":30,"msg":"hi","time":"2012-02-10T03:04:05.678Z","v":0}')
    assert d["@timestamp"] == "2012-02-10T03:04:05.678Z" and d["message"] == "hi" and d["log"]["level"] == "info"


def test_existing_at_timestamp_is_normalised_to_utc_millis() -> None:
    assert doc(b'{"@timestamp":"2026-01-02T03:04:05+02:00","time":1}')["@timestamp"] == "2026-01-02T01:04:05.000Z"
    assert doc(b'{"@timestamp":1600000000000}')["@timestamp"] == "2020-09-13T12:26:40.000Z"


def test_an_at_timestamp_that_is_no_time_is_replaced_but_kept_and_flagged() -> None:
    d = doc(b'{"@timestamp":"yesterday","msg":"x"}')
    assert len(d["@timestamp"]) == 24                                   # the time it was read
    assert d["log"]["original_timestamp"] == "yesterday" and d["log"]["flags"] == ["timestamp_unparsed"]
    d = doc(b'{"@timestamp":{"a":1},"time":1600000000000}')           # pino's time wins, the object is kept as text
    assert d["@timestamp"] == "2020-09-13T12:26:40.000Z"
    assert d["log"]["original_timestamp"] == '{"a":1}' and d["log"]["flags"] == ["timestamp_unparsed"]
    d = doc(b'{"@timestamp":"2026-01-02T03:04:05Z","time":1}')         # a time: normalised, nothing flagged
    assert "original_timestamp" not in d["log"] and "flags" not in d["log"]


def test_timestamp_field() -> None:
    assert doc(b'{"timestamp":"2025-05-06T07:08:09.5Z"}')["@timestamp"] == "2025-05-06T07:08:09.500Z"
    assert doc(b'{"timestamp":1600000000}')["@timestamp"] == "2020-09-13T12:26:40.000Z"


@pytest.mark.parametrize("line", [
    b'{"msg":"no time"}',
    b'{"time":"yesterday"}',
    b'{"time":true}',
    b'{"time":1e20}',                       # year 3 billion: no ISO 8601 text for it
    b'{"time":-5e15}',
    b'{"timestamp":99999999999999999}',
    b'{"@timestamp":"not a date","time":null}',
])
def test_without_a_usable_time_the_read_time_is_used(line: bytes) -> None:
    assert doc(line)["@timestamp"] == format_timestamp(NOW)


def test_message_is_not_overwritten_by_msg() -> None:
    d = doc(b'{"message":"mine","msg":"pino"}')
    assert d["message"] == "mine" and d["msg"] == "pino"


def test_existing_log_and_host_are_merged_not_lost() -> None:
    d = doc(b'{"log":{"logger":"db","file":{"line":42},"offset":1},"host":{"ip":"10.0.0.1"},"msg":"x","level":50}')
    assert d["log"] == {"logger": "db", "file": {"line": 42, "path": PATH}, "offset": 1234, "level": "error"}
    assert d["host"] == {"ip": "10.0.0.1", "name": "web-1"}
    d = doc(b'{"log":"raw text","host":"db-7"}')
    assert d["log"]["original"] == "raw text" and d["log"]["offset"] == 1234
    assert d["host"] == {"name": "web-1", "original": "db-7"}
    d = doc(b'{"host":{"name":"theirs"}}')
    assert d["host"] == {"name": "theirs"}


def test_existing_flags_are_kept_and_ours_added() -> None:
    d = doc(b'{"log":{"flags":["theirs"]},"x":1}', FLAG_TRUNCATED)
    assert d["log"]["flags"] == ["theirs", "truncated"]


def test_input_fields_are_added_deep_merged_and_cannot_drop_what_spec_adds() -> None:
    b = builder(fields={"env": "prod", "service": {"name": "api"}, "log": {"type": "app"}, "host": {"zone": "a"}})
    d1, _ = b.to_doc(b'{"service":{"version":"1.2"},"msg":"x"}', 0, PATH, 0, NOW)  # type: ignore[misc]
    d2, _ = b.to_doc(b"plain", 0, PATH, 10, NOW)  # type: ignore[misc]
    assert d1["service"] == {"version": "1.2", "name": "api"} and d1["env"] == "prod"
    assert d1["log"] == {"type": "app", "file": {"path": PATH}, "offset": 0}
    assert d1["host"] == {"zone": "a", "name": "web-1"}
    d1["service"]["name"] = "changed by a later stage"
    assert d2["service"] == {"name": "api"} and d2["log"]["offset"] == 10    # no shared objects
    assert b.shaper.fields["service"] == {"name": "api"}


# ---------------------------------------------------------------- text and bad input

def test_text_line() -> None:
    d = doc(b"GET /health 200", fields={"env": "prod"})
    assert d == {"message": "GET /health 200", "@timestamp": format_timestamp(NOW),
                 "log": {"file": {"path": PATH}, "offset": 1234}, "host": {"name": "web-1"}, "env": "prod"}


def test_invalid_utf8_is_replaced() -> None:
    assert doc(b"caf\xe9 \xff ok")["message"] == "caf\ufffd \ufffd ok"
    d = doc(b'{"msg":"caf\xe9"}')                    # JSON with a bad byte: still JSON
    assert d["message"] == "caf\ufffd" and not flags_of(d)


def test_nul_inside_a_line_is_kept() -> None:
    d = doc(b"before\x00after")
    assert d["message"] == "before\x00after"
    assert b"before\\u0000after" in orjson.dumps(d)


@pytest.mark.parametrize("line", [b'{"unterminated":', b"{not json}", b'{"a":1} trailing', b'{"big":1e400}', b"{"])
def test_brace_that_does_not_parse_is_text_flagged(line: bytes) -> None:
    for fmt in ("auto", "json"):
        d = doc(line, format=fmt)
        assert d["message"] == line.decode() and flags_of(d) == ["json_parse_failed"]


@pytest.mark.parametrize("line", [b"[1,2,3]", b'"a string"', b"42", b"plain text", b"null"])
def test_format_json_ships_non_objects_as_text_flagged(line: bytes) -> None:
    d = doc(line, format="json")
    assert d["message"] == line.decode() and flags_of(d) == ["json_parse_failed"]
    assert not flags_of(doc(line, format="auto"))     # auto: only `{` lines are JSON


def test_format_text_never_parses_json() -> None:
    d = doc(b'{"msg":"x","time":1600000000000}', format="text")
    assert d["message"] == '{"msg":"x","time":1600000000000}' and "msg" not in d
    assert d["@timestamp"] == format_timestamp(NOW)


def test_json_with_leading_whitespace_is_json() -> None:
    assert doc(b'  \t{"msg":"indented"}', format="auto")["message"] == "indented"


def test_truncated_and_capped_flags() -> None:
    assert flags_of(doc(b"cut", FLAG_TRUNCATED)) == ["truncated"]
    assert flags_of(doc(b"cut", FLAG_MULTILINE_CAPPED)) == ["truncated"]
    assert flags_of(doc(b"{cut", FLAG_TRUNCATED)) == ["json_parse_failed", "truncated"]


@settings(max_examples=300, deadline=None)
@given(line=st.binary(max_size=200), fmt=st.sampled_from(["auto", "json", "text"]))
def test_no_line_raises_and_every_doc_has_the_spec_fields(line: bytes, fmt: str) -> None:
    r = builder(format=fmt, fields={"env": "x"}).to_doc(line, 0, PATH, 7, NOW)
    assert r is not None
    d, _t = r
    orjson.dumps(d)
    assert d["log"]["file"]["path"] == PATH and d["log"]["offset"] == 7
    assert d["host"]["name"] and d["env"] == "x" and isinstance(d["@timestamp"], str)


@settings(max_examples=200, deadline=None)
@given(value=st.one_of(st.integers(), st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=30)),
       key=st.sampled_from(["time", "timestamp", "@timestamp"]))
def test_any_time_value_gives_a_valid_timestamp(value: Any, key: str) -> None:
    line = orjson.dumps({key: value}) if not (isinstance(value, int) and abs(value) >= 2**63) else b'{"x":1}'
    d = doc(line)
    assert len(d["@timestamp"]) == 24 and d["@timestamp"].endswith("Z") and d["@timestamp"][:4].isdigit()
    if key == "@timestamp" and "timestamp_unparsed" in d["log"].get("flags", []):
        assert d["log"]["original_timestamp"] == (value if isinstance(value, str) else orjson.dumps(value).decode())


# ---------------------------------------------------------------- bulk pairs and _id

def _pairs(b: DocBuilder, inc: str, events: list[tuple[int, int, bytes, int]], now: float = NOW) -> list[bytes]:
    out: list[bytes] = []
    n = b.build(inc, PATH, events, now, out)
    assert n == sum(len(p) for p in out)
    return out


def test_build_emits_create_with_incarnation_offset_ids() -> None:
    b = builder()
    pairs = _pairs(b, "a1b2c3d4e5f6", [(0, 10, b'{"time":1790000000000,"msg":"x"}', 0), (10, 20, b"text", 0)])
    assert len(pairs) == 2
    action, source = pairs[0].split(b"\n")[:2]
    assert orjson.loads(action) == {"create": {"_index": "logs-2026.09.21", "_id": "a1b2c3d4e5f6-0"}}
    assert orjson.loads(source)["message"] == "x"
    assert orjson.loads(pairs[1].split(b"\n")[0])["create"]["_id"] == "a1b2c3d4e5f6-10"
    assert all(p.endswith(b"\n") and p.count(b"\n") == 2 for p in pairs)
    assert doc_id("a1b2c3d4e5f6", 10) == "a1b2c3d4e5f6-10"


def test_ids_are_deterministic_and_differ_by_incarnation() -> None:
    events = [(0, 5, b"same", 0), (5, 10, b'{"msg":"x"}', 0)]
    first = _pairs(builder(), "aaaaaaaaaaaa", events)
    again = _pairs(builder(), "aaaaaaaaaaaa", events, now=NOW + 5)      # re-read later: same ids
    other = _pairs(builder(), "bbbbbbbbbbbb", events)

    def ids(pairs: list[bytes]) -> list[str]:
        return [orjson.loads(p.split(b"\n")[0])["create"]["_id"] for p in pairs]

    assert ids(first) == ids(again) == ["aaaaaaaaaaaa-0", "aaaaaaaaaaaa-5"]
    assert ids(other) == ["bbbbbbbbbbbb-0", "bbbbbbbbbbbb-5"]


def test_input_index_overrides_the_output_index() -> None:
    pairs = _pairs(builder(index="app-%Y"), "cccccccccccc", [(0, 5, b'{"time":1600000000000}', 0)])
    assert orjson.loads(pairs[0].split(b"\n")[0])["create"]["_index"] == "app-2020"
