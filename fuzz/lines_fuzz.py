"""atheris differential harness of line splitting: the C loop (shipper/_native.c split_lines)
vs the Python loop of LineSplitter, over random chunkings of random data.

Input: byte 0 the line limit, byte 1 the start offset (some near 2**62, where the splitter
leaves the C loop) and the chunk types, bytes 2..5 the chunk sizes (cycled), the rest the data.
After every chunk both splitters must have returned the same lines and hold the same state;
the lines must be bytes and be the bytes at their offsets; and the lines and offsets must not
depend on the chunking (one chunk vs these chunks, compared as (start, data, flags): a cut
line's end is not known when it leaves).

    SHIPPER_NATIVE_MODULE=build/fuzz/_native... LD_PRELOAD=.../asan_with_fuzzer.so \\
      .venv/bin/python fuzz/lines_fuzz.py -max_total_time=600 build/fuzz/corpus/lines
"""

from __future__ import annotations

import os
import sys

import atheris

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

with atheris.instrument_imports(include=["shipper"]):
    from shipper import native
    from shipper.tail.lines import LineSplitter

SPLIT = native.module.split_lines if native.module is not None else None
if SPLIT is None:
    sys.exit("shipper/_native.c is not built (pip install -e .), or SHIPPER_NATIVE_MODULE is wrong")
STARTS = (0, 7, 123_456_789, 2**62 - 40, 2**62, 2**63 - 200, 2**63 + 5, 2**70)
KINDS = (bytes, bytearray, memoryview)


def _key(lines: list[tuple[int, int, bytes, int]]) -> list[tuple[int, bytes, int]]:
    return [(s, d, f) for s, _e, d, f in lines]


def TestOneInput(data: bytes) -> None:
    if len(data) < 6:
        return
    limit = 1 + data[0] % 48 if data[0] < 250 else 1 << 20
    start = STARTS[data[1] & 7]
    kinds = data[1] >> 3
    sizes = [1 + x % 64 for x in data[2:6]]
    body = data[6:]
    c, py, whole = LineSplitter(start, limit), LineSplitter(start, limit), LineSplitter(start, limit)
    c.native, py.native, whole.native = SPLIT, None, None
    got: list[tuple[int, int, bytes, int]] = []
    pos = i = 0
    while pos < len(body):
        chunk = body[pos:pos + sizes[i % 4]]
        kind = KINDS[(kinds >> (i % 5)) % 3]
        a, b = c.feed(kind(chunk)), py.feed(kind(chunk))
        assert a == b, (a, b)
        assert all(type(ln[2]) is bytes for ln in a)
        assert (c.offset, c.read_position, c.pending_bytes) == (py.offset, py.read_position, py.pending_bytes)
        got += a
        pos += len(chunk)
        i += 1
    one = whole.feed(body)
    assert _key(got) == _key(one) and c.offset == whole.offset
    a, b, w = c.flush(), py.flush(), whole.flush()
    assert a == b and _key(a) == _key(w) and c.offset == py.offset == whole.offset
    for s, e, d, f in got + a:            # each line is the bytes at its offsets
        at = s - start
        if f:
            assert d == body[at:at + limit]
        else:
            raw = body[at:e - start]
            raw = raw[:-1] if raw.endswith(b"\n") else raw
            assert d == (raw[:-1] if raw.endswith(b"\r") else raw) and 0 < len(d) <= limit and d[0] != 0


def main() -> None:
    atheris.Setup(sys.argv, TestOneInput)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
