"""The benchmark harnesses still run: every figure in the README and docs/performance.md comes
from bench/run.py and bench/latency.py, and a harness that breaks silently (a relative --python
once did) breaks the next round's measurements. Tiny inputs, real processes, the real bulk sink;
what is checked is that every system delivered what was written, not how fast (never timed here).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[2]


def _bench(script: str, *args: str, timeout_s: float = 120) -> subprocess.CompletedProcess[str]:
    # --python relative to the repo, as a user types it: the harness must make it absolute (its
    # systems run in their own directories)
    python = os.path.relpath(sys.executable, REPO)
    return subprocess.run([sys.executable, f"bench/{script}", *args, "--python", python], cwd=REPO,
                          capture_output=True, text=True, timeout=timeout_s)


def test_run_py_ships_a_small_backlog_through_naive_and_shipper(tmp_path: Path) -> None:
    out = tmp_path / "run.json"
    p = _bench("run.py", "-n", "3000", "--systems", "naive,shipper,shipper-sigv4", "--runs", "1", "--json", str(out))
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    summary = {row["system"]: row for row in json.loads(out.read_text())["summary"]}
    assert set(summary) == {"naive", "shipper", "shipper-sigv4"}
    for name, row in summary.items():
        assert row["runs_ok"] == 1 and row["docs"] == 3000, (name, row)
        assert row["requests"] >= 1 and row["peak_rss_mb"] > 0 and row["cpu_per_m"] > 0, (name, row)
    assert "| shipper " in p.stdout and "docs/s vs naive" in p.stdout
    # the shipper under test runs from bytecode, as an installed one does (not compiled at each start)
    assert "# byte-compiled " in p.stdout and "not byte-compiled" not in p.stdout, p.stdout[:2000]


def test_discovery_py_ships_many_files_once_and_measures_them_idle(tmp_path: Path) -> None:
    out = tmp_path / "discovery.json"
    # more files than max_open_files, so that appends reach parked files too
    p = _bench("discovery.py", "--files", "120", "--max-open", "40", "--idle", "1", "--settle", "0.5",
               "--steady", "1", "--steady-rate", "200", "--appends", "4", "--late", "6", "--json", str(out))
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    r = json.loads(out.read_text())
    assert r["ok"] and r["expected"] == 120 + 200 + 4 + 6 and r["lost"] == 0 and r["duplicates"] == 0, r
    assert r["sink"]["verify"]["distinct_seqs"] == 330 and r["exit_code"] == 0, r
    assert 0 < r["open_log_fds"] <= 40 and len(r["append_ms"]) == 4 and r["late_s"] > 0, r
    assert r["steady_lines"] == 200 and r["steady_s"] >= 1 and r["steady_cpu_s"] > 0, r
    assert r["idle_cpu_percent"] >= 0 and r["peak_rss_mb"] > 0, r
    assert "| files | catch-up s |" in p.stdout


def test_rotation_soak_ships_every_line_once_while_busy_and_quiet_files_rotate(tmp_path: Path) -> None:
    out = tmp_path / "soak.json"
    p = _bench("rotation_soak.py", "--files", "40", "--busy", "8", "--seconds", "5", "--rate", "200",
               "--rotate-every", "0.2", "--json", str(out))
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    r = json.loads(out.read_text())
    assert r["ok"] and r["lost"] == 0 and r["duplicates"] == 0 and r["exit_code"] == 0, r
    assert r["lines"] > 40 * 3 and r["rotations"]["create"] > 0 and r["rotations"]["copytruncate"] > 0, r
    assert r["rotations"]["of idle files"] > 0, r


def test_compile_bytecode_says_when_it_could_not() -> None:
    # in a process of its own: importing bench/run.py puts bench/ on sys.path
    code = ("import sys; sys.path.insert(0, 'bench'); import run; "
            "print(run.compile_bytecode(sys.executable)); print(run.compile_bytecode('no-such-python'))")
    p = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    ok, missing = p.stdout.splitlines()
    assert ok.startswith("byte-compiled ") and Path(ok.split(" ", 1)[1]).resolve() == REPO / "shipper", ok
    assert missing.startswith("not byte-compiled ("), missing


def test_cold_py_prints_every_call_at_every_gap() -> None:
    p = subprocess.run([sys.executable, "bench/cold.py", "--gaps", "0,1", "--calls", "3"], cwd=REPO,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    rows = [line for line in p.stdout.splitlines() if line.startswith("| ") and not line.startswith(("| call", "| ---"))]
    assert [r.split(" | ")[0].lstrip("| ") for r in rows] == \
        ["nothing", "statvfs", "gzip 15 KB", "python 2k ops", "spool commit"], p.stdout
    assert all(r.count("|") == 4 for r in rows), p.stdout


def test_watch_trees_py_counts_the_watches_of_each_tree() -> None:
    p = subprocess.run([sys.executable, "bench/watch_trees.py", "--deep", "20", "--wide", "300"], cwd=REPO,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    rows = [line.split(" | ") for line in p.stdout.splitlines() if line.startswith(("| deep", "| wide"))]
    # deep: the base and the 8 levels a ** reaches; wide: the base, the tree moved in, its 300 directories
    assert [(r[0], r[1]) for r in rows] == [("| deep 20", "9"), ("| wide 300", "302")], p.stdout


def test_latency_py_measures_a_short_steady_rate(tmp_path: Path) -> None:
    out = tmp_path / "latency.json"
    p = _bench("latency.py", "--scenarios", "custom", "--rate", "200", "--interval-ms", "10", "--duration", "1.5",
               "--systems", "naive,shipper,sync", "--json", str(out))
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    results = {r["system"]: r for r in json.loads(out.read_text())["results"]}
    assert set(results) == {"naive", "shipper", "sync"}
    for name, r in results.items():
        assert r["ok"] and r["written"] > 0 and r["received"] == r["written"], (name, r)
        assert r["requests"] >= 1 and r["latency_ms"], (name, r)
        # per thread over the window: the main thread is always among them, and the threads'
        # on-CPU seconds add up to the process tree's
        threads = {t["thread"]: t for t in r["threads"]}
        assert "main" in threads and threads["main"]["cpu_s"] > 0, (name, r["threads"])
        assert abs(sum(t["cpu_s"] for t in r["threads"]) - r["on_cpu_s"]) < 0.05, (name, r)
    assert "threads (on-CPU s, context switches): main " in p.stdout, p.stdout[-2000:]


def test_syncproto_ships_each_line_once_and_keeps_the_checkpoint_with_its_batch(tmp_path: Path) -> None:
    # the one-thread prototype of the cycle (bench/syncproto.py) keeps the design rules it is
    # measured under: every line arrives once, and its spool ends holding the file's end as the
    # checkpoint and no batch (the last one acked as it stops)
    from shipper.spool.store import Spool
    log, state = tmp_path / "app.log", tmp_path / "state"
    log.write_bytes(b"".join(b'{"level":30,"time":1764000000000,"msg":"line %d"}\n' % i for i in range(500)))
    sink = _bench_sink().SinkProcess(verify=True)
    try:
        proto = subprocess.Popen([sys.executable, "bench/syncproto.py", str(log), sink.url, "--interval-ms", "5",
                                  "--state", str(state)], cwd=REPO)
        try:
            assert sink.wait_docs(500, 60)["docs"] == 500, "the prototype did not deliver"
            with log.open("ab") as f:          # appended later: the next cycles take it
                f.write(b'{"level":30,"time":1764000000000,"msg":"late"}\n')
            assert sink.wait_docs(501, 60)["docs"] == 501, "the late line did not arrive"
        finally:
            proto.terminate()
            assert proto.wait(timeout=30) == 0
    finally:
        received = sink.stop()
    assert received is not None and received["docs"] == 501 and received["verify"]["distinct_ids"] == 501, received
    spool = Spool(str(state))
    try:
        assert [cp.offset for cp in spool.checkpoints.values()] == [log.stat().st_size] and not spool.pending
    finally:
        spool.close()


def _bench_sink() -> ModuleType:
    """bench/sink.py as a module, loaded by path (bench/ stays off this process's sys.path)."""
    spec = importlib.util.spec_from_file_location("bench_sink", REPO / "bench" / "sink.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module        # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_floor_py_measures_each_kind_of_cycle() -> None:
    sink = subprocess.Popen([sys.executable, "bench/sink.py"], cwd=REPO, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    try:
        assert sink.stdout is not None
        url = json.loads(sink.stdout.readline())["url"]
        p = subprocess.run([sys.executable, "bench/floor.py", url, "-n", "3", "--interval-ms", "5",
                            "--lines", "4", "--client", "all"], cwd=REPO, capture_output=True, text=True,
                           timeout=120)
    finally:
        assert sink.stdin is not None
        sink.stdin.close()            # the sink exits when its stdin closes
        sink.wait(timeout=30)
        assert sink.stdout is not None
        received = json.loads(sink.stdout.read().splitlines()[-1])
        sink.stdout.close()
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    rows = [json.loads(line) for line in p.stdout.splitlines()]
    assert [r["client"] for r in rows] == ["sleep", "aiohttp", "raw", "thread", "spool",
                                           "sync-sleep", "sync-raw", "sync-spool"], p.stdout
    for r in rows:
        assert r["lines"] == 4 and r["cpu_us_per_request"] > 0, r
        assert r["requests"] == (0 if r["client"].endswith("sleep") else 3), r
    # every request of the six clients that post (a first one, then 3) reached the sink whole
    assert received["docs"] == 6 * 4 * 4, received


_FAULTS = """
import os, resource, sys
sys.path.insert(0, "bench")
import sink
from isal import igzip
held = sink.keep_buffers_in_heap() if sys.argv[1] == "held" else False
def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
gz = igzip.compress(os.urandom(450_000).hex().encode(), 1)    # a 900 KB body, gzip as shipper sends it
igzip.decompress(gz)
before = faults()
for _ in range(20):
    body = igzip.decompress(gz)     # what the sink does with each gzip request
    del body
print(held, faults() - before)
"""


def test_the_sink_keeps_large_bodies_in_its_heap() -> None:
    # the sink shares the cores with the system under test: decoding a 900 KB body must not fault
    # its pages in anew each time (glibc mmaps a growing buffer over 128 KiB and unmaps it when
    # freed), or large bodies (shipper's gzip ones) are charged sink CPU that small plain ones
    # (syslog-ng's) are not
    runs = {}
    for mode in ("held", "default"):
        p = subprocess.run([sys.executable, "-c", _FAULTS, mode], cwd=REPO, capture_output=True, text=True,
                           timeout=60)
        assert p.returncode == 0, p.stderr
        held, faults = p.stdout.split()
        runs[mode] = (held == "True", int(faults))
    assert runs["held"][0] is True
    assert runs["default"][1] >= 20 * 50, runs        # glibc's default: ~150 page faults per body here
    assert runs["held"][1] < 100, runs                # held in the heap: the pages are reused


def test_slow_destination_py_delivers_everything_through_a_delayed_sink(tmp_path: Path) -> None:
    out = tmp_path / "slow.json"
    p = _bench("slow_destination.py", "--rate", "200", "--duration", "2", "--sink-latency-ms", "300",
               "--drain-timeout", "30", "--json", str(out))
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    [r] = json.loads(out.read_text())
    assert r["written"] == 400 and r["docs"] == r["written"] and r["drain_s"] is not None, r
    assert r["requests"] >= 1 and r["cpu_s"] > 0, r
    p = _bench("slow_destination.py", "--join-cost")
    assert p.returncode == 0 and "join us/KiB" in p.stdout, p.stdout[-2000:] + p.stderr[-2000:]
