"""The cost of hostile lines on both document-building paths: the C scan (`shipper/_native.c`)
and the pure-Python reference, per line, with a plain pino line for scale.

Any process that can write a watched file chooses these bytes, so the C path must never cost
much more than the Python path on any line (issue 20: a pairwise duplicate-key check made a
crafted 1 MiB line 12x dearer in C). Each case is built once per run, timed best-of-`--repeat`;
the table's ratio (C / Python) is what a change is judged by, the machine being shared.

    .venv/bin/python bench/native_worst.py [--repeat 7] [--bytes 1048576]

To compare with an older commit, run this file against that commit's tree (its extension built
in place): `git archive OLD | tar -x -C /tmp/old && (cd /tmp/old && python -m pip wheel ...)`, or
more simply `cd /tmp/old && gcc -O2 -shared -fPIC $(python3-config --includes)
shipper/_native.c -o shipper/_native$(python3-config --extension-suffix) && python
/path/to/bench/native_worst.py` (the import of `shipper` resolves to the current directory first).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable

sys.path.insert(0, os.getcwd())           # `shipper` of the tree this is run from (see above)

from shipper.config import InputConfig  # noqa: E402
from shipper.parse.document import DocBuilder  # noqa: E402

TIME = b'"time":1790000000123'
NOW = 1_790_000_000.0


def key_hash(key: bytes) -> int:
    """A mirror of key_hash in shipper/_native.c (tests/unit/test_splice_native.py holds one too),
    to craft keys that collide in its table."""
    m = 2**64 - 1
    h = 0x243F6A8885A308D3 ^ len(key)
    for i in range(0, len(key), 8):
        w = int.from_bytes(key[i:i + 8], "little")
        h = ((h ^ w) * 0x9E3779B97F4A7C15) & m
        h ^= h >> 29
    h = (h * 0xBF58476D1CE4E5B9) & m
    return h ^ (h >> 32)


def colliding_keys(n: int, slot: int = 7) -> list[bytes]:
    out: list[bytes] = []
    i = 0
    while len(out) < n:
        k = b"c%d" % i
        if key_hash(k) >> 52 == slot:
            out.append(k)
        i += 1
    return out


def objects_line(obj: bytes, size: int) -> bytes:
    """An array of copies of `obj`, up to about `size` bytes."""
    count = max(1, size // (len(obj) + 1))
    return b"{" + TIME + b',"a":[' + b",".join([obj] * count) + b"]}"


def cases(size: int) -> list[tuple[str, bytes]]:
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))     # gen.py
    from gen import PinoGenerator
    pino = PinoGenerator(1, 350).batch(1)[0].encode()
    keys = 1000
    long_key = b"k" + b"x" * (size // keys - 20)
    one_object = b"{" + TIME + b"," + b",".join(b'"%s%08d":0' % (long_key, i) for i in range(keys)) + b"}"
    short_keys = b"{" + b",".join(b'"k%03d":0' % i for i in range(1000)) + b"}"
    c16 = colliding_keys(17)
    collide16 = b"{" + b",".join(b'"%s":0' % k for k in c16[:16]) + b"}"
    collide17 = b"{" + TIME + b"," + b",".join(b'"%s":0' % k for k in c16) + b',"pad":"' + b"x" * size + b'"}'
    reserved_like = b"{" + b",".join(b'"h%03d":0' % i for i in range(1000)) + b"}"   # length and first byte of "host"
    return [
        ("pino line (350 B)", pino),
        ("1,000 keys of ~1 KiB, one object", one_object),
        ("objects of 1,000 short keys", objects_line(short_keys, size)),
        ("objects of 16 colliding keys", objects_line(collide16, size)),
        ("17 colliding keys, then 1 MiB", collide17),
        ("objects of keys like 'host'", objects_line(reserved_like, size)),
        ("a number of 1 MiB digits", b"{" + TIME + b',"n":0.' + b"1" * size + b"}"),
        ("arrays 63 deep", objects_line(b"[" * 62 + b"1" + b"]" * 62, size)),
        ("strings of escapes", b"{" + TIME + b',"s":"' + b"\\n\\u00e9" * (size // 8) + b'"}'),
    ]


def best(fn: Callable[[], object], repeat: int) -> float:
    t = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        t = min(t, time.perf_counter() - t0)
    return t


def handed_over(b: DocBuilder, events: list[tuple[int, int, bytes, int]]) -> int:
    """How many of `events` the C path hands to the Python one."""
    general = b.build_general
    calls = 0

    def counting(*args: object) -> int:
        nonlocal calls
        calls += 1
        return general(*args)  # type: ignore[arg-type]

    b.build_general = counting  # type: ignore[method-assign, assignment]
    try:
        b.build("inc", "/x/a.log", events, NOW, [])
    finally:
        del b.build_general
    return calls


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--bytes", type=int, default=1024 * 1024, help="size of the crafted lines")
    args = ap.parse_args(argv)
    b = DocBuilder(InputConfig(paths=("/x/*.log",), index="app"), "logs", "h")
    native = b.splice
    if native is None:
        print("the C path is off (not built, or SHIPPER_PURE_PYTHON set): nothing to compare", file=sys.stderr)
        return 1
    print(f"{'case':36} {'bytes':>9} {'C us':>10} {'Python us':>10} {'C/Py':>6}  C took it")
    worst = 0.0
    for name, line in cases(args.bytes):
        reps = 200 if len(line) < 4096 else 1
        events = [(i * 10_000_000, 0, line, 0) for i in range(reps)]
        out: list[bytes] = []

        def run_c() -> None:
            out.clear()
            b.splice = native
            b.build("inc", "/x/a.log", events, NOW, out)

        def run_py() -> None:
            b.splice = None
            b.build("inc", "/x/a.log", events, NOW, [])

        c = best(run_c, args.repeat) / reps
        py = best(run_py, args.repeat) / reps
        b.splice = native
        took = handed_over(b, events[:1]) == 0
        worst = max(worst, c / py) if len(line) >= 4096 else worst
        print(f"{name:36} {len(line):9d} {c * 1e6:10.1f} {py * 1e6:10.1f} {c / py:6.2f}  {'yes' if took else 'no'}")
    b.splice = native
    print(f"worst C/Python ratio over the crafted lines: {worst:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
