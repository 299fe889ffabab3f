"""Writes the seed corpora of the fuzzers into OUT/scan, OUT/splice, OUT/lines and OUT/fused (one file each),
from bench/gen.py's pino lines, the splice test corpus (tests/unit/test_splice.py) and the
hostile lines of bench/native_worst.py (cut down). Deterministic: same files every run.

    .venv/bin/python fuzz/make_corpus.py build/fuzz/corpus
"""

from __future__ import annotations

import hashlib
import os
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, ROOT)

from bench.gen import PinoGenerator  # noqa: E402
from bench.native_worst import cases  # noqa: E402
from tests.unit.test_splice import CORPUS  # noqa: E402

SEP = b"\x1e"   # fuzz/splice_fuzz.py's line separator


def write(folder: str, blobs: list[bytes]) -> int:
    os.makedirs(folder, exist_ok=True)
    for blob in blobs:
        with open(os.path.join(folder, hashlib.sha1(blob).hexdigest()), "wb") as f:
            f.write(blob)
    return len(set(blobs))


def main(argv: list[str]) -> int:
    out = argv[1] if len(argv) > 1 else os.path.join(ROOT, "build", "fuzz", "corpus")
    pino = [ln.encode() for size in (120, 350, 2000) for ln in PinoGenerator(7, size).batch(60)]
    hostile = [line[:12_000] for _name, line in cases(12_000)]
    with open(os.path.join(ROOT, "tests", "fixtures", "pino", "lines.ndjson"), "rb") as f:
        real = f.read().splitlines()      # the real pino, pino-http and OpenTelemetry (tests/fixtures/pino)
    lines = pino + real + list(CORPUS) + hostile
    n_scan = write(os.path.join(out, "scan"), [ln for ln in lines if len(ln) <= 16_384])
    splice = []
    for i in range(0, len(lines), 3):               # 3 lines a seed, each configuration and flag/offset style
        group = SEP.join(lines[i:i + 3])
        splice.append(bytes([i % 11, (i // 11) % 4 << 4]) + group)
    splice += [bytes([k, 0]) + ln for k in range(11) for ln in CORPUS[:20]]
    n_splice = write(os.path.join(out, "splice"), splice)
    text = b"\n".join(pino[:40]) + b"\n"
    blocks = [text, text.replace(b"\n", b"\r\n"), b"\x00" * 300 + text, text[:-1], b"\n\n\r\n\x00\n" + text]
    heads = [bytes([limit, start, *sizes]) for limit in (4, 47, 255) for start in (0, 3, 0x4b, 0xfe)
             for sizes in ((1, 7, 63, 2), (64, 64, 64, 64))]
    n_lines = write(os.path.join(out, "lines"), [h + blk[:1500] for h in heads for blk in blocks])
    mixed = b"\n".join(pino[:12] + list(CORPUS[:12])) + b"\n"
    fused_heads = [bytes([limit, start, ctl, *sizes]) for limit in (47, 250) for start in (0, 3, 0x4b)
                   for ctl in (0, 1, 2, 3, 4 | (ord("{") % 32) << 3) for sizes in ((1, 7, 63, 2), (250, 250, 250, 250))]
    n_fused = write(os.path.join(out, "fused"), [h + blk[:4000] for h in fused_heads for blk in (text, mixed)])
    print(f"seeds: {n_scan} scan, {n_splice} splice, {n_lines} lines, {n_fused} fused in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
