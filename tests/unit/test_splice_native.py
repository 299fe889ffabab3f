"""The C fast path (`shipper/_native.c`) on its own: which lines it takes and which it hands
to the Python path, in order, and that byte mutations of real lines never make it write a pair
that differs from the re-serialised one (test_splice.py compares whole corpora on both paths)."""

from __future__ import annotations

import json
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shipper import native
from shipper.config import InputConfig
from shipper.parse.doc_values import FAST_MS_MAX, FAST_MS_MIN
from shipper.parse.document import DocBuilder

splice: Any = getattr(native.module, "splice", None)   # None: not built, test_splice.py says so as a failure; Any: called with wrong arguments on purpose
pytestmark = pytest.mark.skipif(splice is None, reason="not built: tests/unit/test_splice.py fails on it")

HEAD = b'{"create":{"_index":"x","_id":"'
MID = b',"log":{"file":{"path":"/p"},"offset":'
HOST = b',"host":{"name":"h"'
RESERVED = (b"@timestamp", b"log", b"host")
PINO = b'{"level":30,"time":1790000000123,"pid":7,"hostname":"h","msg":"hello","seq":1}'


def run(lines: list[bytes], *, head: bytes | None = HEAD, tail: bytes = b",",
        reserved: tuple[bytes, ...] = RESERVED, flags: int = 0) -> tuple[list[bytes], list[int]]:
    """The pairs written and the indices of the events handed to the fallback."""
    out: list[bytes] = []
    handed: list[int] = []
    events = [(i * 100, i * 100 + len(ln) + 1, ln, flags) for i, ln in enumerate(lines)]

    def fallback(ev: tuple[int, int, bytes, int]) -> int:
        handed.append(ev[0] // 100)
        out.append(b"<fallback %d>" % (ev[0] // 100))
        return len(out[-1])

    def prefix_for(sec: int) -> bytes:
        return b'{"create":{"_index":"s%d","_id":"' % sec

    n = splice(events, out, head, prefix_for, b"inc-", MID, HOST, tail, reserved, fallback, FAST_MS_MIN, FAST_MS_MAX, (0, 0))
    assert n == sum(map(len, out))
    return out, handed


def test_a_pino_line_is_passed_through_after_the_added_fields() -> None:
    out, handed = run([PINO])
    assert handed == []
    assert out == [HEAD + b'inc-0"}}\n{"@timestamp":"2026-09-21T14:13:20.123Z"' + MID + b'0,"level":"info"}' + HOST + b'}'
                   b',"message":"hello",' + PINO[1:] + b"\n"]


@pytest.mark.parametrize("line", [
    b'{"time":1790000000123}', b'{"time":1790000000123,"level":"warn","msg":{"a":1}}',
    b'{"time":1790000000123,"msg":null,"level":35}', b'{ "time" : 1790000000123 }  \r',
    b'{"time":1790000000123,"a":1e3,"b":-2.5E-7,"c":18446744073709551615}',
    b'{"time":1790000000123,"wt":1790000000123456789,"i":-9223372036854775808}',
    '{"time":1790000000123,"msg":"日本 \U0001f600"}'.encode(), b'{"time":1790000000123,"a":{"a":{"a":[]}}}',
])
def test_valid_lines_with_a_pino_time_are_taken(line: bytes) -> None:
    out, handed = run([line])
    assert handed == []
    action, doc, end = out[0].split(b"\n")
    assert end == b"" and orjson.loads(action) and orjson.loads(doc)["time"] == 1790000000123


@pytest.mark.parametrize("line", [
    b'{"msg":"no time"}', b'{"time":"2026-09-21T14:13:20Z"}', b'{"time":1790000000}', b'{"time":1.79e12}',
    b'{"time":1790000000123.5}', b'{"time":1790000000123,"log":{}}', b'{"time":1790000000123,"host":"h"}',
    b'{"@timestamp":"x","time":1790000000123}', b'{"time":1790000000123,"time":1790000000124}',
    b'{"m\\u0073g":"x","time":1790000000123}', b'{"time":1790000000123,"a":"\\ud83d\\ude00"}',
    b' {"time":1790000000123}', b'{"time":1790000000123}x', b'{"time":1790000000123,\n"a":1}',
    b'{"time":1790000000123,"a":"\xff"}', b'{"time":1790000000123,"a":1.8e308}', b'{"time":1790000000123,"a":1e99999}',
    b'{"time":1790000000123,"a":18446744073709551616}', b'{"time":1790000000123,"a":-9223372036854775809}',
    b'{}', b'[1]', b'text', b'',
])
def test_everything_else_is_handed_to_the_python_path(line: bytes) -> None:
    out, handed = run([line])
    assert handed == [0] and out == [b"<fallback 0>"]


def test_order_is_kept_when_lines_are_handed_over() -> None:
    lines = [PINO, b"text", PINO, b'{"msg":"no time"}', PINO]
    out, handed = run(lines)
    assert handed == [1, 3]
    assert [p.startswith(b"<fallback") for p in out] == [False, True, False, True, False]


def test_flagged_events_are_handed_over() -> None:
    assert run([PINO], flags=1)[1] == [0]


def test_the_input_fields_keys_are_reserved_and_the_tail_is_written() -> None:
    out, handed = run([PINO, b'{"env":"line","time":1790000000123}'], tail=b',"env":"prod",',
                      reserved=RESERVED + (b"env",))
    assert handed == [1]
    assert orjson.loads(out[0].split(b"\n")[1])["env"] == "prod"


def test_an_index_named_by_time_asks_for_the_action_once_per_second() -> None:
    calls: list[int] = []

    def prefix_for(sec: int) -> bytes:
        calls.append(sec)
        return b'{"create":{"_index":"s%d","_id":"' % sec

    lines = [b'{"time":%d}' % ms for ms in (1790000000001, 1790000000999, 1790000001000, 1790000001500)]
    out: list[bytes] = []
    splice([(0, 1, ln, 0) for ln in lines], out, None, prefix_for, b"i-", MID, HOST, b",", RESERVED,
           lambda ev: 0, FAST_MS_MIN, FAST_MS_MAX, (0, 0))
    assert calls == [1790000000, 1790000001]
    assert [p.split(b'"')[5] for p in out] == [b"s1790000000"] * 2 + [b"s1790000001"] * 2


def test_errors_from_python_propagate() -> None:
    def boom(ev: Any) -> int:
        raise TypeError("from the fallback")

    with pytest.raises(TypeError, match="from the fallback"):
        splice([(0, 1, b"text", 0)], [], HEAD, None, b"i-", MID, HOST, b",", RESERVED, boom, FAST_MS_MIN, FAST_MS_MAX, (0, 0))
    with pytest.raises(TypeError, match="prefix_for"):
        splice([(0, 1, PINO, 0)], [], None, lambda s: "str", b"i-", MID, HOST, b",", RESERVED, boom,
               FAST_MS_MIN, FAST_MS_MAX, (0, 0))


# ---------------------------------------------------------------- mutations of real lines

_LINES = [PINO,
          b'{"level":50,"time":1790000000999,"msg":"boom","err":{"type":"Error","stack":"E: x\\n at f"},"a":[1,2.5,-3]}',
          '{"level":"warn","time":1790000000001,"msg":"grüße 日本","ok":true,"n":null}'.encode()]


def _builder() -> DocBuilder:
    b = DocBuilder(InputConfig(paths=("/x/*.log",), index="app"), "logs", "h")
    b.splice = splice            # the fast path under test, even with SHIPPER_PURE_PYTHON set
    return b


@settings(max_examples=1500, deadline=None)
@given(which=st.integers(0, len(_LINES) - 1), edits=st.lists(
    st.tuples(st.sampled_from(["set", "insert", "delete"]), st.integers(0, 10_000), st.binary(min_size=1, max_size=1)),
    min_size=1, max_size=3))
def test_mutated_lines_give_the_reserialised_document(which: int, edits: list[tuple[str, int, bytes]]) -> None:
    line = bytearray(_LINES[which])
    for op, pos, byte in edits:
        i = pos % (len(line) + 1)
        if op == "insert":
            line[i:i] = byte
        elif line and i < len(line):
            if op == "set":
                line[i:i + 1] = byte
            else:
                del line[i]
    data = bytes(line)
    b = _builder()
    fast: list[bytes] = []
    slow: list[bytes] = []
    b.build("inc", "/x/a.log", [(0, len(data) + 1, data, 0)], 1_790_000_000.0, fast)
    b.build_reserialised("inc", "/x/a.log", [(0, len(data) + 1, data, 0)], 1_790_000_000.0, slow)
    assert len(fast) == len(slow) == 1
    fa, fd, fe = fast[0].split(b"\n")
    sa, sd, _ = slow[0].split(b"\n")
    assert fe == b"" and fa == sa
    assert orjson.loads(fd) == orjson.loads(sd), (data, fd, sd)
    assert json.loads(fd.decode("utf-8"), object_pairs_hook=_unique_keys) == orjson.loads(sd)


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    keys = [k for k, _ in pairs]
    assert len(keys) == len(set(keys)), f"duplicate keys {keys}"
    return dict(pairs)


def test_every_position_of_a_special_byte_in_a_string() -> None:
    """The string scan looks at 16 bytes at a time: a quote, backslash, control or non-ASCII byte
    at any position of strings around that width is seen exactly as the Python path sees it."""
    specials = [b'\\"', b"\\\\", b"\\u00e9", b"\x01", b"\t", b"\x7f", b"\xc3\xa9", b"\xe6\x97\xa5", b"\xff", b"\xc3", b'"']
    lines = []
    for n in range(0, 40):
        for pos in range(n + 1):
            for sp in specials:
                lines.append(b'{"time":1790000000123,"a":"' + b"x" * pos + sp + b"y" * (n - pos) + b'","b":1}')
    events = [(i * 100, i * 100 + 1, ln, 0) for i, ln in enumerate(lines)]
    b = _builder()
    fast: list[bytes] = []
    slow: list[bytes] = []
    b.build("inc", "/x/a.log", events, 1_790_000_000.0, fast)
    b.build_reserialised("inc", "/x/a.log", events, 1_790_000_000.0, slow)
    assert len(fast) == len(slow) == len(lines)
    for f, s in zip(fast, slow):
        fa, fd, fe = f.split(b"\n")
        sa, sd, _ = s.split(b"\n")
        assert fe == b"" and fa == sa
        assert orjson.loads(fd) == orjson.loads(sd), (fd, sd)
    # and the C scan takes exactly the lines orjson reads
    _, handed = run(lines)
    refused = []
    for i, ln in enumerate(lines):
        try:
            orjson.loads(ln)
        except orjson.JSONDecodeError:
            refused.append(i)
    assert handed == refused and 0 < len(refused) < len(lines)


def test_a_fallback_that_empties_the_events_list_changes_nothing() -> None:
    """The scan points into the events' bytes: splice holds them itself while Python runs."""
    events = [(0, 1, PINO, 0), (100, 101, b"text", 0), (200, 201, PINO + b" " * 64, 0)]

    def fallback(ev: tuple[int, int, bytes, int]) -> int:
        events.clear()
        import gc
        gc.collect()
        return 0

    out: list[bytes] = []
    splice(events, out, HEAD, None, b"i-", MID, HOST, b",", RESERVED, fallback, FAST_MS_MIN, FAST_MS_MAX, (0, 0))
    assert len(out) == 2 and out[1].endswith(PINO[1:] + b"\n") and b'"_id":"i-200"' in out[1]


# ---------------------------------------------------------------- what a review of the C path found

def _crafted_keys_line(keys: int = 1000, key_bytes: int = 1000) -> bytes:
    """One object of `keys` keys of one length and one first byte that differ only at their end:
    the line that made a pairwise duplicate check cost keys**2 / 2 comparisons of key_bytes each."""
    pad = b"k" + b"x" * (key_bytes - 9)
    body = b",".join(b'"%s%08d":0' % (pad, i) for i in range(keys))
    return b'{"time":1790000000123,' + body + b"}"


def _best_of(fn: Any, n: int = 5) -> float:
    import time
    best = float("inf")
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


@pytest.mark.parametrize("line", [
    _crafted_keys_line(),                                                     # ~1 MiB, 1,000 long keys
    b'{"time":1790000000123,"a":[' + b",".join([b"{" + b",".join(b'"k%03d":0' % i for i in range(1000)) + b"}"] * 100)
    + b"]}",                                                                  # ~1 MiB, 100 objects of 1,000 short keys
])
def test_crafted_keys_cost_no_more_than_the_python_path(line: bytes) -> None:
    """The duplicate-key check is a hash table (linear in the line): the C path's cost of a line
    crafted against a pairwise check stays below the Python path's (it was 12x it)."""
    if native.MODULE_FILE:
        pytest.skip("a sanitizer build (SHIPPER_NATIVE_MODULE): its times say nothing")
    b = _builder()
    events = [(0, len(line) + 1, line, 0)]
    fast: list[bytes] = []
    def build_fast() -> None:
        fast.clear()
        b.build_native("inc", "/x/a.log", events, 1_790_000_000.0, fast)

    c = _best_of(build_fast)
    py = _best_of(lambda: b.build_general("inc", "/x/a.log", events, 1_790_000_000.0, []))
    assert fast[0].endswith(line[1:] + b"\n")              # taken: no duplicate among them
    assert c < 2 * py, (c, py)


def _key_hash(key: bytes) -> int:
    """A mirror of key_hash in _native.c, to craft keys that collide in its table."""
    m = 2**64 - 1

    def mix(h: int, w: int) -> int:
        h = ((h ^ w) * 0x9E3779B97F4A7C15) & m
        return h ^ (h >> 29)

    n = len(key)
    h = 0x243F6A8885A308D3 ^ n
    if n >= 8:
        i = 0
        while n - i > 8:
            h = mix(h, int.from_bytes(key[i:i + 8], "little"))
            i += 8
        h = mix(h, int.from_bytes(key[n - 8:], "little"))
    elif n >= 4:
        h = mix(h, int.from_bytes(key[:4], "little") | int.from_bytes(key[n - 4:], "little") << 32)
    elif n:
        h = mix(h, key[0] | key[n >> 1] << 8 | key[n - 1] << 16)
    h = (h * 0xBF58476D1CE4E5B9) & m
    return h ^ (h >> 32)


def test_keys_crafted_to_collide_in_the_table_are_handed_over() -> None:
    """The table's probes are capped (16 slots a key): 17 keys of one slot send the line to the
    fallback, 16 do not. (Fails when key_hash changes without its mirror above.)"""
    keys: list[bytes] = []
    i = 0
    while len(keys) < 17:
        k = b"c%d" % i
        if _key_hash(k) >> 52 == 7:
            keys.append(k)
        i += 1
    for n, handed_over in ((16, []), (17, [0])):
        line = b'{"time":1790000000123,' + b",".join(b'"%s":1' % k for k in keys[:n]) + b"}"
        assert run([line])[1] == handed_over, n
        assert_same_doc(line)


def assert_same_doc(line: bytes) -> None:
    b = _builder()
    fast: list[bytes] = []
    slow: list[bytes] = []
    b.build("inc", "/x/a.log", [(0, len(line) + 1, line, 0)], 1_790_000_000.0, fast)
    b.build_reserialised("inc", "/x/a.log", [(0, len(line) + 1, line, 0)], 1_790_000_000.0, slow)
    fa, fd, _ = fast[0].split(b"\n")
    sa, sd, _ = slow[0].split(b"\n")
    assert fa == sa and orjson.loads(fd) == orjson.loads(sd)
    assert json.loads(fd.decode("utf-8"), object_pairs_hook=_unique_keys) == orjson.loads(sd)


def test_duplicates_are_still_found_among_many_keys_and_depths() -> None:
    many = b",".join(b'"k%d":%d' % (i, i) for i in range(900))
    assert run([b'{"time":1790000000123,' + many + b"}"])[1] == []
    assert run([b'{"time":1790000000123,' + many + b',"k899":0}'])[1] == [0]
    # the same key in an enclosing and in an inner object is no duplicate, in siblings neither
    nested = b'{"time":1790000000123,"a":{"a":{"a":1,"b":2},"b":{"a":1,"b":2}},"b":[{"a":1},{"a":1}]}'
    assert run([nested, nested.replace(b'"b":2}}', b'"b":2,"a":0}}')])[1] == [1]
    # a line handed over halfway leaves no key behind for the next line
    assert run([b'{"time":1790000000123,"x":{"dup":1,"dup":2}}', b'{"time":1790000000123,"dup":1,"x":1}'])[1] == [0]


@pytest.mark.parametrize("digits, taken", [(100, True), (101, False), (2000, False)])
def test_numbers_over_100_bytes_are_handed_over(digits: int, taken: bool) -> None:
    """Elasticsearch refuses numbers of more than 1,000 characters; the Python path re-serialises
    (0.1 followed by 2,000 digits becomes 0.1): such tokens never pass through verbatim."""
    for number in (b"0." + b"1" * (digits - 2), b"-" + b"1" * (digits - 4) + b"e-5", b"1" * (digits - 4) + b".5e1"):
        assert len(number) == digits
        line = b'{"time":1790000000123,"n":' + number + b"}"
        assert run([line])[1] == ([] if taken else [0]), number
        assert_same_doc(line)


@pytest.mark.parametrize("ms_max", [2**42, 253402300800000, 2**62, 2**63 - 1])
def test_time_is_clamped_to_a_4_digit_year_whatever_ms_max(ms_max: int) -> None:
    """splice takes `time` below min(ms_max, year 10000) only: a fifth year digit would shift a
    tab, a newline or a quote into the bulk body."""
    last, first_10000, far = 253402300799999, 253402300800000, 2**62 - 1
    out: list[bytes] = []
    handed: list[int] = []
    lines = [b'{"time":%d}' % t for t in (last, first_10000, far)]

    def fallback(ev: tuple[int, int, bytes, int]) -> int:
        handed.append(ev[0])
        return 0

    splice([(i, i + 1, ln, 0) for i, ln in enumerate(lines)], out, HEAD, None, b"i-", MID, HOST, b",", RESERVED,
           fallback, FAST_MS_MIN, ms_max, (0, 0))
    if ms_max > last:
        assert handed == [1, 2]
        assert b'{"@timestamp":"9999-12-31T23:59:59.999Z",' in out[0]
    else:
        assert handed == [0, 1, 2] and out == []


def test_huge_flags_and_offsets_are_handed_over_without_an_error() -> None:
    """Flags or an offset that no C long holds: the fallback's (which writes any int), with no
    OverflowError raised or left pending."""
    events = [(0, 1, PINO, 2**64), (2**63, 2**63 + 1, PINO, 0), (-1, 0, PINO, 0), (2**64 + 7, 1, PINO, 0), (5, 6, PINO, 0)]
    handed: list[int] = []
    out: list[bytes] = []

    def fallback(ev: tuple[int, int, bytes, int]) -> int:
        import sys
        assert sys.exc_info() == (None, None, None)
        handed.append(ev[0])
        return 0

    splice(events, out, HEAD, None, b"i-", MID, HOST, b",", RESERVED, fallback, FAST_MS_MIN, FAST_MS_MAX, (0, 0))
    assert handed == [0, 2**63, -1, 2**64 + 7] and len(out) == 1 and b'"_id":"i-5"' in out[0]


# ---------------------------------------------------------------- runs of lines with shared keys

def assert_same_docs(lines: list[bytes]) -> None:
    """All lines in ONE build call (one C parser, whose key table every line reuses), each
    document equal to its re-serialised twin, none with a duplicate key."""
    b = _builder()
    fast: list[bytes] = []
    slow: list[bytes] = []
    events = [(i * 1000, i * 1000 + len(ln) + 1, ln, 0) for i, ln in enumerate(lines)]
    b.build("inc", "/x/a.log", events, 1_790_000_000.0, fast)
    b.build_reserialised("inc", "/x/a.log", events, 1_790_000_000.0, slow)
    assert len(fast) == len(slow) == len(lines)
    for line, f, s in zip(lines, fast, slow, strict=True):
        fa, fd, _ = f.split(b"\n")
        sa, sd, _ = s.split(b"\n")
        assert fa == sa and orjson.loads(fd) == orjson.loads(sd), (line, fd, sd)
        assert json.loads(fd.decode("utf-8"), object_pairs_hook=_unique_keys) == orjson.loads(sd)


def test_a_line_with_the_last_lines_keys_is_still_checked_where_it_differs() -> None:
    """pino writes the same keys in the same order line after line: whatever the key table kept
    from the line before (or a shortcut for such runs would skip), what differs after a matching
    prefix is still caught."""
    a = b'{"level":30,"time":1790000000123,"pid":7,"msg":"a","seq":1}'
    cases = {
        b'{"level":30,"time":1790000000124,"pid":7,"msg":"b","seq":2}': [],               # the same keys
        b'{"level":30,"time":1790000000124,"pid":7,"msg":"b","seq":2,"level":40}': [1],   # then a duplicate
        b'{"level":30,"time":1790000000124,"pid":7,"level":1,"seq":2}': [1],              # one in the middle
        b'{"level":30,"time":1790000000124,"pid":7,"msg":"b","seq":2,"x":1}': [],         # then a new key
        b'{"level":30,"time":1790000000124,"pid":7,"host":"b"}': [1],                     # then a reserved one
        b'{"level":30,"time":1790000000124,"pidx":7,"pid":8}': [],                        # a longer key
        b'{"level":30,"time":1790000000124,"pi":7,"pid":8,"pi":9}': [1],                  # a shorter one, twice
        b'{"level":30,"time":1790000000124,"p\\u0069d":7}': [1],                           # escaped: the fallback's
        b'{"level":30,"time":1790000000124,"pid" : 7 ,"msg":"b"}': [],                    # spaces around
        b'{"level":30,"time":1790000000124,"pid":{"pid":1,"pid":2}}': [1],                # inner duplicate
        b'{"level":30,"time":1790000000124}': [],                                         # fewer keys
    }
    for line, handed in cases.items():
        assert run([a, line])[1] == handed, line
        assert run([a, line, line])[1] == handed + [2] * len(handed), line   # and against itself
        assert_same_docs([a, line, a, line])
    # a duplicate after the keys of a line with many keys
    wide = b'{"time":1790000000123,' + b",".join(b'"k%d":%d' % (i, i) for i in range(70)) + b"}"
    assert run([wide, wide, wide[:-1] + b',"k66":0}', wide[:-1] + b',"k3":0}', wide])[1] == [2, 3]
    assert_same_docs([wide, wide, wide[:-1] + b',"k66":0}'])


@settings(max_examples=400, deadline=None)
@given(keys=st.lists(st.sampled_from(["level", "msg", "pid", "a", "ab", "b", "host", "time", "x"]),
                     min_size=0, max_size=8),
       rows=st.lists(st.lists(st.integers(0, 8), max_size=8), min_size=1, max_size=6))
def test_runs_of_lines_sharing_key_prefixes_give_the_reserialised_documents(
        keys: list[str], rows: list[list[int]]) -> None:
    """Random lines built from a few keys (duplicates, reserved ones and shared prefixes included),
    preceded by a line the scan takes: both paths agree on every one, in one call."""
    names = ["level", "msg", "pid", "a", "ab", "b", "host", "time", "x"]
    first = b'{"time":1790000000123,' + b",".join(b'"%s":%d' % (k.encode(), i) for i, k in enumerate(keys)
                                                  if k != "time") + b"}"
    first = first.replace(b",}", b"}")
    lines = [first]
    for row in rows:
        members = [b'"time":1790000000124'] + [b'"%s":%d' % (names[i].encode(), j) for j, i in enumerate(row)]
        lines.append(b"{" + b",".join(members) + b"}")
    assert_same_docs(lines)
