"""atheris differential harness of the document builder: C path vs Python path vs full
re-serialisation, across several input configurations.

Input: byte 0 picks the configuration, byte 1 the flags and offsets, the rest is up to 16 lines
separated by 0x1e (so a line may hold a newline, as a multiline join does). For every event the
three builds must give one pair each, with the same action line; each document must parse with
orjson and with a strict `json` that refuses duplicate keys (as Elasticsearch does), and all
three must be the same document. Any exception is a finding (DocBuilder.build never raises).

    SHIPPER_NATIVE_MODULE=build/fuzz/_native... LD_PRELOAD=.../asan_with_fuzzer.so \\
      .venv/bin/python fuzz/splice_fuzz.py -max_total_time=600 build/fuzz/corpus/splice
(fuzz/README.md; without the two variables it fuzzes the installed, uninstrumented build)
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import atheris

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

with atheris.instrument_imports(include=["shipper"]):
    import orjson

    from shipper import native
    from shipper.config import InputConfig
    from shipper.model import FLAG_TRUNCATED
    from shipper.parse.document import DocBuilder

CONFIGS: list[dict[str, Any]] = [
    {},                                                            # index by event time: prefix_for
    {"index": "app-logs"},                                         # one index: a constant action prefix
    {"index": "app-logs", "fields": {"env": "prod", "nested": {"a": [1, "ü"]}}},
    {"fields": {"service": {"name": "api", "tags": ["a"]}, "n": 3}},
    {"index": "logs-%Y.%m.%d.%H", "format": "json"},
    {"index": "app-{service.name|none}-%Y.%m"},                    # reads a field: Python path only
    {"include_lines": ["x", "hello"]},                             # a line filter: Python path only
    {"fields": {"message": "fixed"}},                              # overwrites an added field: never spliced
    {"ecs": "replace", "index": "app-logs"},                       # ECS: the C path takes lines nothing maps from
    {"ecs": "off"},
    {"fields": {"http": {"version": "1.1"}}},                      # a field where ECS fields go: never spliced
]
OFFSETS = (0, 1_000_000, 2**62, 2**63 - 8)   # base offset; events 1000 apart
SEP = b"\x1e"
NOW = 1_790_000_000.25
PATH = '/var/log/app/ünï "q".log'

SPLICE = native.module.splice if native.module is not None else None
if SPLICE is None:
    sys.exit("shipper/_native.c is not built (pip install -e .), or SHIPPER_NATIVE_MODULE is wrong")
BUILDERS = [DocBuilder(InputConfig(paths=("/var/log/app/*.log",), **cfg), "logs-%Y.%m.%d", 'web-1 "ü"')
            for cfg in CONFIGS]


def _unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    keys = [k for k, _ in pairs]
    if len(keys) != len(set(keys)):
        raise AssertionError(f"duplicate keys {keys}")
    return dict(pairs)


def _parse(doc: bytes) -> tuple[Any, Any]:
    return orjson.loads(doc), json.loads(doc.decode("utf-8"), object_pairs_hook=_unique)


def _build(b: DocBuilder, how: str, events: list[tuple[int, int, bytes, int]]) -> list[bytes]:
    out: list[bytes] = []
    saved = b.splice
    if how == "c":
        b.splice = SPLICE if saved is not None else None
    elif how == "python":
        b.splice = None
    try:
        n = b.build_reserialised("0123456789ab", PATH, events, NOW, out) if how == "full" \
            else b.build("0123456789ab", PATH, events, NOW, out)
    finally:
        b.splice = saved
    assert n == sum(map(len, out)), (how, n)
    return out


def TestOneInput(data: bytes) -> None:
    if len(data) < 2:
        return
    b = BUILDERS[data[0] % len(BUILDERS)]
    ctl = data[1]
    lines = data[2:].split(SEP)[:16]
    base = OFFSETS[(ctl >> 4) & 3]
    events = [(base + i * 1000, base + i * 1000 + len(ln) + 1, ln, FLAG_TRUNCATED if ctl >> (i & 3) & 1 and i < 4 else 0)
              for i, ln in enumerate(lines)]
    c, py, full = _build(b, "c", events), _build(b, "python", events), _build(b, "full", events)
    assert len(c) == len(py) == len(full), (len(c), len(py), len(full))
    for pc, pp, pf in zip(c, py, full, strict=True):
        for p in (pc, pp, pf):
            assert p.endswith(b"\n") and p.count(b"\n") == 2, p
        ac, dc, _ = pc.split(b"\n")
        ap, dp, _ = pp.split(b"\n")
        af, df, _ = pf.split(b"\n")
        assert ac == ap == af, (ac, ap, af)
        oc, sc = _parse(dc)
        op, sp = _parse(dp)
        of, sf = _parse(df)
        assert oc == op == of, (dc, dp, df)
        assert sc == sp == sf, (dc, dp, df)
        orjson.loads(ac)


def main() -> None:
    atheris.Setup(sys.argv, TestOneInput)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
