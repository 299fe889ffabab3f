"""What a little work costs right after a thread wakes up: the same call back to back, and after sleeping.

At steady rates (issue 14) shipper does one request cycle per `flush_min_interval` (40 ms): each of
its threads wakes, does a few hundred microseconds of work and sleeps again. This measures what
that work costs when the thread has just slept for GAP ms, against the same call repeated without
a pause, in one process, one call per wake-up, CPU time of the calling thread (time.thread_time:
user + sys, what the harnesses count):

- `nothing`: the two thread_time calls alone;
- `statvfs`: one syscall (the spool's free-space look before each commit);
- `gzip 15 KB`: isal level 1 of a 40-line bulk body (the 1k lines/s scenario's draft);
- `python 2k ops`: a loop of dict and list operations, no syscall (the interpreter itself);
- `spool commit`: `Spool.commit_acking` of that body with the previous batch's ack, on a real
  spool (SQLite WAL, the daemon's settings), as the spool thread does it once per cycle.

    .venv/bin/python bench/cold.py [--gaps 0,1,5,40] [--calls 200]

Figures depend on the machine far more than on shipper (a shared VM whose cores run other
guests between our wake-ups, CPU power states, mitigations on VM entry): compare rows of one run.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, BENCH_DIR)

from gen import PinoGenerator  # noqa: E402
from run import machine_info, machine_line  # noqa: E402


def bulk_body(n: int) -> bytes:
    """A bulk body of n pino documents (350 bytes each), as shipper builds one."""
    lines = [line.encode() + b"\n" for line in PinoGenerator(1, 350).batch(n, time_ms=1_764_000_000_000)]
    return b"".join(b'{"create":{"_id":"0d2cd1b4c54a-%d"}}\n' % (i * 350) + ln for i, ln in enumerate(lines))


def spool_committer(state_dir: str, body: bytes, n: int) -> Callable[[], bytes]:
    """One `Spool.commit_acking` of `body` (n documents) per call on a real spool, carrying the
    previous call's ack (the spool thread's work once per request cycle); returns the stored,
    gzip'd body."""
    from shipper.spool.store import Spool
    spool = Spool(state_dir, headroom=True)
    last: list[int] = []

    def commit() -> bytes:
        out = spool.commit_acking([(body, n)], {"0d2cd1b4c54a": (0, len(body))}, [], True, last)
        last[:] = [out[0][0].seq]
        return out[0][1]
    return commit


def workloads(state_dir: str) -> list[tuple[str, Callable[[], object]]]:
    from shipper.codec import gzip_compress

    body = bulk_body(40)
    commit = spool_committer(state_dir, body, 40)

    def python_ops() -> object:
        d: dict[str, int] = {}
        acc = []
        for i in range(500):
            d[str(i & 31)] = i
            acc.append(d.get("7", 0) + i)
        return acc

    return [
        ("nothing", lambda: None),
        ("statvfs", lambda: os.statvfs(state_dir)),
        ("gzip 15 KB", lambda: gzip_compress(body)),
        ("python 2k ops", python_ops),
        ("spool commit", commit),
    ]


def measure(fn: Callable[[], object], calls: int, gap_s: float) -> float:
    """Median CPU-us of one call, each call after sleeping gap_s (none: back to back)."""
    for _ in range(5):
        fn()
    samples = []
    for _ in range(calls):
        if gap_s:
            time.sleep(gap_s)
        t0 = time.thread_time()
        fn()
        samples.append(time.thread_time() - t0)
    return statistics.median(samples) * 1e6


LONG_GAP_MS = 20     # from here on a cell sleeps so long that it takes a quarter of the calls (at least 20)


def calls_at(gap_ms: float, calls: int) -> int:
    return calls if gap_ms < LONG_GAP_MS else max(20, calls // 4)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="the cost of a call right after a wake-up, against back to back")
    ap.add_argument("--gaps", default="0,1,5,40", help="ms asleep before each call (0: back to back)")
    ap.add_argument("--calls", type=int, default=200,
                    help=f"calls per cell, a quarter of it after {LONG_GAP_MS} ms or more (the median is printed)")
    args = ap.parse_args(argv)
    gaps = [float(g) for g in args.gaps.split(",") if g.strip()]
    info = machine_info()
    print(machine_line(info))
    print(f"# median CPU-us of one call (time.thread_time), {args.calls} calls per cell "
          f"({calls_at(LONG_GAP_MS, args.calls)} after {LONG_GAP_MS} ms or more asleep)")
    with tempfile.TemporaryDirectory(prefix="cold-") as d:
        rows = [(name, [measure(fn, calls_at(g, args.calls), g / 1000) for g in gaps]) for name, fn in workloads(d)]
    warm = gaps.index(0) if 0 in gaps else None     # the back-to-back column the others are compared to
    print("| call | " + " | ".join("back to back" if g == 0 else f"after {g:g} ms asleep" for g in gaps) + " |")
    print("| --- |" + " ---: |" * len(gaps))
    for name, values in rows:
        cells = []
        for i, v in enumerate(values):
            base = values[warm] if warm is not None and i != warm else 0.0
            cells.append(f"{v:,.1f}" + (f" ({v / base:.1f}x)" if base > 0 else ""))
        print(f"| {name} | " + " | ".join(cells) + " |")
    return 0

if __name__ == "__main__":
    sys.exit(main())
