"""A file the daemon may not read is reported once (not silently skipped) and shipped once it may.

The daemon runs as `nobody` (setpriv), since root reads everything."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import promptness
from tests.support.daemon import REPO_ROOT, write_config
from tests.support.es import ES
from tests.support.promptness import Timeline
from tests.support.wait import wait_until
from tests.support.writer import write_lines

NOBODY = 65534

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None,
                                reason="needs root and setpriv to run the daemon as another user")


def test_unreadable_file_is_reported_once_and_shipped_when_readable(open_tmp: Path, es: ES,
                                                                   timeline: Timeline) -> None:
    tmp_path = open_tmp
    logs = tmp_path / "logs"
    logs.mkdir(mode=0o755)
    write_lines(logs / "public.log", range(0, 20))
    write_lines(logs / "private.log", range(100, 120))
    os.chmod(logs / "public.log", 0o644)
    os.chmod(logs / "private.log", 0o600)
    state = tmp_path / "state"
    state.mkdir()
    os.chown(state, NOBODY, NOBODY)
    cfg = write_config(tmp_path, es_url=es.url, paths=str(logs / "*.log"), state_dir=state,
                       extra_yaml={"metrics": {"listen": None}})
    os.chmod(cfg, 0o644)
    out_path = tmp_path / "daemon.out"
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    with open(out_path, "wb") as out:
        proc = subprocess.Popen(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups",
                                 sys.executable, "-m", "shipper", "run", "-c", str(cfg)],
                                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, cwd="/")
    promptness.note_serving(proc, True)       # the lines written before count from the start
    try:
        wait_until(lambda: es.count() >= 20 or proc.poll() is not None, "the readable file's 20 lines")
        assert proc.poll() is None, out_path.read_text()
        wait_until(lambda: "permission denied" in out_path.read_text(), "the permission warning")
        os.chmod(logs / "private.log", 0o644)
        readable_at = timeline.now()          # the private lines are due from here
        wait_until(lambda: es.count() >= 40, "the private file, shipped once it became readable", timeout_s=20)
        es.assert_exactly_once(list(range(0, 20)) + list(range(100, 120)),
                               written={**{s: timeline.written[s] for s in range(20)},
                                        **dict.fromkeys(range(100, 120), readable_at)})
        assert out_path.read_text().count("permission denied") == 1
        assert proc.poll() is None
    finally:
        proc.kill()
        proc.wait()
