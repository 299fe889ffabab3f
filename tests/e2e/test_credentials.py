"""Credentials bound for an http:// destination (SPEC, Trust boundaries): the daemon warns at start
and `shipper check` warns, naming which credentials and which host, never showing them; no
command prints them (check, status, the daemon's whole output). The daemon still ships: every
line once, promptly."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.support.daemon import REPO_ROOT, Daemon, write_config
from tests.support.es import ES
from tests.support.wait import wait_until
from tests.support.writer import write_lines

PASSWORD = "Pw-7c1e-not-for-logs"
URL_PASSWORD = "Url-93ad-not-for-logs"


def test_credentials_over_http_are_warned_about_and_never_shown(tmp_path: Path, es: ES, daemon_factory: Any) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    write_lines(logs / "app.log", range(20))
    host = es.url.replace("http://", f"http://elastic:{URL_PASSWORD}@")
    cfg = write_config(tmp_path, es_url=host, paths=str(logs / "*.log"),
                       extra_yaml={"output": {"elasticsearch": {"username": "elastic", "password": PASSWORD}}})
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    check = subprocess.run([sys.executable, "-m", "shipper", "check", "-c", str(cfg)], capture_output=True,
                           text=True, timeout=60, env=env, check=False)
    plain = es.url.removeprefix("http://")
    assert (f"output: WARNING: credentials (password, the password in the URL) are sent unencrypted to "
            f"http://{plain}") in check.stdout, check.stdout + check.stderr
    d: Daemon = daemon_factory(cfg)
    wait_until(lambda: es.count() >= 20, "20 lines", timeout_s=15)
    write_lines(logs / "app.log", range(20, 30))
    wait_until(lambda: es.count() >= 30, "10 more, promptly", timeout_s=10)
    es.assert_exactly_once(range(30))
    status = d.cli("status", "--json", "-c", str(cfg))
    out = d.output()
    assert out.count('"msg":"credentials sent unencrypted"') == 1, d.tail()
    for text in (check.stdout + check.stderr, status.stdout + status.stderr, out):
        assert PASSWORD not in text and URL_PASSWORD not in text
    assert d.alive
