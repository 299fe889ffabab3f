"""The benchmark harnesses still run: every figure in the README and docs/performance.md comes
from bench/run.py and bench/latency.py, and a harness that breaks silently (a relative --python
once did) breaks the next round's measurements. Tiny inputs, real processes, the real bulk sink;
what is checked is that every system delivered what was written, not how fast (never timed here).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _bench(script: str, *args: str, timeout_s: float = 120) -> subprocess.CompletedProcess[str]:
    # --python relative to the repo, as a user types it: the harness must make it absolute (its
    # systems run in their own directories)
    python = os.path.relpath(sys.executable, REPO)
    return subprocess.run([sys.executable, f"bench/{script}", *args, "--python", python], cwd=REPO,
                          capture_output=True, text=True, timeout=timeout_s)


def test_run_py_ships_a_small_backlog_through_naive_and_shipper(tmp_path: Path) -> None:
    out = tmp_path / "run.json"
    p = _bench("run.py", "-n", "3000", "--systems", "naive,shipper", "--runs", "1", "--json", str(out))
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    summary = {row["system"]: row for row in json.loads(out.read_text())["summary"]}
    assert set(summary) == {"naive", "shipper"}
    for name, row in summary.items():
        assert row["runs_ok"] == 1 and row["docs"] == 3000, (name, row)
        assert row["requests"] >= 1 and row["peak_rss_mb"] > 0 and row["cpu_per_m"] > 0, (name, row)
    assert "| shipper " in p.stdout and "docs/s vs naive" in p.stdout


def test_latency_py_measures_a_short_steady_rate(tmp_path: Path) -> None:
    out = tmp_path / "latency.json"
    p = _bench("latency.py", "--scenarios", "custom", "--rate", "200", "--interval-ms", "10", "--duration", "1.5",
               "--systems", "naive,shipper", "--json", str(out))
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    results = {r["system"]: r for r in json.loads(out.read_text())["results"]}
    assert set(results) == {"naive", "shipper"}
    for name, r in results.items():
        assert r["ok"] and r["written"] > 0 and r["received"] == r["written"], (name, r)
        assert r["requests"] >= 1 and r["latency_ms"], (name, r)
