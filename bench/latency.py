"""Latency harness: write-to-acknowledged time at a steady rate (default 10,000 lines/s for 20 s).

A writer appends pino lines to a file in small batches; each line carries `"wt": time.time_ns()`
taken just before its write(2). The system under test (`shipper run`, or the naive tailer as a
baseline) ships the file to sink.py in its own process, which records arrival - wt per doc when
a bulk body has been read in full. Writer and sink read the same host clock.

    python bench/latency.py [--rate 10000] [--duration 20] [--interval-ms 5] [--systems naive,shipper]
                            [--gzip on|off] [--in-flight K] [--bulk-max-events N] [--flush-interval 1s]
                            [--sink-latency-ms MS] [--keep]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from typing import Any

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, BENCH_DIR)

from gen import DEFAULT_SEED, PinoGenerator  # noqa: E402
from peers import PEERS, ensure_peers, peer_command  # noqa: E402
from run import (  # noqa: E402
    OUT_DIR,
    TreeSampler,
    _children,
    _find_target,
    _has_exited,
    _tail,
    compile_bytecode,
    machine_info,
    machine_line,
    print_folded,
    shipper_config,
    stop_system,
)
from sink import SinkProcess  # noqa: E402

TARGET_P99_MS = 50.0
TARGET_IDLE_PERCENT = 0.1
# issue 14's rates: (lines/s, ms between writes, default seconds); 0 lines/s = idle (nothing written)
SCENARIOS: dict[str, tuple[float, float, float]] = {
    "10k": (10_000, 10.0, 30.0),      # 100-line writes
    "1k": (1_000, 1.0, 30.0),         # 1-line writes (pino's default destination)
    "idle": (0, 0.0, 60.0),
}


def _tree_tasks(pid: int) -> Iterator[str]:
    """/proc/P/task/T of every live thread of `pid` and of its children, grandchildren..."""
    stack = [pid]
    while stack:
        p = stack.pop()
        try:
            tids = os.listdir(f"/proc/{p}/task")
        except OSError:
            continue
        for tid in tids:
            yield f"/proc/{p}/task/{tid}"
        stack.extend(_children(p))


def tree_io(pid: int) -> tuple[int, int]:
    """(write_bytes, wchar) of `pid` and its children so far, from /proc/P/io: what the kernel sent
    (or will send) to storage on their behalf, and what they passed to write(2) (pipes and sockets
    too). A process's io counts its threads, those that ended too."""
    wb = wc = 0
    stack = [pid]
    while stack:
        p = stack.pop()
        try:
            with open(f"/proc/{p}/io") as f:
                fields = dict(line.split(": ") for line in f.read().splitlines())
            wb += int(fields["write_bytes"])
            wc += int(fields["wchar"])
        except (OSError, ValueError, KeyError):
            pass
        stack.extend(_children(p))
    return wb, wc


def state_written(listen: str | None) -> float | None:
    """shipper_state_written_bytes_total from a shipper's /metrics (None: not scraped)."""
    if listen is None:
        return None
    import urllib.request
    try:
        with urllib.request.urlopen(f"http://{listen}/metrics", timeout=5) as r:
            for line in r.read().decode().splitlines():
                if line.startswith("shipper_state_written_bytes_total "):
                    return float(line.split()[1])
    except OSError:
        return None
    return None


def _free_listen() -> str:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


def wakeups(pid: int) -> int:
    """Context switches (voluntary + involuntary) of every thread of `pid` and its children so far:
    each voluntary one is a sleep the thread woke from, so over an idle minute it counts wakeups."""
    return sum(sw for _cpu, sw in per_thread(pid).values())


def on_cpu_s(pid: int) -> float:
    """On-CPU seconds of every live thread of `pid` and its children (schedstat, nanoseconds): a
    second measure of the CPU-s column (/proc/PID/stat, in clock ticks), printed beside it so an
    odd idle figure can be told from an accounting artefact. Threads that ended meanwhile are
    missing from it (shipper's and the peers' live for the whole run). On the bench VM the two
    agree within a few ms (2026-12-02)."""
    return sum(cpu for cpu, _sw in per_thread(pid).values())


def write_steadily(path: str, gen: PinoGenerator, rate: float, duration_s: float,
                   interval_s: float) -> dict[str, Any]:
    """Append `rate` lines/s to `path` for `duration_s`, one write(2) every `interval_s`.

    Returns lines written, the achieved rate and the worst lateness of a tick (the writer's own
    lag on a busy machine: a late tick writes the lines it owes, so the rate holds on average).
    """
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    written = 0
    max_late_s = 0.0
    t0 = time.monotonic()
    tick = t0
    try:
        while True:
            now = time.monotonic()
            elapsed = now - t0
            max_late_s = max(max_late_s, now - tick)
            due = int(rate * min(elapsed, duration_s)) - written
            if due > 0:
                lines = gen.batch(due, time_ms=time.time_ns() // 1_000_000)
                wt = time.time_ns()
                head = '{"wt":%d,' % wt
                data = "".join([head + line[1:] + "\n" for line in lines]).encode()
                os.write(fd, data)
                written += due
            if elapsed >= duration_s:
                break
            tick += interval_s
            delay = tick - time.monotonic()
            if delay > 0:
                time.sleep(delay)
    finally:
        os.close(fd)
    actual_s = time.monotonic() - t0
    return {"written": written, "seconds": actual_s, "rate": written / actual_s,
            "max_tick_late_ms": max_late_s * 1000}


def command(system: str, tmp: str, log_path: str, url: str,
            args: argparse.Namespace) -> tuple[list[str], dict[str, str] | None]:
    if system in PEERS:
        return peer_command(system, tmp, log_path, url)
    return _command(system, tmp, log_path, url, args), None


def _command(system: str, tmp: str, log_path: str, url: str, args: argparse.Namespace) -> list[str]:
    py = args.python
    if system == "naive":
        return [py, os.path.join(BENCH_DIR, "naive.py"), log_path, url, "--follow",
                "--poll-ms", f"{args.naive_poll_ms:g}"]
    if system == "sync":          # a measurement, not a shipper: see bench/syncproto.py
        return [py, os.path.join(BENCH_DIR, "syncproto.py"), log_path, url,
                "--interval-ms", f"{args.sync_interval_ms:g}", "--state", os.path.join(tmp, "sync-state")]
    if system in ("shipper", "shipper-always"):
        # shipper-always: `queue.spool: always`, every event queued on disk before it is sent (issue 46)
        cfg = shipper_config(tmp, log_path, url, gzip=args.gzip == "on",
                             bulk_max_events=args.bulk_max_events, in_flight=args.in_flight,
                             log_level=args.log_level, flush_interval=args.flush_interval,
                             flush_min_interval=args.flush_min_interval,
                             spool="always" if system == "shipper-always" else None,
                             metrics_listen=args.current_listen)
        cmd = [py, "-m", "shipper", "run", "-c", cfg]
        if args.cprofile:      # the main thread only (cProfile's way): calls per request cycle
            return [py, "-m", "cProfile", "-o", os.path.join(OUT_DIR, f"latency-{system}-{args.current_scenario}.prof"),
                    "-m", "shipper", "run", "-c", cfg]
        if args.profile:
            pyspy = shutil.which("py-spy", path=os.path.dirname(py) + os.pathsep + os.environ.get("PATH", ""))
            if pyspy is None:
                raise SystemExit("--profile needs py-spy: pip install py-spy (into the venv)")
            return [pyspy, "record", "-o", os.path.join(OUT_DIR, f"latency-{system}-{args.current_scenario}.folded"),
                    "--format", "raw",
                    "--threads", "--function", "--rate", str(args.profile_rate), "--nonblocking", "--subprocesses",
                    *(["--gil"] if args.profile_gil else []), "--", *cmd]
        return cmd
    raise SystemExit(f"unknown system {system!r} (known: naive, shipper, shipper-always, sync, syslog-ng, rsyslog)")


def per_thread(pid: int) -> dict[str, tuple[float, int]]:
    """On-CPU seconds and context switches of each live thread of `pid` and its children, keyed
    "pid/tid" (a process's main thread is "pid/pid"): which thread of a request cycle costs what."""
    out: dict[str, tuple[float, int]] = {}
    for task in _tree_tasks(pid):
        try:
            with open(f"{task}/schedstat") as f:
                ns = int(f.read().split()[0])
            switches = 0
            with open(f"{task}/status") as f:
                for line in f:
                    if "ctxt_switches:" in line:
                        switches += int(line.split()[-1])
        except (OSError, ValueError, IndexError):
            continue
        parts = task.split("/")
        out[f"{parts[2]}/{parts[4]}"] = (ns / 1e9, switches)
    return out


def thread_deltas(before: dict[str, tuple[float, int]],
                  after: dict[str, tuple[float, int]]) -> list[dict[str, Any]]:
    """Per thread over a window, busiest first; threads that started meanwhile count from zero."""
    rows = []
    for key, (cpu, sw) in after.items():
        cpu0, sw0 = before.get(key, (0.0, 0))
        pid, tid = key.split("/")
        rows.append({"thread": "main" if pid == tid else key, "cpu_s": cpu - cpu0, "switches": sw - sw0})
    return sorted(rows, key=lambda r: -r["cpu_s"])


def measure(system: str, sink: SinkProcess, args: argparse.Namespace, scenario: str,
            rate: float, interval_ms: float, duration: float) -> dict[str, Any]:
    args.current_scenario = scenario
    tmp = tempfile.mkdtemp(prefix=f"latency-{system}-", dir=args.tmp_dir)
    log_path = os.path.join(tmp, "app.log")
    open(log_path, "wb").close()
    gen = PinoGenerator(args.seed, args.line_bytes)
    err_path = os.path.join(tmp, "stderr.log")
    sink.reset()
    # a shipper serves /metrics, scraped twice (shipper_state_written_bytes_total)
    args.current_listen = _free_listen() if system.startswith("shipper") else None
    cmd, env = command(system, tmp, log_path, sink.url, args)
    with open(os.path.join(tmp, "stdout.log"), "wb") as out, open(err_path, "wb") as err:
        # cwd: the run's own directory, never the repo (`python -m shipper` would import the
        # repo's shipper/ from there, whatever tree --python's venv has installed)
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, env=env,
                                stdin=subprocess.DEVNULL, cwd=tmp, start_new_session=True)
    wrapped = system.startswith("shipper") and args.profile
    target = _find_target(proc.pid) if wrapped else proc.pid
    result: dict[str, Any] = {"system": system, "scenario": scenario, "ok": False}
    try:
        # warm-up: one line must make it through before the clock starts
        with open(log_path, "ab") as f:
            f.write((gen.batch(1, time_ms=time.time_ns() // 1_000_000)[0] + "\n").encode())
        deadline = time.monotonic() + args.warmup_timeout
        while True:
            stats = sink.wait_docs(1, 0.25)
            if stats["docs"] >= 1:
                break
            if _has_exited(proc.pid) or time.monotonic() > deadline:
                result["error"] = "the warm-up line never arrived"
                return result
        if rate <= 0:
            # idle: let startup work (syslog-ng's first poll, shipper's first checkpoint) settle
            time.sleep(args.idle_settle)
        sink.reset()
        # before the window: the first scrape imports prometheus_client in the daemon (~0.1 CPU-s)
        state0 = state_written(args.current_listen)
        io0, size0 = tree_io(proc.pid), os.path.getsize(log_path)
        sampler = TreeSampler(proc.pid)
        cpu0 = sampler.sample().cpu_s
        wake0 = wakeups(proc.pid)
        on0 = on_cpu_s(proc.pid)
        threads0 = per_thread(proc.pid)
        if rate > 0:
            w = write_steadily(log_path, gen, rate, duration, interval_ms / 1000)
        else:
            t0 = time.monotonic()
            time.sleep(duration)
            w = {"written": 0, "seconds": time.monotonic() - t0, "rate": 0.0, "max_tick_late_ms": 0.0}
        cpu1 = sampler.sample().cpu_s
        wake1 = wakeups(proc.pid)
        result["on_cpu_s"] = on_cpu_s(proc.pid) - on0
        result["threads"] = thread_deltas(threads0, per_thread(proc.pid))
        result.update(w)
        result["cpu_s"] = cpu1 - cpu0
        result["cpu_percent"] = 100 * (cpu1 - cpu0) / w["seconds"]
        result["wakeups_per_s"] = (wake1 - wake0) / w["seconds"]
        stats = sink.wait_docs(w["written"], args.drain_timeout)
        # what reached the disk while these lines were shipped (after the drain: their checkpoints too)
        io1, state1 = tree_io(proc.pid), state_written(args.current_listen)
        result["log_bytes"] = os.path.getsize(log_path) - size0
        result["io_write_bytes"] = io1[0] - io0[0]
        result["io_wchar"] = io1[1] - io0[1]
        if state0 is not None and state1 is not None:
            result["state_written_bytes"] = state1 - state0
        result["received"] = stats["docs"]
        result["requests"] = stats["requests"]
        result["latency_ms"] = stats.get("latency_ms", {})
        result["slowest_requests"] = stats.get("slowest_requests", [])
        result["ok"] = stats["docs"] >= w["written"]
        if not result["ok"]:
            result["error"] = f"{stats['docs']} of {w['written']} docs arrived within {args.drain_timeout:.0f}s"
        return result
    finally:
        reaped, killed = stop_system(proc.pid, target, args.stop_timeout)
        proc.returncode = reaped[0] if reaped else -9  # reaped by wait4: Popen must not wait again
        result["exit_code"] = proc.returncode
        result["killed"] = killed
        if not result["ok"]:
            print(f"!! {system}: {result.get('error')}", flush=True)
            tail = _tail(err_path)
            if tail:
                print(f"!! stderr tail ({err_path}):\n{tail}", flush=True)
        if args.keep or not result["ok"]:
            result["tmp"] = tmp
        else:
            shutil.rmtree(tmp, ignore_errors=True)


def _share(part: float | None, whole: float | None) -> str:
    """`part` as a percentage of `whole` (the log bytes written): the disk a system wrote per byte shipped."""
    return f"{100 * part / whole:.2f}" if part is not None and whole else ""


def print_table(results: list[dict[str, Any]]) -> None:
    head = ["scenario", "system", "written", "received", "rate/s", "p50 ms", "p90 ms", "p99 ms", "p99.9 ms",
            "max ms", "CPU-s", "CPU %", "vs naive", "wakeups/s", "requests", "disk/log %", "state/log %",
            f"p99 < {TARGET_P99_MS:g} ms"]
    table = [head]
    naive_cpu = {r["scenario"]: r["cpu_s"] for r in results if r["system"] == "naive" and "cpu_s" in r}
    for r in results:
        lat = r.get("latency_ms") or {}
        if "written" not in r:
            table.append([r["scenario"], r["system"], "failed"] + [""] * (len(head) - 3))
            continue
        base = naive_cpu.get(r["scenario"])
        if r["written"] == 0:
            verdict = ("yes" if r["cpu_percent"] < TARGET_IDLE_PERCENT else "NO") + " (idle < 0.1%)"
        else:
            verdict = ("yes" if lat.get("p99", 1e9) < TARGET_P99_MS else "NO") if r["ok"] else "incomplete"
        table.append([
            r["scenario"], r["system"], f"{r['written']:,}", f"{r.get('received', 0):,}", f"{r['rate']:,.0f}",
            *(f"{lat[k]:.1f}" if k in lat else "" for k in ("p50", "p90", "p99", "p999", "max")),
            f"{r['cpu_s']:.2f}", f"{r['cpu_percent']:.2f}",
            f"{r['cpu_s'] / base:.2f}x" if base else "",
            f"{r['wakeups_per_s']:.1f}", f"{r.get('requests', 0):,}",
            _share(r.get("io_write_bytes"), r.get("log_bytes")), _share(r.get("state_written_bytes"), r.get("log_bytes")),
            verdict,
        ])
    widths = [max(len(row[i]) for row in table) for i in range(len(head))]
    for i, row in enumerate(table):
        print("| " + " | ".join(c.ljust(w) if j == 0 else c.rjust(w)
                                for j, (c, w) in enumerate(zip(row, widths))) + " |")
        if i == 0:
            print("|" + "|".join("-" * (w + 2) for w in widths) + "|")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="write-to-ack latency at a steady line rate")
    ap.add_argument("--scenarios", default="10k,1k,idle",
                    help="comma-separated: 10k (10,000 lines/s in 100-line writes, 30 s), 1k (1,000 lines/s "
                         "in 1-line writes, 30 s), idle (nothing written, 60 s), custom (--rate, "
                         "--interval-ms, --duration); default 10k,1k,idle")
    ap.add_argument("--rate", type=float, default=10_000, help="custom: lines per second (default 10,000)")
    ap.add_argument("--duration", type=float, default=None,
                    help="seconds of writing (default: the scenario's; custom 20)")
    ap.add_argument("--idle-duration", type=float, default=None, help="idle: seconds (default 60)")
    ap.add_argument("--idle-settle", type=float, default=3.0,
                    help="idle: seconds after the warm-up line before the minute starts (default 3)")
    ap.add_argument("--interval-ms", type=float, default=5.0, help="custom: one write every this long (default 5)")
    ap.add_argument("--naive-poll-ms", type=float, default=10.0, help="naive tailer's poll at EOF (default 10)")
    ap.add_argument("--systems", default="naive,shipper,syslog-ng,rsyslog",
                    help="comma-separated (default naive,shipper,syslog-ng,rsyslog; also sync: "
                         "bench/syncproto.py, a measurement of shipper's cycle run in one thread)")
    ap.add_argument("--sync-interval-ms", type=float, default=40.0,
                    help="sync (bench/syncproto.py, shipper's cycle in one thread): one cycle every this long "
                         "(default 40, shipper's flush_min_interval)")
    ap.add_argument("--line-bytes", type=int, default=350)
    ap.add_argument("--seed", type=int, default=DEFAULT_SEED)
    ap.add_argument("--gzip", choices=("on", "off"), default="on", help="shipper: compression gzip|none")
    ap.add_argument("--in-flight", type=int, default=None, help="shipper: max_in_flight")
    ap.add_argument("--bulk-max-events", type=int, default=None, help="shipper: bulk_max_events")
    ap.add_argument("--flush-interval", default=None, help="shipper: flush_interval, e.g. 250ms")
    ap.add_argument("--flush-min-interval", default=None,
                    help="shipper: flush_min_interval, e.g. 0 (each batch at once) or 40ms (the default)")
    ap.add_argument("--log-level", default="info", help="shipper: log_level")
    ap.add_argument("--sink-latency-ms", type=float, default=0.0, help="sink: delay before each answer")
    ap.add_argument("--warmup-timeout", type=float, default=30.0)
    ap.add_argument("--drain-timeout", type=float, default=30.0)
    ap.add_argument("--stop-timeout", type=float, default=20.0)
    ap.add_argument("--keep", action="store_true", help="keep temp dirs (config, state, logs)")
    ap.add_argument("--tmp-dir", default=None)
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--cprofile", action="store_true",
                    help="shipper under cProfile (main thread; slower): .prof per scenario in bench/out")
    ap.add_argument("--profile", action="store_true",
                    help="run shipper under py-spy (bench/out/latency-shipper.folded, summarised here); skews figures")
    ap.add_argument("--profile-rate", type=int, default=250, help="--profile: samples per second (default 250)")
    ap.add_argument("--profile-gil", action="store_true",
                    help="--profile: sample only the thread holding the GIL (Python's on-CPU time, no waits)")
    ap.add_argument("--show-slowest", type=int, default=0, metavar="K",
                    help="print the K requests that carried the oldest docs (when, how many, gap before)")
    ap.add_argument("--json", default=os.path.join(OUT_DIR, "last-latency.json"))
    args = ap.parse_args(argv)
    if os.sep in args.python:     # the systems run in their own directory: a relative path would not resolve
        args.python = os.path.abspath(args.python)
    os.makedirs(OUT_DIR, exist_ok=True)      # py-spy writes its profile there, and fails silently without it
    systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    if any(s in PEERS for s in systems):
        ensure_peers()
    plan: list[tuple[str, float, float, float]] = []
    for name in (s.strip() for s in args.scenarios.split(",") if s.strip()):
        if name == "custom":
            plan.append((name, args.rate, args.interval_ms, args.duration or 20.0))
        elif name in SCENARIOS:
            rate, interval_ms, duration = SCENARIOS[name]
            if name == "idle":
                duration = args.idle_duration or duration
            else:
                duration = args.duration or duration
            plan.append((name, rate, interval_ms, duration))
        else:
            raise SystemExit(f"unknown scenario {name!r} (known: {', '.join(SCENARIOS)}, custom)")
    info = machine_info()
    print(machine_line(info))
    print("# " + "; ".join(f"{n}: {r:,.0f} lines/s every {i:g} ms for {d:g} s" for n, r, i, d in plan)
          + f"; line_bytes={args.line_bytes} gzip={args.gzip} sink_latency_ms={args.sink_latency_ms:g}",
          flush=True)
    if any(s.startswith("shipper") for s in systems):
        print(f"# {compile_bytecode(args.python)}", flush=True)
    sink = SinkProcess(latency_ms=args.sink_latency_ms, record_latency=True, python=args.python)
    results = []
    try:
        for scenario, rate, interval_ms, duration, system in [(*step, system) for step in plan
                                                              for system in systems]:
            r = measure(system, sink, args, scenario, rate, interval_ms, duration)
            results.append(r)
            lat = r.get("latency_ms") or {}
            if "written" in r:
                print(f"  {scenario} {system}: CPU {r['cpu_s']:.2f} s (on-CPU by schedstat {r['on_cpu_s']:.3f} s), "
                      f"{r['wakeups_per_s']:.1f} wakeups/s; "
                      f"wrote {r['written']:,} at {r['rate']:,.0f}/s (worst tick "
                      f"{r['max_tick_late_ms']:.1f} ms late), received {r.get('received', 0):,}, "
                      f"p99 {lat.get('p99', float('nan')):.1f} ms; disk written {r.get('io_write_bytes', 0):,} B "
                      f"(wchar {r.get('io_wchar', 0):,}, state dir {r.get('state_written_bytes')}) for "
                      f"{r.get('log_bytes', 0):,} B of log", flush=True)
                busy = [t for t in r.get("threads", []) if t["cpu_s"] >= 0.005]
                if busy:
                    print("    threads (on-CPU s, context switches): " + ", ".join(
                        f"{t['thread']} {t['cpu_s']:.3f} s {t['switches']:,}" for t in busy), flush=True)
                if args.show_slowest:
                    for row in r.get("slowest_requests", [])[:args.show_slowest]:
                        print(f"    slow request at {row['at_s']:7.3f} s: {row['docs']:5d} docs, oldest "
                              f"{row['oldest_ms']:7.1f} ms, newest {row['newest_ms']:7.1f} ms, "
                              f"{row['gap_ms']:7.1f} ms after the previous request", flush=True)
    finally:
        sink.stop()
    print()
    print_table(results)
    if args.profile:
        for scenario, *_ in plan:
            for system in (s for s in systems if s.startswith("shipper")):
                print(f"\n## profile of {system}, {scenario}")
                print_folded(os.path.join(OUT_DIR, f"latency-{system}-{scenario}.folded"))
    os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
    with open(args.json, "w") as f:
        json.dump({"machine": info, "args": vars(args), "results": results}, f, indent=1)
    return 0 if all(r["ok"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
