"""ship/http1.py's answer reading, fed byte pieces directly: Content-Length, chunked, to EOF,
1xx before the answer, gzip answers, keep-alive rules, and answers that are not HTTP.

Pure: a stand-in transport records what was written; the answer arrives in whatever pieces the
test (or hypothesis) cuts it into, the way TCP may deliver it.
"""

from __future__ import annotations

import asyncio
import gzip
import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shipper.ship.http1 import Origin, Response, _Conn
from shipper.ship.http_head import ProtocolError, parse_head


class _Transport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.written: list[bytes] = []
        self.aborted = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.written.append(bytes(data))

    def abort(self) -> None:
        self.aborted = True


def _conn(loop: asyncio.AbstractEventLoop) -> tuple[_Conn, _Transport]:
    c = _Conn(loop)
    t = _Transport()
    c.connection_made(t)
    return c, t


def _feed(answer: bytes, cuts: list[int], head_only: bool = False, eof: bool = False) -> tuple[Response | BaseException, _Conn, _Transport]:
    loop = asyncio.new_event_loop()
    try:
        c, t = _conn(loop)
        fut = c.begin(b"POST / HTTP/1.1\r\n\r\n", head_only)
        pos = 0
        for cut in sorted(set(x for x in cuts if 0 < x < len(answer))) + [len(answer)]:
            if fut.done():
                break
            c.data_received(answer[pos:cut])
            pos = cut
        if eof and not fut.done():
            c.eof_received()
        assert fut.done(), "the answer was not complete"
        exc = fut.exception()
        return (exc if exc is not None else fut.result()), c, t
    finally:
        loop.close()


def _chunked(body: bytes, sizes: list[int]) -> bytes:
    out, pos, i = [], 0, 0
    while pos < len(body):
        n = max(1, sizes[i % len(sizes)] if sizes else len(body))
        out.append(b"%x\r\n" % len(body[pos:pos + n]) + body[pos:pos + n] + b"\r\n")
        pos += n
        i += 1
    return b"".join(out) + b"0\r\n\r\n"


BODY = b'{"errors":false,"took":3,"items":[]}'


def test_content_length_answer_and_keep_alive() -> None:
    ans = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(BODY) + BODY
    r, c, t = _feed(ans, [])
    assert isinstance(r, Response)
    assert (r.status, r.body, r.keep_alive) == (200, BODY, True)
    assert r.headers["content-type"] == "application/json"
    assert t.written == [b"POST / HTTP/1.1\r\n\r\n"]
    assert not t.aborted


@settings(max_examples=200, deadline=None)
@given(body=st.binary(max_size=3000), sizes=st.lists(st.integers(1, 700), min_size=1, max_size=8),
       cuts=st.lists(st.integers(0, 4000), max_size=12), ext=st.booleans())
def test_chunked_answer_in_any_pieces_is_the_body(body: bytes, sizes: list[int], cuts: list[int], ext: bool) -> None:
    enc = _chunked(body, sizes)
    if ext and body:
        enc = enc.replace(b"\r\n", b";name=value\r\n", 1)     # a chunk extension is ignored
    ans = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + enc
    r, _c, _t = _feed(ans, cuts)
    assert isinstance(r, Response), r
    assert r.body == body and r.keep_alive


@settings(max_examples=100, deadline=None)
@given(body=st.binary(max_size=2000), cuts=st.lists(st.integers(0, 2200), max_size=10))
def test_content_length_in_any_pieces(body: bytes, cuts: list[int]) -> None:
    ans = b"HTTP/1.1 201 Created\r\ncontent-length: %d\r\n\r\n" % len(body) + body
    r, _c, _t = _feed(ans, cuts)
    assert isinstance(r, Response) and r.status == 201 and r.body == body


def test_chunked_trailers_are_read_past() -> None:
    ans = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\nX-Trailer: 1\r\n\r\n"
    r, _c, _t = _feed(ans, [3, 40, 60])
    assert isinstance(r, Response) and r.body == b"hello" and r.keep_alive


def test_answer_without_length_is_read_to_eof_and_not_kept() -> None:
    ans = b"HTTP/1.0 200 OK\r\nContent-Type: application/json\r\n\r\n" + BODY
    r, _c, _t = _feed(ans, [10], eof=True)
    assert isinstance(r, Response) and r.body == BODY and not r.keep_alive


@pytest.mark.parametrize("head, keep", [
    (b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 0\r\n\r\n", False),
    (b"HTTP/1.1 200 OK\r\nConnection: keep-alive\r\nContent-Length: 0\r\n\r\n", True),
    (b"HTTP/1.0 200 OK\r\nContent-Length: 0\r\n\r\n", False),
    (b"HTTP/1.0 200 OK\r\nConnection: Keep-Alive\r\nContent-Length: 0\r\n\r\n", True),
])
def test_keep_alive_rules(head: bytes, keep: bool) -> None:
    r, _c, _t = _feed(head, [])
    assert isinstance(r, Response) and r.keep_alive is keep


def test_100_continue_then_the_answer() -> None:
    ans = b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 429 Too Many Requests\r\nRetry-After: 7\r\nContent-Length: 2\r\n\r\n{}"
    r, _c, _t = _feed(ans, [20])
    assert isinstance(r, Response) and r.status == 429 and r.headers["retry-after"] == "7" and r.body == b"{}"


def test_head_and_204_have_no_body() -> None:
    r, _c, _t = _feed(b"HTTP/1.1 200 OK\r\nContent-Length: 99\r\n\r\n", [], head_only=True)
    assert isinstance(r, Response) and r.body == b"" and r.keep_alive
    r, _c, _t = _feed(b"HTTP/1.1 204 No Content\r\n\r\n", [])
    assert isinstance(r, Response) and r.status == 204 and r.body == b""


@pytest.mark.parametrize("enc, pack", [("gzip", gzip.compress), ("deflate", zlib.compress)])
def test_compressed_answers_are_decompressed(enc: str, pack: object) -> None:
    z = pack(BODY)   # type: ignore[operator]
    ans = b"HTTP/1.1 200 OK\r\nContent-Encoding: %s\r\nContent-Length: %d\r\n\r\n" % (enc.encode(), len(z)) + z
    r, _c, _t = _feed(ans, [5, 50])
    assert isinstance(r, Response) and r.body == BODY


def test_bytes_beyond_the_answer_mean_the_connection_is_not_reused() -> None:
    ans = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}garbage"
    r, _c, _t = _feed(ans, [])
    assert isinstance(r, Response) and r.body == b"{}" and not r.keep_alive


@pytest.mark.parametrize("ans, words", [
    (b"SSH-2.0-OpenSSH_9.2\r\n\r\n", "not an HTTP/1.x answer"),
    (b"HTTP/1.1 2x0 OK\r\n\r\n", "not an HTTP/1.x answer"),
    (b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n", "bad header line"),
    (b"HTTP/1.1 200 OK\r\nContent-Length: ten\r\n\r\n", "bad Content-Length"),
    (b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n", "bad Content-Length"),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n", "unsupported Transfer-Encoding"),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", "bad chunk size"),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nabXY", "does not end with CRLF"),
    (b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Length: 3\r\n\r\nabc", "does not decompress"),
])
def test_answers_that_are_not_http_are_protocol_errors_and_close(ans: bytes, words: str) -> None:
    r, c, t = _feed(ans, [])
    assert isinstance(r, ProtocolError) and words in str(r)
    assert isinstance(r, ConnectionError)          # callers catch OSError for "no answer"
    assert t.aborted and c.closed


def test_a_head_over_64_kib_is_refused() -> None:
    r, _c, _t = _feed(b"HTTP/1.1 200 OK\r\nX: " + b"a" * 70_000, [])
    assert isinstance(r, ProtocolError) and "64 KiB" in str(r)


@pytest.mark.parametrize("ans, words", [
    (b"", "before it answered"),
    (b"HTTP/1.1 200 OK\r\nContent-Le", "middle of the answer's head"),
    (b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc", "after 3 of 10 bytes"),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nab", "middle of a chunked answer"),
])
def test_eof_before_the_answer_is_whole(ans: bytes, words: str) -> None:
    loop = asyncio.new_event_loop()
    try:
        c, _t = _conn(loop)
        fut = c.begin(b"GET / HTTP/1.1\r\n\r\n", False)
        if ans:
            c.data_received(ans)
        c.eof_received()
        exc = fut.exception()
        assert isinstance(exc, ConnectionError) and words in str(exc), exc
        assert c.got_bytes is bool(ans)
        assert c.closed
    finally:
        loop.close()


def test_bytes_nobody_asked_for_close_the_connection() -> None:
    loop = asyncio.new_event_loop()
    try:
        c, t = _conn(loop)
        c.data_received(b"HTTP/1.1 200 OK\r\n\r\n")
        assert c.closed and t.aborted
    finally:
        loop.close()


def test_parse_head_and_host_header() -> None:
    assert parse_head(b"HTTP/1.1 503 Service Unavailable\r\nRetry-After:  30 ") == (503, True, {"retry-after": "30"})
    assert Origin("http", "es", 80).host_header == "es"
    assert Origin("https", "es", 443).host_header == "es"
    assert Origin("https", "es", 9200).host_header == "es:9200"
    assert Origin("http", "::1", 9200).host_header == "[::1]:9200"


# ---------------------------------------------------------------- inflating, bounded (SPEC, Trust boundaries)

@pytest.mark.parametrize("enc, pack", [("gzip", gzip.compress), ("x-gzip", gzip.compress), ("deflate", zlib.compress)])
def test_an_answer_inflates_up_to_the_limit_and_not_a_byte_more(enc: str, pack: object) -> None:
    from shipper.ship.http1 import inflate
    assert callable(pack)
    exact = bytes(1000)
    assert inflate(pack(exact), enc, limit=1000) == exact
    with pytest.raises(ProtocolError, match="inflates to over 999 bytes"):
        inflate(pack(exact), enc, limit=999)
    with pytest.raises(ProtocolError, match="cut short"):
        inflate(pack(exact)[:-12], enc, limit=1000)
    with pytest.raises(ProtocolError, match="does not decompress"):
        inflate(b"not compressed at all", enc, limit=1000)


def test_a_gzip_bomb_is_a_protocol_error_of_its_answer() -> None:
    from shipper.ship.http1 import MAX_DECODED
    bomb = gzip.compress(bytes(MAX_DECODED + 1), 1)
    loop = asyncio.new_event_loop()
    try:
        c, _t = _conn(loop)
        fut = c.begin(b"GET / HTTP/1.1\r\n\r\n", False)
        c.data_received(b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Length: %d\r\n\r\n" % len(bomb) + bomb)
        with pytest.raises(ProtocolError, match="inflates to over 67,108,864 bytes"):
            fut.result()
    finally:
        loop.close()
