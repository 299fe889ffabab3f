"""A full state disk (issue 19) on a real small filesystem: a 3 MiB tmpfs mounted by the test as
the state dir (skipped, with the reason, where mounting is not allowed). Destination down, the
disk fills, reading pauses; the destination comes back and everything is delivered exactly once
while reading resumes by itself; SIGTERM is prompt whatever the disk says.
"""

from __future__ import annotations

import errno
import os
import random
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.daemon import Daemon, write_config
from tests.support.es import ES
from tests.support.proxy import FaultProxy
from tests.support.wait import wait_until
from tests.support.writer import pino_line, write_lines

LINES = 20_000
SHUTDOWN_TIMEOUT_S = 5.0


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    mnt = tmp_path / "state"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m,mode=0755", "tmpfs", str(mnt)],
                       capture_output=True, text=True, check=False)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs for the state dir here: {r.stderr.strip() or r.returncode}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True, check=False)


def _line(seq: int) -> bytes:
    # incompressible padding: 20,000 lines are ~5 MB gzipped, more than the 3 MiB disk holds
    return pino_line(seq, pad=random.Random(seq).randbytes(120).hex())


def _start(tmp_path: Path, url: str, state: Path, daemon_factory: Any) -> tuple[Path, Daemon]:
    logs = tmp_path / "logs"
    logs.mkdir(exist_ok=True)
    cfg = write_config(tmp_path, es_url=url, paths=str(logs / "*.log"), state_dir=state,
                       extra_yaml={"shutdown_timeout": f"{SHUTDOWN_TIMEOUT_S:g}s"})
    d = daemon_factory(cfg)
    d.wait_ready()
    return logs / "app.log", d


def _full(d: Daemon) -> bool:
    assert d.alive, d.tail()
    return d.metric("shipper_state_dir_full") == 1


def _timed_stop(d: Daemon) -> float:
    t0 = time.monotonic()
    assert d.terminate(timeout_s=SHUTDOWN_TIMEOUT_S + 10) == 0, d.tail()
    return time.monotonic() - t0


def test_destination_down_disk_full_destination_back_everything_exactly_once(
        tmp_path: Path, small_fs: Path, es: ES, fault_proxy: FaultProxy, daemon_factory: Any) -> None:
    fault_proxy.down()
    app, d = _start(tmp_path, fault_proxy.url, small_fs, daemon_factory)
    write_lines(app, range(LINES), line_fn=_line)
    wait_until(lambda: _full(d), "shipper_state_dir_full 1", timeout_s=60)
    st = d.status_json()
    # full: the next draft (twice its size, plus the WAL) would not leave the margin free
    assert st["state_dir"]["full"] is True and 0 <= st["state_dir"]["free_bytes"] < 3 << 20, st["state_dir"]
    assert 0 <= d.metric("shipper_state_dir_free_bytes") < 3 << 20
    fault_proxy.up()
    wait_until(lambda: es.count() >= LINES, lambda: f"{LINES} documents (have {es.count()})", timeout_s=180)
    es.assert_exactly_once(range(LINES))
    wait_until(lambda: not _full(d), "shipper_state_dir_full 0 again")
    out = d.output()
    # one warning per episode (an episode ends when the queue drained: 20,000 lines fill this disk
    # more than once), none per retry
    episodes = out.count("state_dir has room again, reading resumes")
    assert 1 <= out.count("state_dir is full: reading paused") <= episodes + 1, out[-3000:]
    assert "spool write failed, retrying" not in out
    assert _timed_stop(d) < SHUTDOWN_TIMEOUT_S + 3


def test_sigterm_on_a_full_disk_is_prompt_and_a_restart_delivers_everything(
        tmp_path: Path, small_fs: Path, es: ES, fault_proxy: FaultProxy, daemon_factory: Any) -> None:
    fault_proxy.down()
    app, d = _start(tmp_path, fault_proxy.url, small_fs, daemon_factory)
    write_lines(app, range(LINES), line_fn=_line)
    wait_until(lambda: _full(d), "shipper_state_dir_full 1", timeout_s=60)
    assert _timed_stop(d) < SHUTDOWN_TIMEOUT_S + 3
    fault_proxy.up()
    d.start()
    d.wait_ready(30)
    wait_until(lambda: es.count() >= LINES, lambda: f"{LINES} documents (have {es.count()})", timeout_s=180)
    es.assert_exactly_once(range(LINES))
    assert _timed_stop(d) < SHUTDOWN_TIMEOUT_S + 3


def _fill(fs: Path) -> Path:
    """Another writer takes every free block of the filesystem.

    Unbuffered writes, halved on ENOSPC down to one byte: a buffered file kept the tail of a
    partial write and raised ENOSPC again from close(), failing the test before it began."""
    filler = fs / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        chunk = 64 * 1024
        while chunk:
            try:
                os.write(fd, bytes(chunk))
            except OSError as e:
                if e.errno != errno.ENOSPC:
                    raise
                chunk //= 2
    finally:
        os.close(fd)
    return filler


def test_a_disk_filled_by_another_writer_a_restart_on_it_and_space_given_back(
        tmp_path: Path, small_fs: Path, es: ES, fault_proxy: FaultProxy, daemon_factory: Any) -> None:
    fault_proxy.down()
    app, d = _start(tmp_path, fault_proxy.url, small_fs, daemon_factory)
    write_lines(app, range(3000), line_fn=_line)
    wait_until(lambda: d.status_json()["queue"]["events"] == 3000, "3000 events queued")
    filler = _fill(small_fs)
    assert (small_fs / "reserve").exists()
    write_lines(app, range(3000, 4000), line_fn=_line)
    wait_until(lambda: _full(d), "shipper_state_dir_full 1", timeout_s=60)
    assert _timed_stop(d) < SHUTDOWN_TIMEOUT_S + 3
    d.start()                                   # starts on a disk with not a block free
    d.wait_ready(30)
    fault_proxy.up()
    wait_until(lambda: es.count() >= 3000, lambda: f"the 3000 queued delivered (have {es.count()})", timeout_s=120)
    filler.unlink()                             # space comes back: reading resumes by itself
    write_lines(app, range(4000, 4500), line_fn=_line)
    wait_until(lambda: es.count() >= 4500, lambda: f"4500 documents (have {es.count()})", timeout_s=120)
    es.assert_exactly_once(range(4500))
    wait_until(lambda: not _full(d), "shipper_state_dir_full 0 again")
    assert (small_fs / "reserve").exists()
    assert _timed_stop(d) < SHUTDOWN_TIMEOUT_S + 3
