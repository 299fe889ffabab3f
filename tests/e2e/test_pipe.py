"""`shipper pipe`: stdin through the same parse, queue and output, as a real subprocess.

20,000 lines delivered with exit 0; usage errors exit 2; with the destination down the pipe exits
1 with the rest durably queued, and a later `shipper run` on the same state dir delivers it
exactly once. Oracle: each written line is in osmem exactly once.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from tests.support import promptness
from tests.support.daemon import REPO_ROOT, write_config
from tests.support.es import ES
from tests.support.proxy import FaultProxy
from tests.support.wait import wait_until
from tests.support.writer import pino_line

pytestmark = pytest.mark.slow

INDEX = "piped"


def _env(tmp_path: Path, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    env["XDG_STATE_HOME"] = str(tmp_path / "xdg")
    env.update(extra or {})
    return env


def _pipe(tmp_path: Path, *args: str, stdin: Any = subprocess.PIPE) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen([sys.executable, "-m", "shipper", "pipe", *args], stdin=stdin,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=_env(tmp_path), cwd=tmp_path)
    promptness.note_serving(proc, True)     # lines wait only while a pipe (or a daemon) runs
    return proc


def _finish(proc: subprocess.Popen[bytes], data: bytes | None = None, timeout: float = 60) -> tuple[bytes, bytes]:
    """Feed `data` (its lines count as written now, before the pipe has read them) and close stdin."""
    if data is not None:
        promptness.note_written(data)
    try:
        return proc.communicate(data, timeout=timeout)
    finally:
        promptness.note_serving(proc, False)


def _feed(proc: subprocess.Popen[bytes], data: bytes) -> None:
    assert proc.stdin is not None
    proc.stdin.write(data)
    proc.stdin.flush()
    promptness.note_written(data)


def _lines(seqs: range) -> bytes:
    return b"".join(pino_line(s) for s in seqs)


def test_pipe_delivers_20000_lines_and_exits_0(tmp_path: Path, es: ES) -> None:
    n = 20_000
    proc = _pipe(tmp_path, "--url", es.url, "--index", INDEX)
    out, err = _finish(proc, _lines(range(n)), timeout=90)
    assert proc.returncode == 0, err.decode()[-3000:]
    docs = es.assert_exactly_once(range(n), index=INDEX + "*")
    assert {d["_source"]["log"]["file"]["path"] for d in docs} == {"-"}
    assert docs[0]["_source"]["message"]                       # pino msg -> message: the same parse as files
    state = tmp_path / "xdg" / "shipper" / "pipe"
    assert (state / "spool").is_dir(), "the default state dir is $XDG_STATE_HOME/shipper/pipe"
    logs = [json.loads(ln) for ln in err.decode().splitlines() if ln.startswith("{")]
    done = [r for r in logs if r["msg"] == "pipe finished"]
    assert done and done[0]["shipped_total"] == n and done[0]["queued"] == 0
    assert not any(r["level"] == "error" for r in logs)
    assert out == b""


def test_pipe_from_a_regular_file_reports_progress_in_status(tmp_path: Path, es: ES) -> None:
    src = tmp_path / "input.log"
    data = _lines(range(3000)) + b'{"seq": 3000, "msg": "no trailing newline"}'
    src.write_bytes(data)
    promptness.note_written(data)
    cfg = write_config(tmp_path, es_url=es.url, paths=tmp_path / "nothing" / "*.log",
                       extra_yaml={"output": {"elasticsearch": {"index": INDEX}}})
    with open(src, "rb") as f:
        proc = _pipe(tmp_path, "-c", str(cfg), stdin=f)
        _out, err = _finish(proc)
    assert proc.returncode == 0, err.decode()[-3000:]
    es.assert_exactly_once(range(3001), index=INDEX + "*")
    status = subprocess.run([sys.executable, "-m", "shipper", "status", "-c", str(cfg), "--json"],
                            capture_output=True, env=_env(tmp_path), check=True)
    doc = json.loads(status.stdout)
    assert doc["running"] is False and doc["queue"]["events"] == 0
    last = json.loads((tmp_path / "state" / "status.json").read_bytes())
    assert last["mode"] == "pipe" and last["running"] is False
    (row,) = last["files"]
    size = src.stat().st_size
    assert row["path"] == "-" and row["size"] == size and row["offset"] == size and row["lag_bytes"] == 0


@pytest.mark.parametrize("args, names", [
    (["--index", "x"], "--url"),
    (["--url", "http://127.0.0.1:9"], "--index"),
    (["--url", "ftp://example", "--index", "x"], "--url"),
    (["--url", "http://127.0.0.1:9", "--index", "x", "--timeout", "soon"], "--timeout"),
])
def test_pipe_usage_errors_exit_2(tmp_path: Path, args: list[str], names: str) -> None:
    proc = _pipe(tmp_path, *args, stdin=subprocess.DEVNULL)
    _out, err = _finish(proc, timeout=30)
    assert proc.returncode == 2, err.decode()
    assert names in err.decode()
    assert not (tmp_path / "xdg" / "shipper" / "pipe").exists(), "a usage error must not create state"


def test_pipe_destination_down_exits_1_and_run_delivers_the_rest_once(
        tmp_path: Path, es: ES, fault_proxy: FaultProxy, daemon_factory: Any) -> None:
    state = tmp_path / "pipe-state"
    proc = _pipe(tmp_path, "--url", fault_proxy.url, "--index", INDEX, "--state-dir", str(state), "--timeout", "1s")
    _feed(proc, _lines(range(1000)))
    wait_until(lambda: es.count(INDEX + "*") >= 1000, "the first 1000 piped lines in osmem", timeout_s=20)
    fault_proxy.down()
    _feed(proc, _lines(range(1000, 2000)))
    _out, err = _finish(proc)                        # closes stdin
    text = err.decode()
    assert proc.returncode == 1, text[-3000:]
    assert "stay queued in " + str(state) in text and "shipper run -c CONFIG" in text
    delivered = es.count(INDEX + "*")
    assert delivered < 2000

    # `status --state-dir` needs no config file to show the pipe's queue
    by_dir = subprocess.run([sys.executable, "-m", "shipper", "status", "--state-dir", str(state), "--json"],
                            capture_output=True, env=_env(tmp_path), check=True)
    assert json.loads(by_dir.stdout)["queue"]["events"] > 0

    # the rest is in the queue, durably; `shipper run` with the same state dir drains it
    cfg = write_config(tmp_path, es_url=fault_proxy.url, paths=tmp_path / "no-logs" / "*.log", state_dir=state)
    status = subprocess.run([sys.executable, "-m", "shipper", "status", "-c", str(cfg), "--json"],
                            capture_output=True, env=_env(tmp_path), check=True)
    queued = json.loads(status.stdout)["queue"]["events"]
    assert queued >= 2000 - delivered and queued > 0
    fault_proxy.up()
    d = daemon_factory(cfg)
    d.wait_ready()
    wait_until(lambda: es.count(INDEX + "*") >= 2000, "all 2000 piped lines in osmem", timeout_s=30)
    wait_until(lambda: d.status_json()["queue"]["events"] == 0, "the daemon to drain the pipe's queue", timeout_s=10)
    es.assert_exactly_once(range(2000), index=INDEX + "*")
    assert d.alive
    assert '"path":"-"' not in d.output(), "the daemon must not treat the piped stream as a file to open"
