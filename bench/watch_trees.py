"""What a tree another user makes under a `**` glob costs the inotify watcher (issue 42).

Two trees, each made while a real watcher (`shipper.tail.watch.make_watcher`, on a running event
loop) watches `base/**/*.log`:

1. deep: `--deep` levels made one below the other in the watched directory (`mkdir -p`);
2. wide: `--wide` sibling directories made aside and moved in at once (one event).

For each: the inotify watches the process holds after the rescan's `watch()` (the kernel's count,
/proc/self/fdinfo), the longest the event loop went without running a 5 ms ticker from the
tree's making until that `watch()` returned (what every file's shipping waited), and the
`watch()` call's own seconds (the walk, in a worker thread). To measure another tree of shipper,
put it first on `PYTHONPATH`.

    .venv/bin/python bench/watch_trees.py [--deep 300] [--wide 50000]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import sys
import tempfile
import time

from shipper.config import InputConfig
from shipper.tail import watch

TICK_S = 0.005


def kernel_watches() -> int:
    """The inotify watches this process holds (all its inotify fds)."""
    n = 0
    for fd in os.listdir("/proc/self/fdinfo"):
        try:
            with open(f"/proc/self/fdinfo/{fd}") as f:
                n += sum(1 for line in f if line.startswith("inotify wd:"))
        except OSError:
            pass
    return n


def _siblings(d: str, n: int) -> None:
    os.mkdir(d)
    for i in range(n):
        os.mkdir(os.path.join(d, f"d{i}"))


async def one(kind: str, n: int) -> tuple[int, float, float]:
    """(watches, the loop's longest stall in s, the watch() call in s) for one tree."""
    root = tempfile.mkdtemp(prefix="shipper-bench-watch-")
    try:
        base = os.path.join(root, "logs")
        os.mkdir(base)
        w = watch.make_watcher(asyncio.get_running_loop(), asyncio.Event())
        inputs = [InputConfig(paths=(os.path.join(base, "**", "*.log"),))]
        await asyncio.to_thread(w.watch, inputs)
        stall = 0.0
        stop = asyncio.Event()

        async def ticker() -> None:
            nonlocal stall
            while not stop.is_set():
                t = time.monotonic()
                await asyncio.sleep(TICK_S)
                stall = max(stall, time.monotonic() - t - TICK_S)

        tick = asyncio.create_task(ticker())
        await asyncio.sleep(0.05)
        if kind == "deep":
            # made in place, a level at a time (in a thread: the loop stays free to read events)
            await asyncio.to_thread(os.makedirs, os.path.join(base, *["l"] * n))
        else:
            aside = os.path.join(root, "t")
            await asyncio.to_thread(_siblings, aside, n)
            os.rename(aside, os.path.join(base, "t"))
        deadline = time.monotonic() + 60
        while not w.scan_wanted and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        w.poll()
        t0 = time.monotonic()
        await asyncio.to_thread(w.watch, inputs)          # the rescan's
        walk_s = time.monotonic() - t0
        stop.set()
        await tick
        held = kernel_watches()
        await asyncio.to_thread(w.stop)
        return held, stall, walk_s
    finally:
        await asyncio.to_thread(shutil.rmtree, root, True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--deep", type=int, default=300)
    ap.add_argument("--wide", type=int, default=50_000)
    args = ap.parse_args()
    print(f"# {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}  shipper from {os.path.dirname(watch.__file__)}"
          f"  loadavg={' '.join(f'{x:.2f}' for x in os.getloadavg())}  python {sys.version.split()[0]}")
    print("| tree | watches held | longest loop stall s | rescan's watch() s |")
    print("|---|---|---|---|")
    for kind, n in (("deep", args.deep), ("wide", args.wide)):
        held, stall, walk_s = asyncio.run(one(kind, n))
        print(f"| {kind} {n:,} | {held:,} | {stall:.3f} | {walk_s:.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
