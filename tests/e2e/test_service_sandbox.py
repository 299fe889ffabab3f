"""The systemd unit's sandbox (SPEC, Trust boundaries): `systemd-analyze security --offline=yes`
scores the repo's unit and the ones shipper-setup renders at 2.5 or lower ("OK"; 5.2 before),
and the daemon still does its work under the restrictions a plain process can be given
(tests/support/sandbox.py: the unit's own SystemCallFilter, SystemCallErrorNumber,
MemoryDenyWriteExecute, UMask, NoNewPrivileges): files found by inotify and by rotation, a
journald input through its journalctl child, the metrics endpoint, SIGTERM's flush. Every line
once, promptly."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from shipper.commands.setup import render_systemd_unit
from tests.support import sandbox
from tests.support.daemon import Daemon, write_config
from tests.support.es import ES
from tests.support.journal import Journal, journal_remote
from tests.support.wait import wait_until
from tests.support.writer import pino_line, write_lines

REPO = Path(__file__).resolve().parents[2]
UNIT = REPO / "systemd" / "shipper.service"
MAX_EXPOSURE = 2.5

needs_analyze = pytest.mark.skipif(shutil.which("systemd-analyze") is None,
                                   reason="systemd-analyze is not installed (.ci/run installs systemd)")


def exposure(unit_text: str, tmp_path: Path) -> float:
    path = tmp_path / "shipper.service"
    path.write_text(unit_text)
    done = subprocess.run(["systemd-analyze", "security", "--offline=yes", str(path)], capture_output=True,
                          text=True, timeout=60, check=False)
    m = re.search(r"Overall exposure level for shipper\.service: ([0-9.]+)", done.stdout + done.stderr)
    assert m, done.stdout + done.stderr
    return float(m.group(1))


@needs_analyze
def test_the_units_exposure_is_ok(tmp_path: Path) -> None:
    assert exposure(UNIT.read_text(), tmp_path) <= MAX_EXPOSURE


@needs_analyze
@pytest.mark.parametrize("globs, state_dir, is_journald", [
    (("/var/log/**/*.log",), "/var/lib/shipper", True),
    (("/home/app/logs/*.log",), "/var/lib/shipper", False),
    (("/tmp/app/*.log",), "/srv/shipper-state", False),
])
def test_the_rendered_units_exposure_is_ok(tmp_path: Path, globs: tuple[str, ...], state_dir: str,
                                           is_journald: bool) -> None:
    unit = render_systemd_unit("/usr/local/bin/shipper", "/etc/shipper/shipper.yaml", state_dir, globs, is_journald)
    assert exposure(unit, tmp_path) <= MAX_EXPOSURE


@pytest.mark.skipif(sandbox.available() is not None, reason=str(sandbox.available()))
@pytest.mark.parametrize("code, refused", [
    ("import os; os.chroot('/')", "PermissionError"),                       # @privileged, even for root
    ("import os; os.setpriority(os.PRIO_PROCESS, 0, 5)", "PermissionError"),  # @resources
    ("import mmap; mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)", "PermissionError"),
    ("import os; print(oct(os.umask(0)))", "0o77"),
])
def test_the_harness_applies_what_the_unit_says(code: str, refused: str) -> None:
    """The restrictions the daemon test runs under are in force: what the unit refuses is refused."""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False,
                          preexec_fn=sandbox.restrictions(UNIT.read_text()))
    assert refused in done.stdout + done.stderr, done.stdout + done.stderr


@pytest.mark.skipif(sandbox.available() is not None, reason=str(sandbox.available()))
@pytest.mark.skipif(journal_remote() is None, reason="systemd-journal-remote is not installed")
def test_the_daemon_works_under_the_units_restrictions(tmp_path: Path, es: ES, daemon_factory: Any) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    write_lines(logs / "app.log", range(0, 50))
    journal = Journal(tmp_path / "journal")
    journal.append(*[pino_line(i).decode().strip() for i in range(1000, 1020)])
    cfg = write_config(tmp_path, es_url=es.url, paths=str(logs / "*.log"), extra_yaml={
        "inputs": [{"paths": [str(logs / "*.log")], "scan_interval": "500ms"},
                   {"journald": {"directory": str(journal.directory)}}]})
    d: Daemon = daemon_factory(cfg, start=False, preexec=sandbox.restrictions(UNIT.read_text()))
    d.start()
    d.wait_ready()
    status = Path(f"/proc/{d.pid}/status").read_text()
    assert "\nSeccomp:\t2\n" in status and "\nNoNewPrivs:\t1\n" in status, status
    wait_until(lambda: es.count() >= 70, lambda: f"the first 70 (have {es.count()})\n{d.tail(30)}", timeout_s=20)
    write_lines(logs / "new.log", range(100, 120))                       # a new file: inotify, an open
    os.rename(logs / "app.log", logs / "app.log.1")                      # a rotation by rename
    write_lines(logs / "app.log", range(200, 220))
    journal.append(*[pino_line(i).decode().strip() for i in range(1020, 1030)])
    wait_until(lambda: es.count() >= 120, lambda: f"120 documents (have {es.count()})\n{d.tail(30)}", timeout_s=15)
    with urllib.request.urlopen(d.base_url + "/metrics", timeout=5) as resp:
        assert b"shipper_events_read_total" in resp.read()
    d.send(signal.SIGTERM)
    assert d.wait_exit() == 0, d.tail(40)
    es.assert_exactly_once([*range(0, 50), *range(100, 120), *range(200, 220), *range(1000, 1030)])
    out = d.output()
    assert "Traceback" not in out and "Operation not permitted" not in out, d.tail(40)
    state = tmp_path / "state"
    assert all(os.stat(state / n).st_mode & 0o077 == 0 for n in ("lock", "status.json")), "UMask=0077 not kept"
