"""Unit tests for shipper.parse.container: decoding Docker/CRI lines, joining partial records per
stream, the cap, CRLF, bad UTF-8, format auto per line, Kubernetes paths, and the restart rule:
re-reading from `pending_start` gives the same joined records (hypothesis)."""

from __future__ import annotations

import itertools
from typing import Any

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from shipper.model import FLAG_CONTAINER_UNPARSED, FLAG_TRUNCATED, Line
from shipper.parse.container import (
    ContainerEvent,
    decode_cri,
    decode_docker,
    parse_rfc3339,
    physical_max_line_bytes,
)
from shipper.parse.container_doc import path_metadata
from shipper.parse.container_join import ContainerJoiner
from shipper.tail.lines import LineSplitter
from tests.support.container_writer import cri_pieces, cri_record, docker_pieces, docker_record, interleave, ticks

T0 = 1_796_119_200 * 10**9            # 2026-12-01T10:00:00Z
CID = "3f1c" * 16
MIB = 1024 * 1024


def split(blob: bytes, fmt: str, max_line_bytes: int = MIB, base: int = 0,
          chunks: list[int] | None = None) -> list[Line]:
    """The file's physical lines as the harvester's splitter gives them."""
    sp = LineSplitter(base, physical_max_line_bytes(fmt, max_line_bytes))
    out: list[Line] = []
    pos = 0
    for n in chunks or []:
        out += sp.feed(blob[pos:pos + n])
        pos += n
    out += sp.feed(blob[pos:])
    return out


def join(blob: bytes, fmt: Any = "docker", max_line_bytes: int = MIB, flush: bool = True,
         **kw: Any) -> tuple[list[ContainerEvent], ContainerJoiner]:
    j = ContainerJoiner(fmt, max_line_bytes, **kw)
    out: list[ContainerEvent] = []
    for ln in split(blob, fmt, max_line_bytes):
        out += j.feed(ln, 100.0)
    if flush:
        out += j.flush()
    return out, j


# ------------------------------------------------------------------ decoding

def test_decode_docker() -> None:
    rec = decode_docker(b'{"log":"{\\"level\\":30}\\n","stream":"stdout","time":"2026-12-01T10:00:00.123456789Z"}')
    assert rec is not None
    stream, partial, t, text, attrs = rec
    assert (stream, partial, t, text, attrs) == ("stdout", False, "2026-12-01T10:00:00.123456789Z", b'{"level":30}', None)
    assert decode_docker(b'{"log":"abc","stream":"stderr","time":"2026-12-01T10:00:00Z"}') == \
        ("stderr", True, "2026-12-01T10:00:00Z", b"abc", None)
    # the time is parsed when a document needs it; one that does not parse gives the read time there
    assert decode_docker(b'{"log":"x\\n","stream":"stdout","time":"yesterday"}') == ("stdout", False, "yesterday", b"x", None)


def test_decode_docker_rejects_what_dockerd_never_writes() -> None:
    for line in (b'{"log":"x\\n","stream":"stdin","time":"2026-12-01T10:00:00Z"}',
                 b'{"log":"x\\n","stream":"stdout"}',
                 b'{"log":1,"stream":"stdout","time":"2026-12-01T10:00:00Z"}',
                 b'["log"]', b'{"log":"x\\n","stream":"stdout","time":"2026-12-01T10:00:00Z"',
                 b"plain text"):
        assert decode_docker(line) is None, line


def test_decode_docker_with_raw_bad_utf8_inside_log() -> None:
    # dockerd writes \ufffd itself; bytes that are not UTF-8 (another writer) are replaced, never fatal
    rec = decode_docker(b'{"log":"caf\xe9\\n","stream":"stdout","time":"2026-12-01T10:00:00Z"}')
    assert rec is not None and rec[3] == "caf\ufffd".encode()
    rec = decode_docker(b'{"log":"caf\\ufffd\\n","stream":"stdout","time":"2026-12-01T10:00:00Z"}')
    assert rec is not None and rec[3] == "caf\ufffd".encode()


def test_decode_cri() -> None:
    assert decode_cri(b"2026-12-01T10:00:00.5Z stdout F hello world") == \
        ("stdout", False, "2026-12-01T10:00:00.5Z", b"hello world", None)
    assert decode_cri(b"2026-12-01T11:00:00.000000000+01:00 stderr P part") == \
        ("stderr", True, "2026-12-01T11:00:00.000000000+01:00", b"part", None)
    assert decode_cri(b"2026-12-01T10:00:00Z stdout F  two  spaces ") == \
        ("stdout", False, "2026-12-01T10:00:00Z", b" two  spaces ", None)
    assert decode_cri(b"2026-12-01T10:00:00Z stdout P:id=7 x")[1] is True       # type: ignore[index]
    assert decode_cri(b"2026-12-01T10:00:00Z stdout X x")[1] is False           # type: ignore[index]
    assert decode_cri(b"2026-12-01T10:00:00Z stdout X x", strict=True) is None
    for line in (b"2026-12-01T10:00:00Z stdin F x", b"2026-12-01T10:00:00Z stdout", b"2026-12-01T10:00:00Z stdout F",
                 b"2026-12-01 10:00:00 stdout F x", b"2026/12/01T10:00:00Z stdout F x", b"hello"):
        assert decode_cri(line) is None, line


def test_parse_rfc3339_layouts() -> None:
    assert parse_rfc3339("2026-12-01T10:00:00Z") == 1796119200.0
    assert parse_rfc3339("2026-12-01T10:00:00.25Z") == 1796119200.25
    assert parse_rfc3339("2026-12-01T05:30:00-04:30") == 1796119200.0
    for bad in ("2026-12-01T10:00:00", "2026-12-01T10:00:00.Z", "2026-12-01T10:00:60Z", "2026-02-30T10:00:00Z",
                "2026-12-01T10:00:00+0100", "２０２６-12-01T10:00:00Z", ""):
        assert parse_rfc3339(bad) is None, bad


# ------------------------------------------------------------------ joining

def test_docker_100k_line_in_7_pieces_joins_with_first_offsets_and_time() -> None:
    msg = (b'{"level":30,"msg":"' + b"x" * (100 * 1024) + b'"}')
    head = docker_record(b"before\n", "stdout", T0)
    pieces = docker_pieces(msg, "stdout", T0 + 5 * 10**9)
    assert len(pieces) == 7
    blob = head + b"".join(pieces)
    evs, j = join(blob)
    assert [e[2] for e in evs] == [b"before", msg]
    start, end, _data, flags, stream, t, attrs = evs[1]
    assert (start, end, flags, stream, attrs) == (len(head), len(blob), 0, "stdout", None)
    assert parse_rfc3339(t) == 1796119205.0
    assert j.pending_start is None


def test_cri_100k_line_in_7_pieces() -> None:
    msg = b"y" * (100 * 1024)
    pieces = [cri_record(p.split(b" ", 3)[3][:-1], "stderr", p.split(b" ", 3)[2].decode(), T0 + i)
              for i, p in enumerate(cri_pieces(msg, "stderr", 0))]
    assert len(pieces) == 7 and [p.split(b" ")[2] for p in pieces] == [b"P"] * 6 + [b"F"]
    evs, _ = join(b"".join(pieces), "cri")
    assert len(evs) == 1 and evs[0][2] == msg and evs[0][4] == "stderr"
    assert parse_rfc3339(evs[0][5]) == T0 / 1e9          # the first piece's time


def test_interleaved_stdout_stderr_partials() -> None:
    out_msg = b"O" * 40000
    err_msg = b"E" * 35000
    outs = docker_pieces(out_msg, "stdout", T0)
    errs = docker_pieces(err_msg, "stderr", T0 + 1)
    short = docker_record(b"short\n", "stderr", T0 + 2)
    recs = interleave(outs, errs, [0, 1, 0, 1]) + [short]
    # stdout P, stderr P, stdout P, stderr P, stdout F, stderr F, stderr short
    blob = b"".join(recs)
    evs, _ = join(blob)
    assert [(e[4], len(e[2])) for e in evs] == [("stdout", 40000), ("stderr", 35000), ("stderr", 5)]
    offs = list(itertools.accumulate([0] + [len(r) for r in recs]))
    assert evs[0][:2] == (offs[0], offs[5])
    assert evs[1][:2] == (offs[1], offs[6])


def test_pending_start_is_never_inside_an_emitted_record() -> None:
    # stdout P @a, stderr P @b, stdout F @c: stdout is done but stderr still holds from b; a
    # checkpoint at b would re-read stdout's F alone, so the safe offset stays at a
    o1, o2 = docker_pieces(b"o" * 20000, "stdout", T0)
    e1, e2 = docker_pieces(b"e" * 20000, "stderr", T0)
    recs = [o1, e1, o2, e2]
    lines = split(b"".join(recs), "docker")
    j = ContainerJoiner("docker", MIB)
    seen = []
    for ln in lines:
        j.feed(ln, 0.0)
        seen.append(j.pending_start)
    assert seen == [0, 0, 0, None]


def test_pending_start_moves_on_once_interleaving_ends() -> None:
    o1, o2 = docker_pieces(b"o" * 20000, "stdout", T0)
    e1, e2 = docker_pieces(b"e" * 20000, "stderr", T0)
    recs = [o1, o2, e1, docker_record(b"x\n", "stdout", T0), e2]
    lines = split(b"".join(recs), "docker")
    j = ContainerJoiner("docker", MIB)
    seen = []
    for ln in lines:
        j.feed(ln, 0.0)
        seen.append(j.pending_start)
    assert seen == [0, None, lines[2][0], lines[2][0], None]


def test_hanging_partial_waits_until_flush() -> None:
    blob = docker_record(b"no newline yet", "stdout", T0)
    evs, j = join(blob, flush=False)
    assert evs == [] and j.pending_start == 0
    assert [e[2] for e in j.flush()] == [b"no newline yet"]
    assert j.pending_start is None


def test_crlf_inside_log_is_dropped_like_a_file_line() -> None:
    blob = (docker_record(b"dos line\r\n", "stdout", T0)
            + docker_record(b"a" * 16384 + b"\r", "stdout", T0) + docker_record(b"\n", "stdout", T0)
            + docker_record(b"inner\rcarriage\n", "stdout", T0)
            + docker_record(b"\r\n", "stdout", T0))
    evs, _ = join(blob)
    assert [e[2] for e in evs] == [b"dos line", b"a" * 16384, b"inner\rcarriage"]   # an empty line is no event
    evs, _ = join(cri_record(b"crio keeps it\r", "stdout", "F", T0, "crio"), "cri")
    assert [e[2] for e in evs] == [b"crio keeps it"]


def test_non_utf8_inside_cri_text_is_kept_and_pieces_rejoin_split_characters() -> None:
    text = "żółw 🐢".encode()
    cut = 2                                    # inside the 2-byte ż
    blob = (cri_record(text[:cut - 1], "stdout", "P", T0) + cri_record(text[cut - 1:], "stdout", "F", T0)
            + cri_record(b"bad \xff\xfe bytes", "stdout", "F", T0))
    evs, _ = join(blob, "cri")
    assert [e[2] for e in evs] == [text, b"bad \xff\xfe bytes"]


def test_cap_cuts_the_joined_text_and_holds_no_more() -> None:
    msg = b"z" * (100 * 1024)
    blob = b"".join(docker_pieces(msg, "stdout", T0)) + docker_record(b"next\n", "stdout", T0)
    j = ContainerJoiner("docker", 1000)
    evs: list[ContainerEvent] = []
    for ln in split(blob, "docker", 1000):
        evs += j.feed(ln, 0.0)
        assert j.held_bytes <= 1001
    assert [(len(e[2]), e[3]) for e in evs] == [(1000, FLAG_TRUNCATED), (4, 0)]
    assert evs[0][1] == len(blob) - len(docker_record(b"next\n", "stdout", T0))   # all pieces consumed


def test_cap_exactly_with_crlf_is_not_truncated() -> None:
    evs, _ = join(docker_record(b"q" * 100 + b"\r\n", "stdout", T0), max_line_bytes=100)
    assert [(len(e[2]), e[3]) for e in evs] == [(100, 0)]
    evs, _ = join(docker_record(b"q" * 101 + b"\n", "stdout", T0), max_line_bytes=100)
    assert [(len(e[2]), e[3]) for e in evs] == [(100, FLAG_TRUNCATED)]


def test_cri_line_cut_by_the_splitter_still_decodes_and_guards_the_checkpoint() -> None:
    cap = 64
    p1 = cri_record(b"a" * 50, "stdout", "P", T0)
    f = cri_record(b"b" * 5000, "stdout", "F", T0)        # longer than the splitter's cap
    nxt = cri_record(b"next", "stdout", "F", T0)
    blob = p1 + f + nxt
    sp = LineSplitter(0, physical_max_line_bytes("cri", cap))
    j = ContainerJoiner("cri", cap)
    evs = []
    first = sp.feed(blob[:len(p1) + 1000])             # the F line is cut and emitted at once
    for ln in first:
        evs += j.feed(ln, 0.0)
    assert [(len(e[2]), e[3]) for e in evs] == [(cap, FLAG_TRUNCATED)]
    assert sp.offset == len(p1)                        # the splitter stays at the cut line ...
    assert j.pending_start == 0                        # ... so the checkpoint stays at the record's start
    for ln in sp.feed(blob[len(p1) + 1000:]):
        evs += j.feed(ln, 0.0)
    assert [e[2] for e in evs][1:] == [b"next"] and j.pending_start is None


def test_format_docker_line_that_is_no_record_is_flagged() -> None:
    evs, _ = join(b"garbage line\n" + docker_record(b"ok\n", "stdout", T0))
    assert [(e[2], e[3], e[4]) for e in evs] == [(b"garbage line", FLAG_CONTAINER_UNPARSED, ""), (b"ok", 0, "stdout")]


def test_auto_recognises_docker_cri_and_plain_per_line() -> None:
    pino = b'{"level":30,"time":1796119200000,"msg":"plain"}'
    blob = (pino + b"\n" + docker_record(b"from docker\n", "stderr", T0)
            + cri_record(b"from cri", "stdout", "F", T0) + b"2026-12-01 10:00:00 INFO python\n")
    evs, _ = join(blob, "auto")
    assert [(e[2], e[3], e[4]) for e in evs] == [(pino, 0, ""), (b"from docker", 0, "stderr"),
                                                  (b"from cri", 0, "stdout"), (b"2026-12-01 10:00:00 INFO python", 0, "")]


def test_auto_fast_path_for_plain_batches() -> None:
    j = ContainerJoiner("auto", MIB)
    plain = split(b'{"level":30,"msg":"a"}\nhello\n2026-12-01 10:00:00 INFO x\n', "auto")
    assert j.feed_lines(plain, 0.0) is None
    mixed = split(docker_record(b"partial", "stdout", T0), "auto")
    assert j.feed_lines(mixed, 0.0) == [] and j.pending_start == 0
    assert j.feed_lines(plain, 0.0) == [(ln[0], ln[1], ln[2], 0, "", "", None) for ln in plain]
    long = split(b"w" * 300 + b"\n", "auto", 100)
    assert ContainerJoiner("auto", 100).feed_lines(long, 0.0) == [(0, 301, b"w" * 100, FLAG_TRUNCATED, "", "", None)]


def test_multiline_per_stream_after_joining() -> None:
    trace_err = [b"2026-12-01 10:00:00 ERROR boom", b"Traceback (most recent call last):", b'  File "x.py"',
                 b"ValueError: bad"]
    recs = [cri_record(trace_err[0], "stderr", "F", T0), cri_record(b"2026-12-01 10:00:00 INFO out", "stdout", "F", T0 + 1)]
    recs += [cri_record(t, "stderr", "F", T0 + 2) for t in trace_err[1:]]
    recs += [cri_record(b"2026-12-01 10:00:01 INFO next", "stderr", "F", T0 + 3)]
    evs, _j = join(b"".join(recs), "cri", multiline_start=r"^\d{4}-")
    by_stream = {(e[4], e[2]) for e in evs}
    assert ("stderr", b"\n".join(trace_err)) in by_stream
    assert ("stdout", b"2026-12-01 10:00:00 INFO out") in by_stream
    trace = next(e for e in evs if e[2].startswith(b"2026-12-01 10:00:00 ERROR"))
    assert parse_rfc3339(trace[5]) == T0 / 1e9 and trace[0] == 0


def test_multiline_timeout() -> None:
    j = ContainerJoiner("cri", MIB, multiline_start=r"^START", multiline_timeout_s=1.0)
    for ln in split(cri_record(b"START a", "stdout", "F", T0) + cri_record(b"more", "stdout", "F", T0), "cri"):
        assert j.feed(ln, 10.0) == []
    assert j.next_deadline == 11.0 and j.pending_start == 0
    assert j.flush_due(10.5) == []
    evs = j.flush_due(11.0)
    assert [e[2] for e in evs] == [b"START a\nmore"] and j.pending_start is None


# ------------------------------------------------------------------ Kubernetes paths

def test_path_metadata_containers_link() -> None:
    p = f"/var/log/containers/checkout-7d9f8b6c5-x2x9q_shop_api-server-{CID}.log"
    assert path_metadata(p) == {"kubernetes": {"pod": {"name": "checkout-7d9f8b6c5-x2x9q"}, "namespace": "shop"},
                                "container": {"name": "api-server", "id": CID}}
    assert path_metadata("/host" + p) == path_metadata(p)


def test_path_metadata_pods_target_and_rotations() -> None:
    uid = "0b8e1c2a-5f3d-4e21-9c1b-7a6d5e4f3c2b"
    base = f"/var/log/pods/shop_checkout-7d9f8b6c5-x2x9q_{uid}/api-server/"
    want = {"kubernetes": {"pod": {"name": "checkout-7d9f8b6c5-x2x9q", "uid": uid}, "namespace": "shop"},
            "container": {"name": "api-server"}}
    for name in ("0.log", "3.log", "0.log.20261201-100000", "0.log.20261201-100000.gz"):
        assert path_metadata(base + name) == want, name


def test_path_metadata_docker_and_others() -> None:
    assert path_metadata(f"/var/lib/docker/containers/{CID}/{CID}-json.log") == {"container": {"id": CID}}
    assert path_metadata(f"/var/lib/docker/containers/{CID}/{CID}-json.log.1") == {"container": {"id": CID}}
    assert path_metadata("/var/log/app/app.log") == {}
    assert path_metadata(f"/var/log/containers/nounderscore-{CID}.log") == {}


# ------------------------------------------------------------------ restart: the same joins from pending_start

MESSAGES = st.lists(
    st.tuples(st.sampled_from(["stdout", "stderr"]), st.integers(0, 90),
              st.sampled_from([b"a", b"\xc5\xbc", b"{", b"\r", b" ", b"S"]), st.booleans()),
    min_size=2, max_size=14)


def _render(fmt: str, msgs: list[tuple[str, int, bytes, bool]], pattern: list[int], piece: int) -> bytes:
    """Each message as the runtime's pieces (CRI: `piece` bytes; docker: 16 KiB, so long messages
    are scaled up), then the two streams' records interleaved by `pattern`."""
    per: dict[str, list[bytes]] = {"stdout": [], "stderr": []}
    clock = ticks(T0)
    for stream, n, unit, start_word in msgs:
        body = (b"START " if start_word else b"") + unit * n
        if fmt == "docker":
            body = body * (1 + n // 30) * (150 if n > 60 else 1)          # some over 16 KiB: 2-4 pieces
            per[stream] += docker_pieces(body, stream, next(clock))
        else:
            per[stream] += cri_pieces(body, stream, next(clock), piece)
    return b"".join(interleave(per["stdout"], per["stderr"], pattern))


def _run(blob: bytes, fmt: Any, cap: int, base: int, chunks: list[int], multiline: str | None,
         upto: int | None = None) -> tuple[list[ContainerEvent], ContainerJoiner, LineSplitter]:
    sp = LineSplitter(base, physical_max_line_bytes(fmt, cap))
    j = ContainerJoiner(fmt, cap, multiline_start=multiline, multiline_timeout_s=1e9)
    evs: list[ContainerEvent] = []
    data = blob[base:]
    pos = 0
    last_safe = -1
    sizes = itertools.cycle(chunks or [len(data) or 1])
    while pos < len(data):
        n = next(sizes)
        if upto is not None and pos + n > upto - base:
            n = upto - base - pos
            if n <= 0:
                break
        for ln in sp.feed(data[pos:pos + n]):
            evs += j.feed(ln, 5.0)
        pos += n
        ps = j.pending_start
        safe = sp.offset if ps is None else min(ps, sp.offset)
        assert safe >= last_safe, "the checkpoint went back"
        last_safe = safe
    return evs, j, sp


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(fmt=st.sampled_from(["docker", "cri", "auto"]), msgs=MESSAGES,
       pattern=st.lists(st.integers(0, 1), min_size=8, max_size=60), piece=st.integers(3, 40),
       cap=st.sampled_from([20, 70, MIB]), chunks=st.lists(st.integers(1, 700), max_size=6),
       crash_at=st.floats(0, 1), multiline=st.sampled_from([None, r"^START"]))
@example(fmt="cri", msgs=[("stdout", 20, b"a", False), ("stderr", 20, b"a", False)], pattern=[0, 1] * 5, piece=5,
         cap=MIB, chunks=[], crash_at=0.71, multiline=None)     # stdout done, stderr still partial
def test_any_chunking_and_any_restart_point_give_the_same_records(
        fmt: Any, msgs: list[tuple[str, int, bytes, bool]], pattern: list[int], piece: int, cap: int,
        chunks: list[int], crash_at: float, multiline: str | None) -> None:
    blob = _render("docker" if fmt == "docker" else "cri", msgs, pattern, piece)
    if fmt == "auto" and blob:
        blob = b"plain first line\n" + blob
    ref, j, _sp = _run(blob, fmt, cap, 0, [], multiline)
    ref += j.flush()
    chunked, j2, _ = _run(blob, fmt, cap, 0, chunks, multiline)
    assert chunked + j2.flush() == ref                  # any chunking: the same records, in the same order

    # kill -9 after reading up to some byte: the checkpoint is min(splitter offset, pending_start)
    upto = int(len(blob) * crash_at)
    before, j3, sp3 = _run(blob, fmt, cap, 0, chunks, multiline, upto=upto)
    ps = j3.pending_start
    cp = sp3.offset if ps is None else min(ps, sp3.offset)
    after, j4, _ = _run(blob, fmt, cap, cp, chunks, multiline)
    after += j4.flush()
    _check_restart(ref, before, after, cp)

    # and a kill -9 after physical lines where something is held (up to 12 of them, spread out)
    sp = LineSplitter(0, physical_max_line_bytes(fmt, cap))
    j5 = ContainerJoiner(fmt, cap, multiline_start=multiline, multiline_timeout_s=1e9)
    so_far: list[ContainerEvent] = []
    crashes: list[tuple[int, int]] = []           # (records emitted so far, checkpoint)
    for ln in sp.feed(blob):
        so_far += j5.feed(ln, 5.0)
        ps = j5.pending_start
        if ps is not None and ps < ln[1]:
            crashes.append((len(so_far), ps))
    restarts: dict[int, list[ContainerEvent]] = {}
    for n, cp in crashes[::max(1, len(crashes) // 12)]:
        if cp not in restarts:
            again, j6, _ = _run(blob, fmt, cap, cp, [], multiline)
            restarts[cp] = again + j6.flush()
        _check_restart(ref, so_far[:n], restarts[cp], cp)


def _check_restart(ref: list[ContainerEvent], before: list[ContainerEvent], after: list[ContainerEvent],
                   cp: int) -> None:
    assert set(before) <= set(ref), "emitted before the crash: only records of the reference"
    assert set(after) <= set(ref), "after the restart: no record split at the checkpoint"
    assert set(before) | set(after) == set(ref), "nothing lost"
    assert all(e[0] >= cp for e in after)
    assert {e for e in ref if e[0] >= cp} == set(after)
