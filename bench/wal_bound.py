"""What bounding the WAL costs: the daemon's spool (AsyncSpool, headroom on) spooling without pause,
with the WAL checkpointed and truncated past WAL_MAX_BYTES (shipper/spool/database.py) or, as
before, only by the checkpointer thread's passive checkpoints (the bound set out of reach).

Each run commits `--batches` batches of `--kib` KiB of incompressible body and acks each one at
once (a queue that drains as fast as it fills: a destination back after an outage), on a fresh
state dir. Printed per mode, the median of `--runs` interleaved runs: wall seconds, the process's
CPU seconds, MB/s spooled, and the WAL's peak size (looked at after every commit), with the load
average (the machine is shared).

    .venv/bin/python bench/wal_bound.py
    .venv/bin/python bench/wal_bound.py --batches 400 --kib 256 --runs 5
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from shipper.model import Checkpoint  # noqa: E402
from shipper.spool import AsyncSpool, database  # noqa: E402

BOUNDED = database.WAL_MAX_BYTES


async def one_run(batches: int, kib: int, bound: int) -> tuple[float, float, float]:
    """(wall s, CPU s, peak WAL bytes) of one run."""
    database.WAL_MAX_BYTES = bound
    with tempfile.TemporaryDirectory() as tmp:
        a = await AsyncSpool.open(tmp, queue_max_bytes=1 << 30)
        wal = Path(tmp) / "spool" / "cache.db-wal"
        blob = os.urandom(kib * 512).hex().encode()
        body = b'{"create":{}}\n{"b":"%s"}\n' % blob
        peak = 0
        t0, c0 = time.monotonic(), time.process_time()
        try:
            for i in range(batches):
                cp = Checkpoint("a", "/var/log/a.log", 1, 100, 16, "fp", i + 1)
                [(m, _)] = await a.commit([(body, 1)], {"a": (i, i + 1)}, [cp], False)
                await a.ack(m.seq)
                try:
                    peak = max(peak, wal.stat().st_size)
                except FileNotFoundError:
                    pass
            await a.flush()
        finally:
            await a.close()
        return time.monotonic() - t0, time.process_time() - c0, float(peak)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batches", type=int, default=200)
    ap.add_argument("--kib", type=int, default=192, help="body size of a batch (incompressible)")
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    modes = {"passive only (before)": 1 << 60, f"bounded at {BOUNDED >> 20} MiB (after)": BOUNDED}
    got: dict[str, list[tuple[float, float, float]]] = {m: [] for m in modes}
    for _ in range(args.runs):
        for name, bound in modes.items():
            got[name].append(asyncio.run(one_run(args.batches, args.kib, bound)))
    mb = args.batches * args.kib * 1024 / 1e6
    print(f"# {args.batches} batches of {args.kib} KiB ({mb:.0f} MB), committed and acked; median of {args.runs}; "
          f"load average {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} {os.getloadavg()[2]:.2f}")
    print("| mode | wall s | CPU s | MB/s | WAL peak MB |")
    print("| --- | --- | --- | --- | --- |")
    for name, rows in got.items():
        wall = statistics.median(r[0] for r in rows)
        cpu = statistics.median(r[1] for r in rows)
        peak = statistics.median(r[2] for r in rows)
        print(f"| {name} | {wall:.2f} | {cpu:.2f} | {mb / wall:.1f} | {peak / 1e6:.1f} |")


if __name__ == "__main__":
    main()
