"""Many files: what `shipper run` costs when it tails N files under nested directories.

Drives the real daemon (a `shipper run` child, as run.py does) against bench/sink.py --verify,
so every figure is one a user with N log files would see:

1. catch-up: N files of L lines each, written before the start; seconds (from the spawn) until
   every line was acknowledged, files/s, CPU-s, peak RSS;
2. idle with N files tracked: CPU % of a core, wake-ups/s, RSS and log files held open over
   `--idle` seconds with nothing written (the rescans every `scan_interval` included);
3. one busy file among them: `--steady-rate` lines/s in 1-line writes (pino's default
   destination) to one file for `--steady` seconds while the others stay idle; CPU-s and % of a
   core of that phase, wake-ups/s (what N idle files add to the cost of one busy one);
4. appends: one line appended to each of `--appends` files picked across the set (most of them
   parked once more than `max_open_files` are tracked), one after the other; ms from the write
   until the sink has it;
5. late files: `--late` files created in a new nested directory; seconds until all arrived;
6. stop: SIGTERM, exit code, and the sink's check: every line once, no `_id` twice.

    .venv/bin/python bench/discovery.py [--files 10000] [--lines 1] [--max-open 1024]
                                        [--idle 30] [--steady 10] [--steady-rate 1000]
                                        [--appends 20] [--late 100] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any

import yaml

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, BENCH_DIR)

from latency import TARGET_IDLE_PERCENT, wakeups  # noqa: E402
from run import (  # noqa: E402
    CLK_TCK,
    TreeSampler,
    _has_exited,
    _stat_times,
    _status_kb,
    _tail,
    compile_bytecode,
    machine_info,
    machine_line,
    shipper_config,
    stop_system,
)
from sink import SinkProcess  # noqa: E402


def make_files(root: str, names: list[str], first_seq: int, lines: int) -> int:
    """Write `lines` lines into each file of `names` (under `root`); returns the next seq.

    Each line carries a unique `seq`, which the sink's --verify counts."""
    seq = first_seq
    for name in names:
        path = os.path.join(root, name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            for _ in range(lines):
                f.write(line(seq))
                seq += 1
    return seq


def line(seq: int) -> bytes:
    return (b'{"level":30,"time":%d,"pid":4411,"hostname":"api-03","msg":"request completed","seq":%d}\n'
            % (int(time.time() * 1000), seq))


def file_names(n: int, prefix: str = "") -> list[str]:
    """N names spread like a host's services: 50 services x 10 hosts x 4 days, then the files."""
    return [os.path.join(prefix, f"svc{i % 50:02d}", f"host{i % 10}", f"day{i % 4}", f"app{i:05d}.log")
            for i in range(n)]


def open_log_fds(pid: int, root: str) -> int:
    """How many of `pid`'s file descriptors are files under `root`."""
    count = 0
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return -1
    for fd in fds:
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}").startswith(root + os.sep):
                count += 1
        except OSError:
            continue
    return count


def write_steadily(path: str, seq: int, rate: float, seconds: float) -> int:
    """`rate` lines/s appended to `path` for `seconds`, one write per line, on a fixed schedule
    (late writes catch up, never drift); returns the next seq."""
    n = int(rate * seconds)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        t0 = time.monotonic()
        for i in range(n):
            due = t0 + i / rate
            delay = due - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            os.write(fd, line(seq))
            seq += 1
    finally:
        os.close(fd)
    return seq


def cpu_s(pid: int) -> float:
    times = _stat_times(pid)
    return 0.0 if times is None else (times[0] + times[1]) / CLK_TCK


def rss_mb(pid: int) -> float:
    return _status_kb(pid, ("VmRSS",)).get("VmRSS", 0) / 1024


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


class Failed(Exception):
    pass


def wait_for(sink: SinkProcess, docs: int, timeout_s: float, proc: subprocess.Popen[bytes], what: str) -> float:
    """Block until the sink holds `docs` docs; the monotonic time they were there. Raises Failed."""
    deadline = time.monotonic() + timeout_s
    while True:
        stats = sink.wait_docs(docs, 0.5)
        if stats["docs"] >= docs:
            return time.monotonic()
        if _has_exited(proc.pid):
            raise Failed(f"{what}: shipper exited with {stats['docs']} of {docs} docs received")
        if time.monotonic() > deadline:
            raise Failed(f"{what}: {stats['docs']} of {docs} docs after {timeout_s:.0f} s")


def run(args: argparse.Namespace) -> dict[str, Any]:
    tmp = tempfile.mkdtemp(prefix="bench-discovery-", dir=args.tmp_dir)
    root = os.path.join(tmp, "logs")
    result: dict[str, Any] = {"files": args.files, "lines_per_file": args.lines, "max_open_files": args.max_open,
                              "tmp": tmp}
    t = time.monotonic()
    seq = make_files(root, file_names(args.files), 0, args.lines)
    result["create_s"] = time.monotonic() - t
    print(f"  created {args.files:,} files of {args.lines} line(s) in {result['create_s']:.1f} s", flush=True)

    cfg_path = shipper_config(tmp, os.path.join(root, "**", "*.log"), "http://127.0.0.1:9", log_level="info")
    with open(cfg_path) as f:
        cfg = yaml.safe_load(f)
    cfg["max_open_files"] = args.max_open
    sink = SinkProcess(verify=True, python=args.python)
    cfg["output"]["elasticsearch"]["hosts"] = [sink.url]
    with open(cfg_path, "w") as f:
        yaml.safe_dump(cfg, f, sort_keys=False)

    err_path = os.path.join(tmp, "stderr.log")
    ok = False
    with open(err_path, "wb") as err:
        t0 = time.monotonic()
        proc = subprocess.Popen([args.python, "-m", "shipper", "run", "-c", cfg_path], stdout=subprocess.DEVNULL,
                                stderr=err, stdin=subprocess.DEVNULL, cwd=tmp, start_new_session=True)
    sampler = TreeSampler(proc.pid, 0.05)
    sampler.start()
    try:
        # 1. catch-up
        t1 = wait_for(sink, seq, args.timeout, proc, "catch-up")
        result["catchup_s"] = t1 - t0
        result["catchup_cpu_s"] = sampler.sample().cpu_s
        result["catchup_files_s"] = args.files / result["catchup_s"]
        result["catchup_peak_rss_mb"] = sampler.peak_rss_kb / 1024
        print(f"  catch-up: {seq:,} lines from {args.files:,} files in {result['catchup_s']:.2f} s "
              f"({result['catchup_files_s']:,.0f} files/s), CPU {result['catchup_cpu_s']:.2f} s, "
              f"peak RSS {result['catchup_peak_rss_mb']:.1f} MB", flush=True)

        # 2. idle with N tracked
        time.sleep(args.settle)
        c0, w0, i0 = cpu_s(proc.pid), wakeups(proc.pid), time.monotonic()
        time.sleep(args.idle)
        c1, w1, i1 = cpu_s(proc.pid), wakeups(proc.pid), time.monotonic()
        result["idle_s"] = i1 - i0
        result["idle_cpu_s"] = c1 - c0
        result["idle_cpu_percent"] = 100.0 * (c1 - c0) / (i1 - i0)
        result["idle_wakeups_s"] = (w1 - w0) / (i1 - i0)
        result["idle_rss_mb"] = rss_mb(proc.pid)
        result["open_log_fds"] = open_log_fds(proc.pid, root)
        print(f"  idle {result['idle_s']:.0f} s with {args.files:,} files tracked: CPU {result['idle_cpu_s']:.2f} s "
              f"= {result['idle_cpu_percent']:.2f}% of a core, {result['idle_wakeups_s']:.1f} wake-ups/s, "
              f"RSS {result['idle_rss_mb']:.1f} MB, {result['open_log_fds']} log files open", flush=True)

        # 3. one busy file among N idle ones
        names = file_names(args.files)
        if args.steady > 0:
            busy = os.path.join(root, names[0])
            c0, w0, s0 = cpu_s(proc.pid), wakeups(proc.pid), time.monotonic()
            seq0 = seq
            seq = write_steadily(busy, seq, args.steady_rate, args.steady)
            wait_for(sink, seq, args.timeout, proc, "one busy file")
            c1, w1, s1 = cpu_s(proc.pid), wakeups(proc.pid), time.monotonic()
            result["steady_s"] = s1 - s0
            result["steady_lines"] = seq - seq0
            result["steady_cpu_s"] = c1 - c0
            result["steady_cpu_percent"] = 100.0 * (c1 - c0) / (s1 - s0)
            result["steady_wakeups_s"] = (w1 - w0) / (s1 - s0)
            print(f"  one busy file: {seq - seq0:,} lines at {args.steady_rate:,.0f}/s in 1-line writes among "
                  f"{args.files:,} files: CPU {result['steady_cpu_s']:.2f} s = {result['steady_cpu_percent']:.2f}% "
                  f"of a core over {result['steady_s']:.1f} s, {result['steady_wakeups_s']:.0f} wake-ups/s", flush=True)

        # 4. appends to files across the set, one after the other
        rng = random.Random(args.seed)
        picks = rng.sample(range(args.files), min(args.appends, args.files))
        delays_ms: list[float] = []
        for i in picks:
            with open(os.path.join(root, names[i]), "ab") as f:
                ta = time.monotonic()
                f.write(line(seq))
            seq += 1
            delays_ms.append((wait_for(sink, seq, args.timeout, proc, "append") - ta) * 1000)
        result["append_ms"] = delays_ms
        result["append_p50_ms"] = percentile(delays_ms, 0.5)
        result["append_max_ms"] = max(delays_ms, default=float("nan"))
        print(f"  {len(delays_ms)} appends to files across the set: write to acknowledged p50 "
              f"{result['append_p50_ms']:.0f} ms, max {result['append_max_ms']:.0f} ms", flush=True)

        # 5. late files in a new nested directory
        tl = time.monotonic()
        seq = make_files(root, file_names(args.late, prefix=os.path.join("late", "deep")), seq, args.lines)
        result["late_s"] = wait_for(sink, seq, args.timeout, proc, "late files") - tl
        print(f"  {args.late} files in a new nested directory: all acknowledged {result['late_s']:.2f} s after "
              f"the first was created", flush=True)
        ok = True
    except Failed as e:
        result["error"] = str(e)
        print(f"!! {e}", flush=True)
    finally:
        # 6. stop
        ts = time.monotonic()
        reaped, killed = stop_system(proc.pid, proc.pid, args.stop_timeout)
        sampler.stop()
        result["stop_s"] = time.monotonic() - ts
        result["exit_code"] = None if reaped is None else reaped[0]
        result["killed"] = killed
        result["peak_rss_mb"] = sampler.peak_rss_kb / 1024
        result["cpu_s"] = sampler.cpu_s
        final = sink.stop() or {}
    verify = final.get("verify", {})
    result["sink"] = {k: final.get(k) for k in ("docs", "requests")} | {"verify": verify}
    lost = seq - int(verify.get("distinct_seqs", 0))
    dup = int(verify.get("duplicate_ids", 0)) + int(verify.get("duplicate_seqs", 0))
    result["expected"] = seq
    result["lost"], result["duplicates"] = lost, dup
    result["ok"] = ok = ok and lost == 0 and dup == 0 and result["exit_code"] == 0 and not killed
    print(f"  stop: exit code {result['exit_code']} in {result['stop_s']:.2f} s{' (killed)' if killed else ''}; "
          f"sink: {verify.get('distinct_seqs', 0):,} of {seq:,} lines, {lost} lost, {dup} duplicated, "
          f"{final.get('requests', 0):,} requests", flush=True)
    if not ok:
        tail = _tail(err_path)
        if tail:
            print(f"!! stderr tail ({err_path}):\n{tail}", flush=True)
    elif not args.keep:
        shutil.rmtree(tmp, ignore_errors=True)
        result.pop("tmp")
    return result


def print_summary(r: dict[str, Any]) -> None:
    if "idle_cpu_percent" not in r:
        return
    print()
    print("| files | catch-up s | files/s | CPU-s | peak RSS MB | idle % of a core | wake-ups/s | open | "
          "one busy file: CPU-s, % of a core | append p50 / max ms | late s |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    busy = (f"{r['steady_cpu_s']:.2f}, {r['steady_cpu_percent']:.2f}" if "steady_cpu_s" in r else "-")
    print(f"| {r['files']:,} | {r['catchup_s']:.2f} | {r['catchup_files_s']:,.0f} | {r['catchup_cpu_s']:.2f} | "
          f"{r['peak_rss_mb']:.1f} | {r['idle_cpu_percent']:.2f} | {r['idle_wakeups_s']:.1f} | {r['open_log_fds']} | "
          f"{busy} | {r.get('append_p50_ms', float('nan')):.0f} / {r.get('append_max_ms', float('nan')):.0f} | "
          f"{r.get('late_s', float('nan')):.2f} |")
    verdict = "yes" if r["idle_cpu_percent"] < TARGET_IDLE_PERCENT else "NO"
    print(f"\nidle under {TARGET_IDLE_PERCENT}% of a core with {r['files']:,} files tracked (issue 14's idle target, "
          f"met there with one file): {verdict}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--files", type=int, default=10_000)
    ap.add_argument("--lines", type=int, default=1, help="lines per file written before the start")
    ap.add_argument("--max-open", type=int, default=1024, help="shipper's max_open_files")
    ap.add_argument("--idle", type=float, default=30.0, help="seconds of the idle measurement")
    ap.add_argument("--settle", type=float, default=35.0,
                    help="seconds after the catch-up before the idle phase (past the 30 s rate window: idle means idle)")
    ap.add_argument("--steady", type=float, default=10.0, help="seconds of one busy file among the idle ones (0: skip)")
    ap.add_argument("--steady-rate", type=float, default=1000.0, help="its lines/s, one write per line")
    ap.add_argument("--appends", type=int, default=20)
    ap.add_argument("--late", type=int, default=100)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds each phase may take")
    ap.add_argument("--stop-timeout", type=float, default=20.0)
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--tmp-dir", default=None)
    ap.add_argument("--keep", action="store_true", help="keep the files, config and stderr")
    ap.add_argument("--json", default=None, help="also write the figures here")
    args = ap.parse_args(argv)
    if os.sep in args.python:     # shipper runs in its own directory: a relative path would not resolve
        args.python = os.path.abspath(args.python)
    info = machine_info()
    print(machine_line(info), flush=True)
    print(f"# {compile_bytecode(args.python)}", flush=True)
    result = run(args)
    result["machine"] = info
    print_summary(result)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
