"""`shipper check` with journald inputs: readable or not, and how many entries match."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from shipper.commands.check import check
from tests.support.journal import Journal


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_check_reports_each_journald_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    j = Journal(tmp_path / "journal")
    j.append("a", "b", j.entry("w", unit="web.service"))
    cfg = tmp_path / "shipper.yaml"
    cfg.write_text(f"""
state_dir: {tmp_path / 'state'}
inputs:
  - journald: {{directory: {j.directory}}}
  - journald: {{directory: {j.directory}, units: [web]}}
  - journald: {{directory: {tmp_path / 'missing'}}}
output:
  elasticsearch:
    hosts: ['http://127.0.0.1:{_closed_port()}']
    timeout: 2s
""")
    assert check(str(cfg)) == 1
    out = capsys.readouterr().out
    assert f"input 0: journald {j.directory} (every unit; auto): readable, 3 entries match" in out
    assert f"input 1: journald {j.directory} (web; auto): readable, 1 entry matches" in out
    assert f"input 2: journald {tmp_path / 'missing'} (every unit; auto): NOT READABLE" in out
