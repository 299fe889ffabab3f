"""LineSplitter: chunks of a file -> complete lines with offsets, whatever the chunking.

Pure: no files. The offsets these tests pin are what checkpoints and document `_id`s are made
of, so "same lines, same offsets" after a restart is the exactly-once promise in miniature.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shipper.model import FLAG_TRUNCATED
from shipper.tail import lines as lines_mod
from shipper.tail.lines import LineSplitter
from tests.support.native import c_function


@pytest.fixture(autouse=True, params=["native", "python"])
def split_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Each test twice: with the loop in C (shipper/_native.c, which must be built) and without it."""
    split = c_function("split_lines") if request.param == "native" else None
    monkeypatch.setattr(lines_mod, "native_split_lines", split)
    return str(request.param)


def feed_all(data: bytes, sizes: list[int] | None = None, *, start: int = 0, limit: int = 1024) -> tuple[list, LineSplitter]:
    """Feed `data` in chunks of the given sizes (cycled; one chunk when None)."""
    sp = LineSplitter(start, limit)
    out = []
    if not sizes:
        out.extend(sp.feed(data))
        return out, sp
    pos, i = 0, 0
    while pos < len(data):
        n = max(1, sizes[i % len(sizes)])
        out.extend(sp.feed(data[pos:pos + n]))
        pos += n
        i += 1
    return out, sp


def test_complete_lines_with_offsets() -> None:
    lines, sp = feed_all(b"one\ntwo\nthree\n")
    assert lines == [(0, 4, b"one", 0), (4, 8, b"two", 0), (8, 14, b"three", 0)]
    assert sp.offset == 14 and sp.read_position == 14 and sp.pending_bytes == 0


def test_start_offset_is_honoured() -> None:
    sp = LineSplitter(1000, 64)
    assert sp.feed(b"x\ny\n") == [(1000, 1002, b"x", 0), (1002, 1004, b"y", 0)]
    assert sp.offset == 1004


def test_partial_line_waits_for_its_newline() -> None:
    sp = LineSplitter(0, 64)
    assert sp.feed(b"hel") == []
    assert sp.offset == 0 and sp.read_position == 3 and sp.pending_bytes == 3
    assert sp.feed(b"lo wor") == []
    assert sp.feed(b"ld\nnext") == [(0, 12, b"hello world", 0)]
    assert sp.offset == 12 and sp.read_position == 16


def test_crlf_is_a_line_ending_but_a_lone_cr_is_data() -> None:
    lines, sp = feed_all(b"a\r\nb\rc\r\n\r\nd\r\r\n")
    assert [ln[2] for ln in lines] == [b"a", b"b\rc", b"d\r"]
    assert lines[0][:2] == (0, 3)
    assert sp.offset == 14


def test_empty_lines_are_not_lines_but_count_in_offsets() -> None:
    lines, sp = feed_all(b"\n\na\n\n\nb\n")
    assert lines == [(2, 4, b"a", 0), (6, 8, b"b", 0)]
    assert sp.offset == 8


def test_nul_head_dropped_nul_inside_kept() -> None:
    # the hole a writer without O_APPEND leaves after copytruncate: NULs, then its next line
    data = b"\x00" * 100 + b"after hole\nin\x00side\n\x00\x00\n"
    lines, sp = feed_all(data)
    assert lines == [(100, 111, b"after hole", 0), (111, 119, b"in\x00side", 0)]
    assert sp.offset == len(data)


def test_nul_hole_is_consumed_as_read_not_held() -> None:
    sp = LineSplitter(0, 64)
    for _ in range(10):
        assert sp.feed(b"\x00" * 100_000) == []
        assert sp.pending_bytes == 0          # a 1 GB hole must not sit in memory
    assert sp.offset == 1_000_000
    assert sp.feed(b"line\n") == [(1_000_000, 1_000_005, b"line", 0)]


def test_over_long_complete_line_is_cut_and_flagged() -> None:
    data = b"x" * 50 + b"\nok\n"
    lines, sp = feed_all(data, limit=16)
    assert lines == [(0, 51, b"x" * 16, FLAG_TRUNCATED), (51, 54, b"ok", 0)]
    assert sp.offset == 54


def test_line_of_exactly_limit_is_not_cut_even_with_crlf() -> None:
    data = b"y" * 16 + b"\r\n" + b"z" * 16 + b"\n"
    for sizes in (None, [1], [17], [16, 1, 1]):
        lines, _ = feed_all(data, sizes, limit=16)
        assert lines == [(0, 18, b"y" * 16, 0), (18, 35, b"z" * 16, 0)], sizes


def test_over_long_partial_line_is_emitted_at_once_and_the_rest_skipped() -> None:
    sp = LineSplitter(10, 16)
    first = sp.feed(b"ok\n" + b"a" * 40)
    assert first == [(10, 13, b"ok", 0), (13, 13, b"a" * 16, FLAG_TRUNCATED)]
    # until its newline the checkpointable offset stays at the cut line's start ...
    assert sp.offset == 13 and sp.pending_bytes == 0 and sp.read_position == 53
    assert sp.feed(b"a" * 1000) == []
    assert sp.offset == 13 and sp.read_position == 1053
    # ... and the rest of it is skipped up to the newline
    assert sp.feed(b"aa\nnext\n") == [(1056, 1061, b"next", 0)]
    assert sp.offset == 1061


def test_restart_at_the_offset_reemits_the_same_cut_line() -> None:
    """A restart from a checkpoint taken while skipping re-emits the cut line with the same offset,
    so the document gets the same _id (a 409, not a duplicate) and the rest is not shipped as lines."""
    data = b"head\n" + b"L" * 5000 + b"\ntail\n"
    sp = LineSplitter(0, 64)
    before = sp.feed(data[:3000])
    checkpoint = sp.offset
    assert checkpoint == 5
    again = LineSplitter(checkpoint, 64)
    lines = again.feed(data[checkpoint:])
    assert before[-1] == (5, 5, b"L" * 64, FLAG_TRUNCATED)          # cut before its newline was seen
    assert lines[0] == (5, 5006, b"L" * 64, FLAG_TRUNCATED)         # cut with its newline in the chunk
    assert lines[1][:3] == (5006, 5011, b"tail")
    assert again.offset == len(data)


def test_flush_counts_a_last_line_without_newline() -> None:
    sp = LineSplitter(0, 64)
    assert sp.feed(b"a\nlast words\r") == [(0, 2, b"a", 0)]
    assert sp.flush() == [(2, 13, b"last words", 0)]
    assert sp.offset == 13 and sp.pending_bytes == 0
    assert sp.flush() == []


def test_flush_while_skipping_or_empty_gives_nothing() -> None:
    sp = LineSplitter(0, 8)
    sp.feed(b"z" * 30)
    assert sp.flush() == []
    sp2 = LineSplitter(0, 8)
    sp2.feed(b"\x00\x00\x00")
    assert sp2.flush() == [] and sp2.offset == 3


def test_empty_chunk_changes_nothing() -> None:
    sp = LineSplitter(5, 8)
    sp.feed(b"ab")
    assert sp.feed(b"") == []
    assert sp.offset == 5 and sp.read_position == 7


# ---------------------------------------------------------------- property: chunking does not matter

_piece = st.one_of(
    st.binary(min_size=0, max_size=30),
    st.sampled_from([b"\n", b"\r\n", b"\r", b"\x00", b"\x00" * 5, b"{\"a\":1}\n", b"x" * 40, b"y" * 16 + b"\r\n"]),
)


def _key(lines: list) -> list:
    # `end` of a cut line emitted before its newline is its start (the end is not known yet), so
    # the chunk-independent identity of a line is (start, data, flags): what the document is made of.
    return [(s, d, f) for s, _e, d, f in lines]


@settings(max_examples=400, deadline=None)
@given(pieces=st.lists(_piece, max_size=40), sizes=st.lists(st.integers(1, 50), min_size=1, max_size=10),
       limit=st.integers(1, 24))
def test_any_chunking_yields_the_same_lines_and_offsets(pieces: list[bytes], sizes: list[int], limit: int) -> None:
    data = b"".join(pieces)
    whole, sp1 = feed_all(data, None, limit=limit)
    chunked, sp2 = feed_all(data, sizes, limit=limit)
    assert _key(chunked) == _key(whole)
    assert sp2.offset == sp1.offset
    assert sp2.read_position == sp1.read_position == len(data)
    assert _key(sp2.flush()) == _key(sp1.flush())
    assert sp2.offset == sp1.offset


@settings(max_examples=300, deadline=None)
@given(pieces=st.lists(_piece, max_size=40), cut=st.integers(0, 2000), limit=st.integers(1, 24))
def test_restart_from_any_checkpoint_reproduces_the_rest(pieces: list[bytes], cut: int, limit: int) -> None:
    """Stop after any prefix, restart at the checkpointable offset: every line from that offset on
    is emitted again identically (same start, bytes, flags), and none before it."""
    data = b"".join(pieces)
    whole, _ = feed_all(data, None, limit=limit)
    sp = LineSplitter(0, limit)
    first = sp.feed(data[: min(cut, len(data))])
    checkpoint = sp.offset
    again, _ = feed_all(data[checkpoint:], None, start=checkpoint, limit=limit)
    assert _key(again) == [ln for ln in _key(whole) if ln[0] >= checkpoint]
    # everything emitted before the checkpoint is exactly the lines that start before it
    assert [ln for ln in _key(first) if ln[0] < checkpoint] == [ln for ln in _key(whole) if ln[0] < checkpoint]


@settings(max_examples=200, deadline=None)
@given(lines=st.lists(st.binary(min_size=1, max_size=20).filter(lambda b: b"\n" not in b and b[:1] != b"\x00"
                                                              and b[-1:] != b"\r"), max_size=30))
def test_plain_lines_round_trip(lines: list[bytes]) -> None:
    data = b"".join(ln + b"\n" for ln in lines)
    got, sp = feed_all(data, [7], limit=64)
    assert [g[2] for g in got] == lines
    assert all(data[s:e - 1] == d for s, e, d, _f in got)
    assert sp.offset == len(data)


@settings(max_examples=300, deadline=None)
@given(pieces=st.lists(_piece, max_size=40), sizes=st.lists(st.integers(1, 50), min_size=1, max_size=10),
       limit=st.integers(1, 24), start=st.integers(0, 10**12))
def test_the_c_loop_and_the_python_loop_agree(pieces: list[bytes], sizes: list[int], limit: int, start: int) -> None:
    """Whatever the fixture chose: one splitter on each path, fed the same chunks."""
    split_lines = c_function("split_lines")
    data = b"".join(pieces)
    c, py = LineSplitter(start, limit), LineSplitter(start, limit)
    c.native, py.native = split_lines, None
    pos, i = 0, 0
    while pos < len(data):
        n = sizes[i % len(sizes)]
        assert c.feed(data[pos:pos + n]) == py.feed(data[pos:pos + n])
        assert (c.offset, c.read_position, c.pending_bytes) == (py.offset, py.read_position, py.pending_bytes)
        pos += n
        i += 1
    assert c.flush() == py.flush() and c.offset == py.offset


# ---------------------------------------------------------------- what a review of the C loop found

@pytest.mark.parametrize("kind", [bytearray, memoryview])
def test_any_bytes_like_chunk_gives_bytes_lines_and_a_bytes_carry(kind: type) -> None:
    """A harvester reading into a reused buffer may pass a bytearray or a memoryview; the lines and
    the carry are bytes of their own, so reusing the buffer afterwards changes nothing."""
    data = b"\x00\x00one\ntwo\r\n" + b"x" * 40 + b"\nthree-and-"
    buf = bytearray(data)
    sp = LineSplitter(10, 16)
    got = sp.feed(kind(buf))
    buf[:] = b"?" * len(buf)           # the caller reuses its buffer
    assert got == [(12, 16, b"one", 0), (16, 21, b"two", 0), (21, 62, b"x" * 16, FLAG_TRUNCATED)]
    assert all(type(ln[2]) is bytes for ln in got)
    assert sp.feed(kind(bytearray(b"rest\n"))) == [(62, 77, b"three-and-rest", 0)]
    assert sp.offset == 77


@pytest.mark.parametrize("kind", [bytearray, memoryview])
def test_a_bytes_like_chunk_while_skipping_an_over_long_line(kind: type) -> None:
    sp = LineSplitter(0, 4)
    assert sp.feed(kind(bytearray(b"abcdefgh"))) == [(0, 0, b"abcd", FLAG_TRUNCATED)]
    assert sp.feed(kind(bytearray(b"ij\nok\n"))) == [(11, 14, b"ok", 0)]


def test_offsets_near_2_63_are_exact() -> None:
    """The C loop counts offsets in 64 bits; near 2**63 the splitter loops in Python (whose ints
    do not wrap) rather than let the sum overflow."""
    start = 2**63 - 5
    sp = LineSplitter(start, 64)
    assert sp.feed(b"abc\ndef\n") == [(start, start + 4, b"abc", 0), (start + 4, start + 8, b"def", 0)]
    assert sp.offset == start + 8


def test_the_c_loop_refuses_an_offset_it_cannot_count() -> None:
    split_lines = c_function("split_lines")
    with pytest.raises(OverflowError):
        split_lines(b"abc\n", b"", 2**63 - 3, 64, FLAG_TRUNCATED)
    with pytest.raises(OverflowError):
        split_lines(b"abc\n", b"", -1, 64, FLAG_TRUNCATED)
    assert split_lines(bytearray(b"abc\nd"), memoryview(b"x"), 0, 64, FLAG_TRUNCATED) == ([(0, 5, b"xabc", 0)], 5, 4)
