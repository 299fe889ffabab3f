"""shipper/sdnotify.py next to the sdnotify package (docs/development.md's verdict).

    .venv/bin/pip install sdnotify && .venv/bin/python bench/sdnotify_cmp.py

The cost of one WATCHDOG=1 to a receiver that reads, and what each does when the receiver's
queue is full (net.unix.max_dgram_qlen datagrams) and when a STATUS text is not Latin-1.
"""

from __future__ import annotations

import os
import socket
import tempfile
import time
from collections.abc import Callable

import sdnotify

from shipper.sdnotify import Notifier


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "notify")
        rx = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        rx.bind(path)
        os.environ["NOTIFY_SOCKET"] = path
        mine, theirs = Notifier(), sdnotify.SystemdNotifier()
        calls: tuple[tuple[str, Callable[[], object]], ...] = (
            ("shipper.sdnotify", lambda: mine.notify("WATCHDOG=1")),
            ("sdnotify 0.3.2", lambda: theirs.notify("WATCHDOG=1")))
        for name, fn in calls:
            best = float("inf")
            for _ in range(5):
                t0 = time.perf_counter_ns()
                for _ in range(100):
                    fn()
                    rx.recv(64)
                best = min(best, (time.perf_counter_ns() - t0) / 100)
            print(f"{name:18s} {best:6.0f} ns per WATCHDOG=1 (send and the receiver's recv)")

        full = os.path.join(tmp, "full")
        rx2 = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        rx2.bind(full)                      # never read
        os.environ["NOTIFY_SOCKET"] = full
        mine2, theirs2 = Notifier(), sdnotify.SystemdNotifier()
        sent = 0
        while mine2.notify("WATCHDOG=1"):
            sent += 1
        print(f"shipper.sdnotify: the receiver's queue was full after {sent} datagrams; the next call returned "
              f"{mine2.notify('WATCHDOG=1')} at once")
        theirs2.socket.settimeout(2.0)      # its socket is blocking: without a timeout this call never returns
        started = time.monotonic()
        theirs2.notify("WATCHDOG=1")
        print(f"sdnotify: the same call blocked its caller {time.monotonic() - started:.1f} s (our 2 s timeout; by default forever)")
        os.environ["NOTIFY_SOCKET"] = path
        fresh = sdnotify.SystemdNotifier()
        fresh.notify("STATUS=caught up \u2013 3 files")
        rx.setblocking(False)
        try:
            got: bytes | None = rx.recv(64)
        except BlockingIOError:
            got = None
        print(f"sdnotify: a STATUS with a non-Latin-1 character arrived as {got!r} (dropped silently)")


if __name__ == "__main__":
    main()
