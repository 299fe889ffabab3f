"""The hand-written inotify reader next to inotify_simple (docs/development.md's verdict).

    .venv/bin/pip install inotify-simple && .venv/bin/python bench/inotify_cmp.py

Parse cost of one read of inotify events: shipper's loop (struct.unpack_from over the buffer, as
tail/watch.InotifyWatcher._on_readable does it) against inotify_simple.parse_events (a namedtuple per
event), on the same bytes read from a real inotify fd.
"""

from __future__ import annotations

import os
import select
import tempfile
import time
from collections.abc import Callable

import inotify_simple

from shipper.tail import inotify as d


def ours(data: bytes) -> list[str]:
    out = []
    pos, n = 0, len(data)
    while pos + d.EVENT_HEAD <= n:
        _wd, mask, _cookie, length = d.EVENT.unpack_from(data, pos)
        name = data[pos + d.EVENT_HEAD:pos + d.EVENT_HEAD + length].rstrip(b"\0")
        pos += d.EVENT_HEAD + length
        if mask & (d.IN_MODIFY | d.IN_ATTRIB) and name:
            out.append(os.fsdecode(name))
    return out


def theirs(data: bytes) -> list[str]:
    wanted = inotify_simple.flags.MODIFY | inotify_simple.flags.ATTRIB
    return [ev.name for ev in inotify_simple.parse_events(data) if ev.mask & wanted and ev.name]


def per_call_ns(fn: Callable[[bytes], list[str]], data: bytes, n: int) -> float:
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter_ns()
        for _ in range(n):
            fn(data)
        best = min(best, (time.perf_counter_ns() - t0) / n)
    return best


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        fd = d.init()
        d.add_watch(fd, tmp)
        files = [open(os.path.join(tmp, f"f{i}.log"), "ab", buffering=0) for i in range(50)]
        for _ in range(3):
            for f in files:
                f.write(b"x\n")
        select.select([fd], [], [], 1)
        data = os.read(fd, 65536)
        os.close(fd)
        for f in files:
            f.close()
    assert ours(data) == theirs(data)
    count = len(inotify_simple.parse_events(data))
    one = data[:d.EVENT_HEAD + d.EVENT.unpack_from(data, 0)[3]]
    for name, fn in (("shipper loop", ours), ("inotify_simple.parse_events", theirs)):
        many = per_call_ns(fn, data, 2000)
        print(f"{name:28s} {many / 1000:6.1f} us per read of {count} events ({many / count:4.0f} ns/event), "
              f"{per_call_ns(fn, one, 100_000):5.0f} ns per read of 1 event")


if __name__ == "__main__":
    main()
