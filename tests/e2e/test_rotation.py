"""Rotation and discovery end to end: the daemon as a subprocess, the real logrotate, osmem as
Elasticsearch. Each test ends with one oracle: every written line exactly once (by its `seq`),
and the daemon alive.
"""

from __future__ import annotations

import os
import random
import signal
import threading
import time
from pathlib import Path
from typing import Any, Literal

import pytest

from tests.support import promptness
from tests.support.daemon import Daemon, write_config
from tests.support.es import ES
from tests.support.rotate import logrotate_conf, rotate_rename, run_logrotate
from tests.support.wait import wait_until
from tests.support.writer import Writer, pino_line, write_lines

INDEX = "rot"
PATTERN = INDEX + "*"

pytestmark = pytest.mark.skipif(not os.path.exists("/usr/sbin/logrotate"), reason="logrotate is not installed")


def setup_logs(tmp_path: Path) -> Path:
    logs = tmp_path / "logs"
    logs.mkdir()
    os.chmod(logs, 0o755)        # logrotate refuses group/world-writable directories without su
    return logs


def config(tmp_path: Path, es_url: str, paths: list[Path] | list[str], **extra: Any) -> Path:
    return write_config(tmp_path, es_url=es_url, paths=[str(p) for p in paths], input_extra=extra.pop("input", None),
                        extra_yaml={"output": {"elasticsearch": {"index": INDEX}}, **extra})


def wait_count(es: ES, n: int, daemon: Daemon, timeout_s: float = 30.0) -> None:
    wait_until(lambda: es.count(PATTERN) >= n,
               lambda: f"{n} documents in {INDEX} (have {es.count(PATTERN)})\n{daemon.tail(30)}",
               timeout_s=timeout_s, interval_s=0.2)


def logrotate(tmp_path: Path, log: Path, mode: Literal["create", "copytruncate"] = "create", **kw: Any) -> None:
    run_logrotate(logrotate_conf(log, mode, **kw), tmp_path / "logrotate.state")


def finish(es: ES, d: Daemon, expected: list[int]) -> None:
    wait_count(es, len(expected), d)
    es.assert_exactly_once(expected, index=PATTERN)
    assert d.alive, d.tail()


# ---------------------------------------------------------------- every logrotate mode, running

def test_rename_rotation_under_a_writer(tmp_path: Path, es: ES, osmem_clone: Any, daemon_factory: Any) -> None:
    logs = setup_logs(tmp_path)
    log = logs / "app.log"
    log.touch()
    d = daemon_factory(config(tmp_path, osmem_clone.url, [log])).wait_ready()
    # the app keeps its fd and reopens after the rotation (postrotate's kill -HUP): lines go into
    # the renamed file until then. (A writer that opens by path per batch can recreate app.log
    # between logrotate's rename and create; logrotate then moves it aside as .backup, an error.)
    with Writer(log, rate=400, keep_open=True) as w:
        for _ in range(3):
            wait_until(lambda: w.count >= 150 * (_ + 1), "the writer to write")
            logrotate(tmp_path, log, "create", rotate=5)
            w.reopen()
    finish(es, d, w.written)


def test_copytruncate(tmp_path: Path, es: ES, osmem_clone: Any, daemon_factory: Any) -> None:
    """Lines are written between rotations (never during one: what the app writes between
    logrotate's copy and its truncate is in no file, logrotate's own loss)."""
    logs = setup_logs(tmp_path)
    log = logs / "app.log"
    write_lines(log, range(0, 50))
    d = daemon_factory(config(tmp_path, osmem_clone.url, [log])).wait_ready()
    wait_count(es, 50, d)                            # the daemon knows the file before it rotates
    seq = 50
    for _ in range(4):
        write_lines(log, range(seq, seq + 150))
        seq += 150
        logrotate(tmp_path, log, "copytruncate", rotate=5)
    write_lines(log, range(seq, seq + 50))
    seq += 50
    finish(es, d, list(range(seq)))


def test_copytruncate_while_the_shipper_is_stopped(tmp_path: Path, es: ES, osmem_clone: Any,
                                                   daemon_factory: Any) -> None:
    """SIGSTOP across the truncation: the unread range exists only in the copy logrotate made."""
    logs = setup_logs(tmp_path)
    log = logs / "app.log"
    write_lines(log, range(0, 200))
    d = daemon_factory(config(tmp_path, osmem_clone.url, [log])).wait_ready()
    wait_count(es, 200, d)
    assert d.pid is not None
    os.kill(d.pid, signal.SIGSTOP)
    try:
        write_lines(log, range(200, 500))            # unread when the file is truncated
        logrotate(tmp_path, log, "copytruncate", rotate=5)
        write_lines(log, range(500, 600))            # the file goes on from 0
    finally:
        os.kill(d.pid, signal.SIGCONT)
    finish(es, d, list(range(600)))
    assert "reading the rest from a rotated copy" in d.output()


def test_delaycompress_and_compress_while_running(tmp_path: Path, es: ES, osmem_clone: Any,
                                                 daemon_factory: Any) -> None:
    """The glob matches the rotated names too (app.log*): app.log.1 and app.log.2.gz are copies of
    what was shipped, recognised by content, not shipped again. With compress, a scan may see
    app.log.1.gz while gzip is still writing it (empty): set aside, not a new file."""
    logs = setup_logs(tmp_path)
    log = logs / "app.log"
    write_lines(log, range(0, 50))
    d = daemon_factory(config(tmp_path, osmem_clone.url, [str(logs / "app.log*")])).wait_ready()
    wait_count(es, 50, d)
    seq = 50
    for _ in range(4):
        write_lines(log, range(seq, seq + 100))
        seq += 100
        logrotate(tmp_path, log, "create", compress=True, delaycompress=True, rotate=5)
    assert (logs / "app.log.3.gz").exists()
    write_lines(log, range(seq, seq + 50))
    seq += 50
    finish(es, d, list(range(seq)))
    # and compress without delay: the renamed file is gzipped and unlinked at once; the open fd reads on
    write_lines(log, range(seq, seq + 100))
    logrotate(tmp_path, log, "create", compress=True, rotate=5)
    write_lines(log, range(seq + 100, seq + 150))
    finish(es, d, list(range(seq + 150)))


def test_stopped_across_two_rotations_one_compressed(tmp_path: Path, es: ES, osmem_clone: Any,
                                                     daemon_factory: Any) -> None:
    logs = setup_logs(tmp_path)
    log = logs / "app.log"
    write_lines(log, range(0, 200))
    d = daemon_factory(config(tmp_path, osmem_clone.url, [log])).wait_ready()
    wait_count(es, 200, d)
    assert d.terminate() == 0
    write_lines(log, range(200, 300))                 # the rest of the file we had checkpointed
    logrotate(tmp_path, log, "create", compress=True, delaycompress=True, rotate=5)
    write_lines(log, range(300, 450))                 # a file the daemon never saw, now app.log.1
    logrotate(tmp_path, log, "create", compress=True, delaycompress=True, rotate=5)
    write_lines(log, range(450, 500))
    assert (logs / "app.log.2.gz").exists() and (logs / "app.log.1").exists()
    d.start().wait_ready()
    finish(es, d, list(range(500)))


def test_inode_reuse_while_stopped(tmp_path: Path, es: ES, osmem_clone: Any, daemon_factory: Any) -> None:
    """Recreated at midnight on the same inode, already larger than the old offset: the first bytes
    say it is another file. First deleted and recreated (ext4 mostly hands out the inode just freed),
    then rewritten in place (the same inode for sure)."""
    logs = setup_logs(tmp_path)
    log = logs / "app.log"
    write_lines(log, range(0, 100))
    d = daemon_factory(config(tmp_path, osmem_clone.url, [log])).wait_ready()
    wait_count(es, 100, d)
    assert d.terminate() == 0
    ino, size = log.stat().st_ino, log.stat().st_size
    log.unlink()
    write_lines(log, range(1000, 1300))
    assert log.stat().st_size > size
    d.start().wait_ready()
    wait_count(es, 400, d)
    assert d.terminate() == 0
    ino, size = log.stat().st_ino, log.stat().st_size
    data = b"".join(pino_line(s) for s in range(2000, 2400))
    log.write_bytes(data)                                                   # O_TRUNC: same inode
    promptness.note_written(data)
    assert log.stat().st_ino == ino and log.stat().st_size > size
    d.start().wait_ready()
    finish(es, d, [*range(0, 100), *range(1000, 1300), *range(2000, 2400)])


# ---------------------------------------------------------------- discovery at scale

def test_two_thousand_files_and_one_more(tmp_path: Path, es: ES, osmem_clone: Any, daemon_factory: Any) -> None:
    logs = setup_logs(tmp_path)
    for i in range(2000):
        sub = logs / f"svc{i % 40:02d}" / f"node{i % 7}"
        sub.mkdir(parents=True, exist_ok=True)
        write_lines(sub / f"f{i:04d}.log", [i])
    d = daemon_factory(config(tmp_path, osmem_clone.url, [str(logs / "**" / "*.log")],
                              input={"scan_interval": "60s"})).wait_ready()
    wait_count(es, 2000, d, timeout_s=60)
    # a directory that appears later under ** is watched, and its file found through inotify
    late_dir = logs / "late" / "deeper"
    late_dir.mkdir(parents=True)
    t0 = time.monotonic()
    write_lines(late_dir / "new.log", [5000])
    wait_count(es, 2001, d, timeout_s=10)
    assert time.monotonic() - t0 < 2.0, "a new file is found within ~1 s, not at the next 60 s rescan"
    finish(es, d, [*range(2000), 5000])


def test_max_open_files_over_many_active_files(tmp_path: Path, es: ES, osmem_clone: Any, daemon_factory: Any) -> None:
    logs = setup_logs(tmp_path)
    files = [logs / f"f{i:03d}.log" for i in range(500)]
    cfg = config(tmp_path, osmem_clone.url, [str(logs / "*.log")], max_open_files=50)
    d = daemon_factory(cfg).wait_ready()
    peak = 0

    def open_log_fds() -> int:
        n = 0
        for fd in os.listdir(f"/proc/{d.pid}/fd"):
            try:
                if os.readlink(f"/proc/{d.pid}/fd/{fd}").startswith(str(logs)):
                    n += 1
            except OSError:
                pass
        return n

    expected = []
    for r in range(3):
        for i, f in enumerate(files):
            seq = r * 1000 + i
            write_lines(f, [seq])
            expected.append(seq)
        deadline = time.monotonic() + 30
        while es.count(PATTERN) < len(expected) and time.monotonic() < deadline:
            peak = max(peak, open_log_fds())
            time.sleep(0.05)
    finish(es, d, expected)
    assert 0 < peak <= 50, peak


def test_checkpoints_of_removed_files_are_cleaned(tmp_path: Path, es: ES, osmem_clone: Any,
                                                  daemon_factory: Any) -> None:
    logs = setup_logs(tmp_path)
    for i in range(20):
        write_lines(logs / f"f{i:02d}.log", [i])
    d = daemon_factory(config(tmp_path, osmem_clone.url, [str(logs / "*.log")], clean_removed_after="1s",
                              input={"close_inactive": "1s"})).wait_ready()
    wait_count(es, 20, d)
    for i in range(15):
        (logs / f"f{i:02d}.log").unlink()
    rotate_rename(logs / "f15.log")                    # its content lives on beside it: kept

    from shipper.spool import Spool

    def checkpoint_names() -> set[str]:
        sp = Spool(str(tmp_path / "state"), read_only=True)
        try:
            return {Path(cp.path).name for cp in sp.checkpoints.values()}
        finally:
            sp.close()

    wait_until(lambda: not any(f"f{i:02d}.log" in checkpoint_names() for i in range(15)),
               lambda: f"checkpoints of removed files forgotten (have {sorted(checkpoint_names())})", timeout_s=20)
    names = checkpoint_names()
    assert {f"f{i:02d}.log" for i in range(15, 20)} <= names
    write_lines(logs / "f19.log", [19_000])
    finish(es, d, [*range(20), 19_000])


# ---------------------------------------------------------------- kill -9 while rotating

def test_a_file_opened_empty_is_known_in_its_gz_after_a_kill9(tmp_path: Path, es: ES, osmem_clone: Any,
                                                              daemon_factory: Any) -> None:
    """logrotate `create` makes app.log empty and shipper opens it before the app writes: its
    incarnation's start is stored with an empty file's fingerprint, which names nothing. The app
    writes 300 lines, they are acked, and shipper is killed before the keeper writes the checkpoint
    the acks moved (10 s at this rate). logrotate compresses the file while shipper is down. At the
    restart the .gz must be known as that incarnation by its first bytes, not shipped again as a
    file no one saw (300 lines twice before the incarnation was stored with its first bytes)."""
    logs = setup_logs(tmp_path)
    log = logs / "app.log"
    write_lines(log, range(50))
    d = daemon_factory(config(tmp_path, osmem_clone.url, [log])).wait_ready()
    wait_count(es, 50, d)
    logrotate(tmp_path, log, rotate=10, compress=True)
    ino = log.stat().st_ino
    wait_until(lambda: any("file opened" in ln and f'"inode":{ino},' in ln for ln in d.output().splitlines()),
               lambda: f"the daemon to open the new, empty app.log (inode {ino})\n{d.tail(20)}")
    write_lines(log, range(50, 350))
    wait_count(es, 350, d)
    d.kill9()
    logrotate(tmp_path, log, rotate=10, compress=True)
    d.start().wait_ready()
    write_lines(log, range(350, 360))            # a later point: the restart's looks are done once these are in
    finish(es, d, list(range(360)))


@pytest.mark.parametrize("mode", ["create", "copytruncate", "delaycompress", "compress"])
def test_kill9_while_rotating_in_every_mode(tmp_path: Path, es: ES, osmem_clone: Any, daemon_factory: Any,
                                            mode: str) -> None:
    """The real logrotate runs while a writer appends and the daemon ships (events in flight from
    memory with the default queue.spool), and the daemon is killed at a random instant of the
    rotation, four times. The glob names only app.log: after the restart the rest of what was
    rotated away is found by content (app.log.1, or app.log.1.gz with compress) and read from its
    checkpoint, nothing twice. The writer pauses while logrotate runs (for copytruncate, lines
    written between its copy and its truncate are in no file: logrotate's own loss, SPEC)."""
    logs = setup_logs(tmp_path)
    log = logs / "app.log"
    rng = random.Random(int(os.environ.get("ROTATION_KILL_SEED", "46")) + len(mode))
    d = daemon_factory(config(tmp_path, osmem_clone.url, [log], output={"elasticsearch": {
        "index": INDEX, "bulk_max_events": 100}})).wait_ready()
    modes: dict[str, dict[str, Any]] = {"create": {}, "copytruncate": {"mode": "copytruncate"},
                                        "delaycompress": {"compress": True, "delaycompress": True},
                                        "compress": {"compress": True}}
    kw = modes[mode]
    with Writer(log, rate=400) as w:
        for _ in range(4):
            n, before = w.count, es.count(PATTERN)
            wait_until(lambda: w.count >= n + 150, "150 lines in the current file")
            wait_until(lambda: es.count(PATTERN) > before, lambda: f"shipping since the last kill\n{d.tail(20)}",
                       timeout_s=30, interval_s=0.05)
            w.pause()

            def rotate_then_resume() -> None:
                try:
                    logrotate(tmp_path, log, rotate=10, **kw)
                finally:
                    w.resume()

            t = threading.Thread(target=rotate_then_resume)
            t.start()
            # not synchronisation: a random instant of the rotation (logrotate itself takes ~10 ms)
            time.sleep(rng.uniform(0.0, rng.choice((0.03, 0.3))))
            d.kill9()
            t.join(30)
            assert not t.is_alive(), "logrotate did not finish"
            d.start().wait_ready()
        n = w.count
        wait_until(lambda: w.count >= n + 100, "lines in the newest file")
    written = w.written
    assert len(list(logs.glob("app.log.*"))) == 4
    wait_count(es, len(written), d, timeout_s=60)
    es.assert_exactly_once(written, index=PATTERN)
    assert d.alive and "Traceback" not in d.output(), d.tail(40)
