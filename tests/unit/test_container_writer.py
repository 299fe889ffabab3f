"""The container log writers of tests/support match the runtimes' own output.

The expected bytes below are the runtimes' own test expectations, restated:
- moby daemon/logger/jsonfilelog/jsonfilelog_test.go (TestJSONFileLogger, ...WithTags): whole files;
- moby daemon/logger/jsonfilelog/jsonlog/jsonlogbytes_test.go (TestJSONLogsMarshalJSONBuf): escaping;
- moby daemon/logger/copier.go: 16 KiB pieces, the last one ending in `\\n`, one time for all;
- containerd pkg/cri/io/logger_test.go (TestRedirectLogs): the tags and contents for each case.
"""

from __future__ import annotations

import itertools
import re

import orjson
import pytest

from shipper.parse.container import decode_cri, decode_docker, parse_rfc3339
from tests.support.container_writer import (
    CONTAINERD_MAX_LINE,
    DOCKER_PIECE,
    ZERO_TIME_NS,
    cri_output,
    cri_pieces,
    docker_escape,
    docker_pieces,
    docker_record,
    dockerd_output,
    go_rfc3339nano,
    ticks,
)


def zero_clock() -> itertools.repeat[int]:
    return itertools.repeat(ZERO_TIME_NS)


def test_dockerd_file_matches_moby_sample() -> None:
    got = b"".join(dockerd_output(b"line1\n", "src1", zero_clock()) + dockerd_output(b"line2\n", "src2", zero_clock())
                   + dockerd_output(b"line3\n", "src3", zero_clock()))
    assert got == (b'{"log":"line1\\n","stream":"src1","time":"0001-01-01T00:00:00Z"}\n'
                   b'{"log":"line2\\n","stream":"src2","time":"0001-01-01T00:00:00Z"}\n'
                   b'{"log":"line3\\n","stream":"src3","time":"0001-01-01T00:00:00Z"}\n')


def test_dockerd_attrs_match_moby_sample() -> None:
    attrs = b'{"tag":"a7317399f3f8/test-container"}'
    got = dockerd_output(b"line1\n", "src1", zero_clock(), attrs)
    assert got == [(b'{"log":"line1\\n","stream":"src1","attrs":{"tag":"a7317399f3f8/test-container"},'
                    b'"time":"0001-01-01T00:00:00Z"}\n')]
    rec = decode_docker(docker_record(b"x\n", "stdout", ZERO_TIME_NS, attrs)[:-1])
    assert rec is not None and rec[4] == {"tag": "a7317399f3f8/test-container"}


@pytest.mark.parametrize("raw, escaped", [
    (b'"A log line with \\\\"', b'"\\"A log line with \\\\\\\\\\""'),   # two backslashes
    (b"A log line", b'"A log line"'),
    (b"A log line with \r", b'"A log line with \\r"'),
    (b"A log line with & < >", b'"A log line with \\u0026 \\u003c \\u003e"'),
    ("A log line with utf8 : 🚀 ψ ω β".encode(), '"A log line with utf8 : 🚀 ψ ω β"'.encode()),
    ("\u2028 \u2029".encode(), b'"\\u2028 \\u2029"'),
    (b"\xaf", b'"\\ufffd"'),
    (b"\x7f", b'"\x7f"'),
    (b"tab\there", b'"tab\\u0009here"'),
])
def test_docker_escaping_matches_jsonlog(raw: bytes, escaped: bytes) -> None:
    assert docker_escape(raw) == escaped
    assert isinstance(orjson.loads(escaped), str)       # always valid JSON, like the Go test checks


@pytest.mark.parametrize("t_ns, text", [
    (1504227661 * 10**9 + 1, "2017-09-01T01:01:01.000000001Z"),   # jsonlogbytes_test
    (ZERO_TIME_NS, "0001-01-01T00:00:00Z"),
    (1796119200 * 10**9 + 120_000_000, "2026-12-01T10:00:00.12Z"),  # trailing zeros dropped
])
def test_go_rfc3339nano(t_ns: int, text: str) -> None:
    assert go_rfc3339nano(t_ns) == text
    t = parse_rfc3339(text)
    assert t is not None and abs(t - t_ns / 1e9) < 1e-6
    assert decode_docker(docker_record(b"x\n", "stdout", t_ns)[:-1]) == ("stdout", False, text, b"x", None)


def test_crio_time_has_nine_digits_and_a_numeric_zone() -> None:
    assert go_rfc3339nano(1796119200 * 10**9 + 5, 0, fixed_nanos=True) == "2026-12-01T10:00:00.000000005+00:00"
    assert go_rfc3339nano(1796119200 * 10**9, 7200) == "2026-12-01T12:00:00+02:00"
    assert parse_rfc3339("2026-12-01T12:00:00+02:00") == 1796119200.0


def test_dockerd_splits_long_lines_at_16k_with_one_time() -> None:
    msg = bytes(range(65, 91)) * 4000                      # 104,000 bytes
    pieces = docker_pieces(msg, "stdout", 1796119200 * 10**9)
    assert len(pieces) == 7
    decoded = [decode_docker(p[:-1]) for p in pieces]
    assert all(d is not None for d in decoded)
    assert [d[1] for d in decoded if d] == [True] * 6 + [False]
    assert {d[2] for d in decoded if d} == {"2026-12-01T10:00:00Z"}
    assert b"".join(d[3] for d in decoded if d) == msg
    assert all(len(d[3]) == DOCKER_PIECE for d in decoded[:6] if d)
    exact = docker_pieces(b"a" * DOCKER_PIECE, "stdout", 0)
    assert [orjson.loads(p)["log"] for p in exact] == ["a" * DOCKER_PIECE, "\n"]


# containerd's TestRedirectLogs: (input, maxLen) -> (tags, contents)
BUF = 4096                       # containerd's minReadBufSize
MAX = BUF * 4
CONTAINERD_CASES = [
    ("test stdout log 1\ntest stdout log 2\n", MAX, "FF", ["test stdout log 1", "test stdout log 2"]),
    ("test stderr log 1\ntest stderr log 2", MAX, "FP", ["test stderr log 1", "test stderr log 2"]),
    ("a" * BUF + "\n" + "a" * BUF + "\n", MAX, "FF", ["a" * BUF, "a" * BUF]),
    ("a" * (MAX + 1) + "\n" + "a" * (MAX + 1) + "\n", MAX, "PFPF", ["a" * MAX, "a", "a" * MAX, "a"]),
    ("a" * (MAX * 2) + "\n" + "a" * (MAX * 2 + 1) + "\n", MAX, "PFPPF", ["a" * MAX] * 4 + ["a"]),
    ("a" * (BUF * 3 // 2 + 10) + "\n", BUF // 2, "PPPF", ["a" * (BUF // 2)] * 3 + ["a" * 10]),
    ("a" * (BUF - 1) + "\r\n" + "a" * (BUF - 1) + "\r\n", 1 << 40, "FF", ["a" * (BUF - 1)] * 2),
]


@pytest.mark.parametrize("output, max_len, tags, contents", CONTAINERD_CASES)
def test_containerd_pieces_match_containerd_tests(output: str, max_len: int, tags: str, contents: list[str]) -> None:
    lines = cri_output(output.encode(), "stdout", ticks(), max_len)
    assert all(ln.endswith(b"\n") for ln in lines)
    fields = [ln[:-1].split(b" ", 3) for ln in lines]
    assert "".join(f[2].decode() for f in fields) == tags
    assert [f[3].decode() for f in fields] == contents
    for f in fields:
        assert re.fullmatch(rb"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d{1,9})?Z", f[0])
        assert f[1] == b"stdout"
    for ln, tag, content in zip(lines, tags, contents):
        rec = decode_cri(ln[:-1], strict=True)
        assert rec is not None and rec[0] == "stdout" and rec[1] == (tag == "P") and rec[3] == content.encode()


def test_cri_default_piece_size_and_empty_line() -> None:
    pieces = cri_pieces(b"x" * (100 * 1024), "stderr", 0)
    assert len(pieces) == 7 and CONTAINERD_MAX_LINE == 16 * 1024
    assert cri_pieces(b"", "stdout", 0) == [b"1970-01-01T00:00:00Z stdout F \n"]
    rec = decode_cri(b"1970-01-01T00:00:00Z stdout F ")
    assert rec == ("stdout", False, "1970-01-01T00:00:00Z", b"", None)
