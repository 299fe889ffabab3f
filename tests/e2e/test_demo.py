"""`shipper demo`, the README's (and docs/index.md's) first command, runs the whole pipeline and reports exactly once."""

from __future__ import annotations

import json
import re
import subprocess
import sys

from tests.support.promptness import DEFAULT_BOUND_S


def test_demo_ships_rotated_sample_logs_exactly_once() -> None:
    proc = subprocess.run([sys.executable, "-m", "shipper", "demo", "--lines", "800"],
                          capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr
    assert "lines written:     800" in out
    assert "documents arrived: 800" in out
    assert "missing lines:     0" in out
    assert "duplicates:        0" in out
    # the promptness oracle's bound (tests/support/promptness.py), here as the demo measures it: from
    # each line's write, or from the daemon being ready for those written before, to all counted
    slowest = float(re.search(r"slowest line: +at most ([0-9.]+)s", out).group(1))  # type: ignore[union-attr]
    assert slowest <= DEFAULT_BOUND_S, out
    assert "sample search hit" in out
    hit = json.loads(out[out.index("{", out.index("sample search hit")):out.index("\nall lines arrived")])
    src = hit["_source"]
    # the ECS fields of the pino-http line (docs/pino.md), ahead of pino's own
    assert list(src)[:3] == ["@timestamp", "message", "log"]
    assert src["trace"]["id"] == src["trace_id"] and src["url"]["original"] == src["req"]["url"]
    assert src["url"]["path"] + "?" + src["url"]["query"] == src["req"]["url"]
    assert src["http"]["response"]["status_code"] == src["res"]["statusCode"]
    assert src["event"]["duration"] == src["responseTime"] * 1_000_000 and src["service"] == {"name": "demo-shop", "environment": "demo"}
    assert "all lines arrived exactly once" in out
