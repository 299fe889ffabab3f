"""The fused loop (`_native.split_splice`, `LineSplitter.feed_built`, `DocBuilder.split_builder`)
gives exactly what splitting and then building gives: the same bulk pairs in the same order, the
same byte count, the same splitter state and the same lines left to build, over any chunking of
any bytes (pino lines, broken JSON, duplicate keys, NUL holes, CRLF, empty and over-long lines),
several input configurations and both kinds of carry. Where it declines a chunk (a possible cut
line at its end, a sniff that says container) nothing was built and `feed` takes it."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shipper.config import InputConfig
from shipper.model import FLAG_TRUNCATED
from shipper.parse.document import DocBuilder
from shipper.ship.batching import group, group_parts, one_pair_each
from shipper.tail.lines import Built, LineSplitter
from tests.support.native import c_function

NOW = 1_790_000_000.25
PATH = '/var/log/app/ünï "q".log'
INC = "0123456789ab"
CONFIGS: list[dict[str, Any]] = [
    {},                                                     # index by event time: prefix_for per second
    {"index": "app-logs"},                                  # a constant action prefix
    {"index": "app-logs", "fields": {"env": "prod", "nested": {"a": [1, "ü"]}}},
    {"index": "logs-%Y.%m.%d.%H", "format": "json"},
]

PINO = [
    b'{"level":30,"time":1790000000123,"pid":7,"hostname":"h","msg":"hello","seq":1}',
    b'{"level":50,"time":1790003600999,"msg":"boom","err":{"type":"Error","stack":"Error: x\\n  at f"}}',
    '{"level":"warn","time":1790000000001,"msg":"grüße 日本","ключ":"значение"}'.encode(),
    b'{"a":1,"a":2,"msg":"dup","time":1790000000004}',             # a duplicate key: the fallback's
    b'{"msg":"no time"}',                                           # no time: the fallback's
    b'{"env":"x","time":1790000000005}',                            # an input's field: the fallback's
    b'{"time":1790000000006,"n":' + b"1" * 120 + b"}",              # a long number: the fallback's
    b"plain text line",
    b'{"broken": ',
    b"[" * 300 + b"]" * 300,                                        # orjson refuses to write it back: TypeError
    b'{"x":' + b"[" * 300 + b"]" * 300 + b',"time":1790000000007}',
]
_piece = st.one_of(
    st.sampled_from(PINO),
    st.sampled_from([b"\n", b"\r\n", b"\r", b"\x00", b"\x00" * 5, b"", b" ", b"{}"]),
    st.binary(max_size=12),
)


def _builder(cfg: dict[str, Any]) -> DocBuilder:
    b = DocBuilder(InputConfig(paths=("/var/log/app/*.log",), **cfg), "logs-%Y.%m.%d", 'web-1 "ü"')
    b.splice = c_function("splice")                     # the C paths under test, even with SHIPPER_PURE_PYTHON
    b.split_splice = c_function("split_splice")
    return b


def _splitter(start: int, limit: int) -> LineSplitter:
    sp = LineSplitter(start, limit)
    sp.native = c_function("split_lines")
    return sp


def _state(sp: LineSplitter) -> tuple[int, int, int, bool]:
    return sp.offset, sp.read_position, sp.pending_bytes, sp._skipping


def _both(cfg: dict[str, Any], data: bytes, sizes: list[int], start: int, limit: int, kind: type,
          sniffing: bool = False) -> tuple[list[bytes], list[bytes], int]:
    """Feed `data` in chunks to a splitting-then-building pair and to a fused pair; after every
    chunk both must hold the same state and have appended the same pairs. `sniffing`: a sniff
    (true for a chunk whose first line is text) must see exactly the first and last line that
    format auto's sniff sees in the lines `feed` returns. Returns both outputs and how many lines
    the fused loop built itself."""
    seen: list[tuple[bytes, bytes]] = []

    def record(first: bytes, last: bytes) -> bool:
        seen.append((first, last))
        return first.startswith(b"plain")

    sniff = record if sniffing else None
    b1, b2 = _builder(cfg), _builder(cfg)
    ref, fused = _splitter(start, limit), _splitter(start, limit)
    out1: list[bytes] = []
    out2: list[bytes] = []
    counts: dict[int, int] = {}
    built_lines = pos = i = 0
    while pos < len(data):
        chunk = data[pos:pos + sizes[i % len(sizes)]]
        lines = ref.feed(kind(chunk))
        n1 = b1.build(INC, PATH, lines, NOW, out1)
        split = b2.split_builder(INC, PATH, NOW, out2, counts, sniff)
        assert split is not None
        k0, s0, p0 = len(out2), len(seen), len(one_pair_each(out2, counts))
        rest, built = fused.feed_built(kind(chunk), split)
        if len(seen) > s0:
            assert seen[s0:] == [(lines[0][2], lines[-1][2])]
            if lines[0][2].startswith(b"plain"):
                assert (rest, built) == (lines, Built())
        assert built.nbytes == sum(map(len, out2[k0:]))
        assert len(rest) + built.lines == len(lines)
        assert rest == lines[built.lines:]                   # what is left is the tail of the same lines
        if built.lines:
            assert (built.first, built.last) == (lines[0][0], lines[built.lines - 1][1])
        assert built.pairs == len(one_pair_each(out2, counts)) - p0
        n2 = built.nbytes + b2.build(INC, PATH, rest, NOW, out2)
        assert n1 == n2
        assert one_pair_each(out2, counts) == out1           # the same pairs, in order
        assert all(v > 1 and out2[i].count(b"\n") == 2 * v for i, v in counts.items())
        assert _state(ref) == _state(fused)
        built_lines += built.lines
        pos += len(chunk)
        i += 1
    assert ref.flush() == fused.flush() and _state(ref) == _state(fused)
    return out1, one_pair_each(out2, counts), built_lines


@settings(max_examples=400, deadline=None)
@given(pieces=st.lists(_piece, max_size=30), sizes=st.lists(st.integers(1, 400), min_size=1, max_size=6),
       limit=st.sampled_from([1, 8, 40, 100, 1 << 20]), start=st.sampled_from([0, 7, 10**12, 2**62 - 300]),
       cfg=st.sampled_from(CONFIGS), kind=st.sampled_from([bytes, bytearray, memoryview]), sniffing=st.booleans())
def test_fused_equals_split_then_build(pieces: list[bytes], sizes: list[int], limit: int, start: int,
                                       cfg: dict[str, Any], kind: type, sniffing: bool) -> None:
    data = b"".join(p + (b"\n" if j % 3 else b"") for j, p in enumerate(pieces))
    _both(cfg, data, sizes, start, limit, kind, sniffing)


def test_a_backlog_is_built_by_the_fused_loop_and_equals_split_then_build() -> None:
    data = b"".join(PINO[j % 3] + b"\n" for j in range(3000))
    out1, out2, built = _both({}, data, [65536], 0, 1 << 20, memoryview)
    assert out1 == out2 and len(out2) == 3000 and built == 3000


def test_lines_the_scan_refuses_get_the_documents_build_gives_them() -> None:
    """Every fallback: a duplicate key, no time, an input's field, a long number, text, broken
    JSON, nesting orjson will not write back (TypeError: as text, flagged), a cut line."""
    data = b"".join(p + b"\n" for p in PINO) + b"x" * 1100 + b"\n"
    out1, out2, built = _both({"index": "app-logs", "fields": {"env": "prod"}}, data, [8192], 0, 1000, bytes)
    assert built == len(PINO) + 1 and len(out2) == len(PINO) + 1
    docs = [orjson.loads(p.split(b"\n")[1]) for p in out2]
    assert docs[-1]["log"]["flags"] == ["truncated"]
    assert "json_parse_failed" in docs[len(PINO) - 1]["log"]["flags"]      # the object nested 301 deep


def test_a_chunk_ending_in_a_line_longer_than_the_limit_is_left_to_feed() -> None:
    b = _builder({})
    sp = _splitter(0, 50)
    out: list[bytes] = []
    split = b.split_builder(INC, PATH, NOW, out, {})
    assert split is not None
    chunk = PINO[0][:40] + b"\n" + b"y" * 51                  # the tail may become a cut line
    assert split(chunk, b"", 0, 50, FLAG_TRUNCATED) is None and out == []
    rest, built = sp.feed_built(chunk, split)
    assert built == Built() and [ln[3] for ln in rest] == [0, FLAG_TRUNCATED]
    assert _state(sp) == (41, len(chunk), 0, True)          # skipping the rest; the cut line's start kept


def test_a_sniff_that_says_container_leaves_the_chunk_to_feed_before_building() -> None:
    seen: list[tuple[bytes, bytes]] = []

    def sniff(first: bytes, last: bytes) -> bool:
        seen.append((first, last))
        return first.startswith(b'{"log"')

    docker = b'{"log":"hi\\n","stream":"stdout","time":"2026-12-03T08:00:00.000000001Z"}'
    for lines, declined in (([docker, PINO[0]], True), ([PINO[0], PINO[1], PINO[2]], False)):
        b, sp = _builder({}), _splitter(0, 1 << 20)
        out: list[bytes] = []
        counts: dict[int, int] = {}
        split = b.split_builder(INC, PATH, NOW, out, counts, sniff)
        assert split is not None
        rest, built = sp.feed_built(b"\x00\x00\r\n" + b"\n".join(lines) + b"\npartial", split)
        assert seen[-1] == (lines[0], lines[-1])             # the lines feed would give: NULs, \r, empties gone
        assert (len(rest), built.lines, built.pairs) == ((len(lines), 0, 0) if declined else (0, len(lines), len(lines)))
        assert (out, counts) == (([], {}) if declined else ([out[0]], {0: 3}))   # one run: one bytes object
        assert sp.pending_bytes == len(b"partial")


def test_a_carry_joined_line_and_offsets_near_2_62() -> None:
    """The first line may begin in the carry (its bytes are joined before the scan); offsets up to
    the C loop's bound are counted there, past it `feed` takes over."""
    line = PINO[0]
    for start in (0, 2**62 - 5 * len(line), 2**62 + 10):
        data = b"".join(line + b"\n" for _ in range(8))
        _both({}, data, [len(line) // 2, len(line) + 3], start, 1 << 20, bytes)


@pytest.mark.parametrize("kind", [bytearray, memoryview])
def test_the_chunk_buffer_is_not_kept(kind: type) -> None:
    """Pairs and fallback lines are bytes of their own: the read buffer may be reused at once."""
    b, sp = _builder({}), _splitter(0, 1 << 20)
    out: list[bytes] = []
    buf = bytearray(PINO[0] + b"\n" + PINO[7] + b"\n")
    split = b.split_builder(INC, PATH, NOW, out, {})
    assert split is not None
    rest, built = sp.feed_built(kind(buf) if kind is memoryview else buf, split)
    before = list(out)
    buf[:] = b"z" * len(buf)
    assert out == before and built.lines == 2 and all(type(p) is bytes for p in out)


def test_no_fused_loop_without_the_c_path() -> None:
    b = DocBuilder(InputConfig(paths=("/x/*.log",), include_lines=("a",)), "logs", "h")   # a filter: Python only
    assert b.split_builder(INC, PATH, NOW, [], {}) is None
    b = DocBuilder(InputConfig(paths=("/x/*.log",), format="text"), "logs", "h")
    assert b.split_builder(INC, PATH, NOW, [], {}) is None


@settings(max_examples=300, deadline=None)
@given(sizes=st.lists(st.integers(1, 300), min_size=1, max_size=40), runs=st.lists(st.integers(1, 6), min_size=1),
       max_events=st.integers(1, 12), max_bytes=st.integers(1, 4000))
def test_grouping_parts_that_hold_runs_of_pairs_equals_grouping_the_pairs(
        sizes: list[int], runs: list[int], max_events: int, max_bytes: int) -> None:
    """The draft writer gets the reader's runs as one part each (`Draft.multi`): the bodies are
    the same as from one part per pair, whatever the limits."""
    pairs = [b'{"create":{"_id":"%d"}}\n{"p":"%s"}\n' % (i, b"x" * n) for i, n in enumerate(sizes)]
    parts: list[bytes] = []
    multi: dict[int, int] = {}
    i = r = 0
    while i < len(pairs):
        k = runs[r % len(runs)]
        run = pairs[i:i + k]
        if len(run) > 1:
            multi[len(parts)] = len(run)
        parts.append(b"".join(run))
        i += k
        r += 1
    assert one_pair_each(parts, multi) == pairs
    assert group(parts, max_events, max_bytes, multi) == group(pairs, max_events, max_bytes)
    # what the draft writer hands the spool thread: the same bodies, left as their parts
    bodies = group_parts(parts, max_events, max_bytes, multi)
    assert [(b"".join(b), n) for b, n in bodies] == group(pairs, max_events, max_bytes)
    assert all(b and all(b) for b, _ in bodies)                     # no empty body, no empty part
