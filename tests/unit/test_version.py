"""`shipper --version`: the installed distribution's version, also in `shipper status` (text and JSON)."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from importlib.metadata import version
from pathlib import Path

import orjson
import pytest

from shipper import __version__
from shipper.commands.main import main
from shipper.commands.status import render

REPO = Path(__file__).resolve().parents[2]


def test_version_is_the_package_metadata_and_pyproject() -> None:
    assert __version__ == version("shipper")
    assert __version__ == tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]


def test_version_flag_prints_it_and_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0
    assert capsys.readouterr().out == f"shipper {__version__}\n"
    out = subprocess.run([sys.executable, "-m", "shipper", "--version"], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0 and out.stdout == f"shipper {__version__}\n"


def test_status_shows_the_version_in_json_and_text(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    state = tmp_path / "state"
    assert main(["status", "-c", str(tmp_path / "none.yaml"), "--state-dir", str(state), "--json"]) == 0
    doc = orjson.loads(capsys.readouterr().out)
    assert doc["version"] == __version__ and doc["running"] is False
    assert set(doc) >= {"files", "queue", "dead_letter", "output"}          # SPEC's shape, extended
    assert main(["status", "-c", str(tmp_path / "none.yaml"), "--state-dir", str(state)]) == 0
    assert capsys.readouterr().out.splitlines()[0].endswith(f"   version {__version__}")
    head = render({"running": True, "pid": 7, "version": "9.9.9"}, "/s", 0.0).splitlines()[0]
    assert head == "shipper: running (pid 7)   state_dir: /s   version 9.9.9"
