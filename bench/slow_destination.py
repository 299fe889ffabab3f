"""A slow destination at a fixed rate: does shipper keep up, and what does the queue do?

sink.py answers every bulk request after `--sink-latency-ms` (default 2 s); a writer appends pino
lines at `--rate` for `--duration` s; shipper runs with its defaults (flush_interval 1s,
max_in_flight 4, bulk_max_events 2000, gzip). Every `--sample-ms` the harness reads shipper's
/metrics: the events read and not yet acknowledged (shipper_queue_events + shipper_memory_events).
Printed per tree: the peak and the value when the writer stopped, delivered events/s while
writing, documents per request, how long the rest took after the writer stopped, and shipper's
CPU. `--tree NAME=DIR` (repeatable) runs the shipper package found in DIR (a checkout of another
commit, with its `_native` built or copied in), so a change is measured beside its parent in one
sitting; the default is this checkout alone.

    python bench/slow_destination.py [--rate 300] [--duration 40] [--sink-latency-ms 2000]
                                     [--tree before=/tmp/before --tree after=.] [--spool when_behind]
                                     [--flush-interval 1s] [--drain-timeout 60]
    python bench/slow_destination.py --join-cost     # the CPU of joining gzip bodies, per request
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, BENCH_DIR)

from gen import DEFAULT_SEED, PinoGenerator  # noqa: E402
from run import TreeSampler, machine_info, machine_line, shipper_config, stop_system  # noqa: E402
from sink import SinkProcess  # noqa: E402


@dataclass
class Result:
    tree: str
    written: int = 0
    delivered_while_writing: int = 0
    write_s: float = 0.0
    peak_outstanding: float = 0.0
    outstanding_at_stop: float = 0.0
    drain_s: float | None = None         # None: not everything arrived within --drain-timeout
    requests: int = 0
    docs: int = 0
    cpu_s: float = 0.0


def _free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _outstanding(metrics_url: str) -> float | None:
    """shipper_queue_events + shipper_memory_events from /metrics (None while it does not answer)."""
    try:
        with urllib.request.urlopen(metrics_url, timeout=5) as resp:
            text = resp.read().decode()
    except OSError:
        return None
    total = 0.0
    for line in text.splitlines():
        if line.startswith(("shipper_queue_events ", "shipper_memory_events ")):
            total += float(line.split()[1])
    return total


class Writer(threading.Thread):
    """Appends pino lines to `path` at `rate` lines/s, a write every 10 ms, for `duration` s."""

    def __init__(self, path: str, rate: float, duration: float, line_bytes: int) -> None:
        super().__init__(name="writer", daemon=True)
        self.path, self.rate, self.duration = path, rate, duration
        self.gen = PinoGenerator(DEFAULT_SEED, line_bytes)
        self.written = 0

    def run(self) -> None:
        total = int(self.rate * self.duration)
        t0 = time.monotonic()
        with open(self.path, "a", buffering=1) as f:
            while self.written < total:
                due = min(total, int((time.monotonic() - t0) * self.rate) + 1)
                if due > self.written:
                    f.write("".join(line + "\n" for line in self.gen.batch(due - self.written)))
                    f.flush()
                    self.written = due
                time.sleep(0.01)


def run_tree(name: str, tree: str, args: argparse.Namespace) -> Result:
    res = Result(name)
    tmp = tempfile.mkdtemp(prefix=f"slowdest-{name}-", dir=args.tmp_dir)
    sink = SinkProcess(latency_ms=args.sink_latency_ms, python=args.python)
    proc: subprocess.Popen[bytes] | None = None
    try:
        log_path = os.path.join(tmp, "app.log")
        open(log_path, "w").close()
        port = _free_port()
        cfg = shipper_config(tmp, log_path, sink.url, spool=args.spool, flush_interval=args.flush_interval,
                             metrics_listen=f"127.0.0.1:{port}")
        env = dict(os.environ, PYTHONPATH=os.path.abspath(tree))
        with open(os.path.join(tmp, "shipper.err"), "wb") as err:
            proc = subprocess.Popen([args.python, "-m", "shipper", "run", "-c", cfg], cwd=tmp, env=env,
                                    stdout=subprocess.DEVNULL, stderr=err, start_new_session=True)
        metrics_url = f"http://127.0.0.1:{port}/metrics"
        deadline = time.monotonic() + 30
        while _outstanding(metrics_url) is None:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{name}: shipper did not start (see {tmp}/shipper.err)")
            time.sleep(0.1)
        sampler = TreeSampler(proc.pid, interval_s=0.5)
        sampler.start()
        writer = Writer(log_path, args.rate, args.duration, args.line_bytes)
        t0 = time.monotonic()
        writer.start()
        while writer.is_alive():
            v = _outstanding(metrics_url)
            if v is not None:
                res.peak_outstanding = max(res.peak_outstanding, v)
            time.sleep(args.sample_ms / 1000)
        res.write_s = time.monotonic() - t0
        res.written = writer.written
        res.delivered_while_writing = int(sink.stats()["docs"])
        res.outstanding_at_stop = _outstanding(metrics_url) or 0.0
        t1 = time.monotonic()
        while time.monotonic() - t1 < args.drain_timeout:
            v = _outstanding(metrics_url)
            if v is not None:
                res.peak_outstanding = max(res.peak_outstanding, v)
            if int(sink.stats()["docs"]) >= res.written:
                res.drain_s = time.monotonic() - t1
                break
            time.sleep(args.sample_ms / 1000)
        sampler.stop()
        res.cpu_s = sampler.cpu_s
        stats = sink.stats()
        res.requests, res.docs = int(stats["requests"]), int(stats["docs"])
    finally:
        if proc is not None:
            stop_system(proc.pid, proc.pid, 20.0)
        sink.stop()
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)
    return res


def join_cost(line_bytes: int, rounds: int = 30) -> None:
    """The CPU a joined request costs (codec.join_bodies: each stored gzip body decompressed, all
    compressed as one member) beside what compressing those bodies cost when they were made: for
    4, 8 and 16 batches of 250 lines (a 1 s draft at 250 lines/s), thread CPU per request."""
    sys.path.insert(0, os.path.dirname(BENCH_DIR))
    from shipper.codec import gzip_compress, join_bodies
    gen = PinoGenerator(DEFAULT_SEED, line_bytes)
    print(f"{'batches':>7} {'raw KiB':>8} {'join ms':>8} {'made ms':>8} {'join us/KiB':>11}")
    for k in (4, 8, 16):
        raws = ["".join(f'{{"create":{{"_index":"bench","_id":"x"}}}}\n{line}\n' for line in gen.batch(250)).encode()
                for _ in range(k)]
        stored = [gzip_compress(r) for r in raws]
        t0 = time.thread_time()
        for _ in range(rounds):
            join_bodies(stored, True)
        join_s = (time.thread_time() - t0) / rounds
        t0 = time.thread_time()
        for _ in range(rounds):
            for r in raws:
                gzip_compress(r)
        made_s = (time.thread_time() - t0) / rounds
        kib = sum(map(len, raws)) / 1024
        print(f"{k:>7} {kib:>8.0f} {join_s * 1e3:>8.2f} {made_s * 1e3:>8.2f} {join_s * 1e6 / kib:>11.1f}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rate", type=float, default=300.0, help="lines per second (default 300)")
    ap.add_argument("--duration", type=float, default=40.0, help="seconds of writing (default 40)")
    ap.add_argument("--sink-latency-ms", type=float, default=2000.0, help="the sink's delay before each answer")
    ap.add_argument("--tree", action="append", default=None, metavar="NAME=DIR",
                    help="a checkout whose shipper package runs (repeatable; default: this one)")
    ap.add_argument("--spool", choices=("when_behind", "always"), default=None)
    ap.add_argument("--flush-interval", default=None, help="shipper: flush_interval (default: shipper's, 1s)")
    ap.add_argument("--line-bytes", type=int, default=350)
    ap.add_argument("--sample-ms", type=float, default=250.0)
    ap.add_argument("--drain-timeout", type=float, default=60.0)
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--tmp-dir", default=None)
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--json", default=None, help="also write the results here")
    ap.add_argument("--join-cost", action="store_true", help="only the CPU of joining gzip bodies (no daemon)")
    args = ap.parse_args(argv)
    if os.sep in args.python:         # shipper runs in its own directory: a relative path would not hold
        args.python = os.path.abspath(args.python)
    if args.join_cost:
        print(machine_line(machine_info()))
        join_cost(args.line_bytes)
        return 0
    trees = [t.split("=", 1) for t in (args.tree or [f"this={os.path.dirname(BENCH_DIR)}"])]
    print(machine_line(machine_info()))
    print(f"# {args.rate:.0f} lines/s for {args.duration:.0f} s, the sink answers after {args.sink_latency_ms:.0f} ms; "
          f"spool {args.spool or 'default'}, flush_interval {args.flush_interval or 'default'}")
    results = [run_tree(name, tree, args) for name, tree in trees]
    print(f"{'tree':<10} {'written':>8} {'ev/s writing':>12} {'peak queue':>10} {'queue@stop':>10} "
          f"{'drain s':>8} {'requests':>8} {'docs/req':>8} {'cpu s':>6}")
    for r in results:
        drain = f"{r.drain_s:.1f}" if r.drain_s is not None else f">{args.drain_timeout:.0f}"
        print(f"{r.tree:<10} {r.written:>8} {r.delivered_while_writing / max(r.write_s, 1e-9):>12.0f} "
              f"{r.peak_outstanding:>10.0f} {r.outstanding_at_stop:>10.0f} {drain:>8} {r.requests:>8} "
              f"{r.docs / max(1, r.requests):>8.0f} {r.cpu_s:>6.2f}")
    print(f"# uptime: {open('/proc/loadavg').read().strip()}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump([r.__dict__ for r in results], f, indent=1)
    return 0 if all(r.drain_s is not None for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
