"""`shipper demo`, the README's (and docs/index.md's) first command, runs the whole pipeline and reports exactly once."""

from __future__ import annotations

import subprocess
import sys


def test_demo_ships_rotated_sample_logs_exactly_once() -> None:
    proc = subprocess.run([sys.executable, "-m", "shipper", "demo", "--lines", "800"],
                          capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr
    assert "lines written:     800" in out
    assert "documents arrived: 800" in out
    assert "missing lines:     0" in out
    assert "duplicates:        0" in out
    assert "sample search hit" in out
    assert "all lines arrived exactly once" in out
