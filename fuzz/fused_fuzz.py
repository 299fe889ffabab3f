"""atheris differential harness of the fused loop: `_native.split_splice` (LineSplitter.feed_built
with DocBuilder.split_builder) vs splitting with the C loop and then building with DocBuilder.build,
over random chunkings of random data, several input configurations, with and without a sniff.

Input: byte 0 the line limit, byte 1 the start offset (some near 2**62, where the fused loop
leaves the chunk to feed) and the chunk types, byte 2 the configuration and the sniff, bytes 3..6
the chunk sizes (cycled), the rest the data. After every chunk both sides must have appended the
same bulk pairs (the fused side's runs cut apart), counted the same bytes and pairs, left the same lines to build and hold the same splitter
state; a sniff must have seen the first and last line feed gives.

    SHIPPER_NATIVE_MODULE=build/fuzz/_native... LD_PRELOAD=.../asan_with_fuzzer.so \\
      .venv/bin/python fuzz/fused_fuzz.py -max_total_time=600 build/fuzz/corpus/fused
"""

from __future__ import annotations

import os
import sys
from typing import Any

import atheris

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

with atheris.instrument_imports(include=["shipper"]):
    from shipper import native
    from shipper.config import InputConfig
    from shipper.parse.document import DocBuilder
    from shipper.ship.batching import one_pair_each
    from shipper.tail.lines import Built, LineSplitter

if native.module is None:
    sys.exit("shipper/_native.c is not built (pip install -e .), or SHIPPER_NATIVE_MODULE is wrong")
SPLIT, SPLICE, FUSED = native.module.split_lines, native.module.splice, native.module.split_splice
# no file reaches 2**63 bytes (off_t): past 2**64 not even DocBuilder.build can write the offset
STARTS = (0, 7, 123_456_789, 2**62 - 400, 2**62, 2**62 + 5, 2**63 - 5000, 2**63 - 200)
KINDS = (bytes, bytearray, memoryview)
CONFIGS: list[dict[str, Any]] = [
    {},
    {"index": "app-logs"},
    {"index": "app-logs", "fields": {"env": "prod", "nested": {"a": [1, "ü"]}}},
    {"index": "logs-%Y.%m.%d.%H", "format": "json", "ecs": "replace"},
]
NOW = 1_790_000_000.25
PATH = '/var/log/app/ünï "q".log'
INC = "0123456789ab"


def _builder(cfg: dict[str, Any]) -> DocBuilder:
    b = DocBuilder(InputConfig(paths=("/var/log/app/*.log",), **cfg), "logs-%Y.%m.%d", 'web-1 "ü"')
    b.splice, b.split_splice = SPLICE, FUSED
    return b


def _state(sp: LineSplitter) -> tuple[int, int, int, bool]:
    return sp.offset, sp.read_position, sp.pending_bytes, sp._skipping


def TestOneInput(data: bytes) -> None:
    if len(data) < 7:
        return
    limit = 1 + data[0] % 64 if data[0] < 240 else 1 << 20
    start = STARTS[data[1] & 7]
    kinds = data[1] >> 3
    cfg = CONFIGS[data[2] & 3]
    sniffing, sniff_byte = bool(data[2] & 4), data[2] >> 3
    sizes = [1 + x * 4 for x in data[3:7]]
    body = data[7:]
    seen: list[tuple[bytes, bytes]] = []

    def sniff(first: bytes, last: bytes) -> bool:
        seen.append((first, last))
        return bool(first) and first[0] % 32 == sniff_byte

    b1, b2 = _builder(cfg), _builder(cfg)
    ref, fused = LineSplitter(start, limit), LineSplitter(start, limit)
    ref.native = fused.native = SPLIT
    out1: list[bytes] = []
    out2: list[bytes] = []
    counts: dict[int, int] = {}
    pos = i = 0
    while pos < len(body):
        chunk = body[pos:pos + sizes[i % 4]]
        kind = KINDS[(kinds >> (i % 5)) % 3]
        lines = ref.feed(kind(chunk))
        n1 = b1.build(INC, PATH, lines, NOW, out1)
        split = b2.split_builder(INC, PATH, NOW, out2, counts, sniff if sniffing else None)
        assert split is not None
        k0, s0, p0 = len(out2), len(seen), len(one_pair_each(out2, counts))
        rest, built = fused.feed_built(kind(chunk), split)
        assert built.nbytes == sum(map(len, out2[k0:])), built
        assert built.pairs == len(one_pair_each(out2, counts)) - p0, built
        if len(seen) > s0:
            assert seen[s0:] == [(lines[0][2], lines[-1][2])], (seen[s0:], lines)
            if sniff(lines[0][2], lines[-1][2]):
                assert (rest, built) == (lines, Built())
        assert rest == lines[built.lines:] and len(rest) + built.lines == len(lines)
        if built.lines:
            assert (built.first, built.last) == (lines[0][0], lines[built.lines - 1][1])
        n2 = built.nbytes + b2.build(INC, PATH, rest, NOW, out2)
        assert n1 == n2 and one_pair_each(out2, counts) == out1, (out1, out2, counts)
        assert _state(ref) == _state(fused)
        pos += len(chunk)
        i += 1
    assert ref.flush() == fused.flush() and _state(ref) == _state(fused)


def main() -> None:
    atheris.Setup(sys.argv, TestOneInput)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
