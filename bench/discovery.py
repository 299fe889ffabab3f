"""Discovery at scale: files/s found, opened and read on N files under nested directories, the
cost of a steady-state rescan, and the process RSS with N files tracked.

Runs the real reading side of `Pipeline` in-process (real files, a real spool in a temp state dir,
no Elasticsearch: committed records are dropped as if acked). Not a test: it prints figures.

    .venv/bin/python bench/discovery.py --files 10000 --max-open 1024
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from shipper.clock import SystemClock  # noqa: E402
from shipper.config import Config, ElasticsearchConfig, InputConfig  # noqa: E402
from shipper.events import Events  # noqa: E402
from shipper.pipeline import Pipeline  # noqa: E402
from shipper.spool import AsyncSpool  # noqa: E402
from shipper.tail import discovery  # noqa: E402


def rss_mib() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def make_files(root: Path, n: int) -> None:
    for i in range(n):
        d = root / f"svc{i % 50:02d}" / f"host{i % 10}" / f"day{i % 4}"
        d.mkdir(parents=True, exist_ok=True)
        (d / f"app{i:05d}.log").write_bytes(b'{"level":30,"msg":"started","seq":%d}\n' % i)


async def drain(p: Pipeline) -> None:
    """Ack every committed batch at once (no output)."""
    while p.outbox:
        meta, _ = p.outbox.popleft()
        await p.spool.ack(meta.seq)
    p.cached_bytes = 0
    p.queue_events = p.queue_bytes = 0


async def run(n: int, max_open: int) -> None:
    with tempfile.TemporaryDirectory(prefix="shipper-bench-") as tmp:
        root = Path(tmp) / "logs"
        t = time.perf_counter()
        make_files(root, n)
        print(f"created {n} files in {time.perf_counter() - t:.1f}s")
        inp = InputConfig(paths=(str(root / "**" / "*.log"),))
        cfg = Config(state_dir=str(Path(tmp) / "state"), inputs=(inp,), max_open_files=max_open,
                     output=ElasticsearchConfig(hosts=("http://127.0.0.1:9",), compression="none"))

        t = time.perf_counter()
        found = discovery.scan_stat(cfg.inputs)
        dt = time.perf_counter() - t
        print(f"glob + stat: {len(found)} files in {dt * 1000:.0f} ms = {len(found) / dt:,.0f} files/s")

        rss0 = rss_mib()
        spool = await AsyncSpool.open(cfg.state_dir)
        p = Pipeline(cfg, spool, Events(), SystemClock(), host_name="bench")
        t = time.perf_counter()
        await p.rescan()
        rounds = 0
        while True:
            rounds += 1
            await p.open_waiting()
            moved = p.read_round()
            p.check_sources()
            await p.commit()
            await drain(p)
            if not moved and not p.waiting:
                break
        dt = time.perf_counter() - t
        tracked = len(p.cps)
        print(f"discovered, opened, read and checkpointed {tracked} files in {dt:.2f}s = {tracked / dt:,.0f} files/s "
              f"({p.read_total} lines, {rounds} rounds, {len(p.sources)} open, max_open_files {max_open})")

        t = time.perf_counter()
        await p.rescan()
        dt = time.perf_counter() - t
        print(f"steady-state rescan of {n} files: {dt * 1000:.0f} ms")

        rss1 = rss_mib()
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print(f"RSS with {tracked} tracked: {rss1:.1f} MiB (pipeline share {rss1 - rss0:.1f} MiB; peak {peak:.1f} MiB)")
        print(f"open fds on log files: {sum(1 for s in p.sources.values() if s.harvester.fd >= 0)}")
        p.close_files()
        await p.client.close()
        await spool.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--files", type=int, default=10_000)
    ap.add_argument("--max-open", type=int, default=1024)
    args = ap.parse_args()
    os.nice(0)
    asyncio.run(run(args.files, args.max_open))


if __name__ == "__main__":
    main()
