"""Trust boundaries end to end (SPEC): the daemon runs as root over a directory `nobody` may write,
and what `nobody` leaves there (links to root-only files and directories, a link into /proc, FIFOs
swapped in by rename, a sparse file, links fanning out) must not make it read what `nobody` could
not, nor block, nor read holes. osmem stands in for Elasticsearch; every written line is checked
exactly once and within a bound of when it was written, and no secret reaches it.

The attacker's files are made as root and handed to `nobody` (chown/lchown), in temp dirs
`nobody` can traverse: what matters to shipper is who owns what it meets.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tests.support import promptness
from tests.support.daemon import REPO_ROOT, Daemon, write_config
from tests.support.es import ES
from tests.support.wait import wait_until
from tests.support.writer import pino_line, write_lines

NOBODY = 65534
INDEX = "trust"
PATTERN = INDEX + "*"
SECRET = "s3cr3t-" + "9f2c41d7"          # what must never reach Elasticsearch
BOUND_S = 20.0                            # a line written reaches Elasticsearch within this

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root: the daemon reads as root, files go to nobody")


def logs_dir(root: Path) -> Path:
    """The watched directory: nobody's, as an application's own log directory is."""
    logs = root / "logs"
    logs.mkdir()
    os.chown(logs, NOBODY, NOBODY)
    return logs


def root_only(root: Path, name: str, text: str) -> Path:
    """A root-only file (0600, in a 0700 directory), as /etc/shadow or a key is."""
    d = root / "root-only"
    d.mkdir(mode=0o700, exist_ok=True)
    p = d / name
    p.write_text(text)
    os.chmod(p, 0o600)
    return p


def link(target: Path | str, at: Path, owner: int) -> None:
    os.symlink(target, at)
    os.lchown(at, owner, owner)


def start(tmp: Path, es: ES, daemon_factory: Any, glob: str, **env: str) -> Daemon:
    cfg = write_config(tmp, es_url=es.url, paths=[glob],
                       extra_yaml={"output": {"elasticsearch": {"index": INDEX}}})
    return daemon_factory(cfg, env=env).wait_ready()


def shipped_within(es: ES, d: Daemon, seqs: list[int], written_at: float) -> None:
    """Every one of `seqs` in Elasticsearch exactly once, BOUND_S at most after `written_at`."""
    wait_until(lambda: es.count(PATTERN) >= len(seqs),
               lambda: f"{len(seqs)} documents (have {es.count(PATTERN)})\n{d.tail(40)}",
               timeout_s=max(0.1, written_at + BOUND_S - time.monotonic()), interval_s=0.1)
    es.assert_exactly_once(seqs, index=PATTERN)


def no_secret(es: ES, d: Daemon) -> None:
    for doc in es.all_docs(PATTERN):
        assert SECRET not in str(doc["_source"]), doc
    assert SECRET not in d.output()


def test_links_proc_and_fifos_are_not_read_while_the_rest_ships(open_tmp: Path, es: ES, daemon_factory: Any) -> None:
    logs = logs_dir(open_tmp)
    link(root_only(open_tmp, "shadow", f"root:{SECRET}:19000:0:99999:7:::\n"), logs / "evil.log", NOBODY)
    (open_tmp / "root-only" / "deep").mkdir(mode=0o700)
    (open_tmp / "root-only" / "deep" / "secret.log").write_text(f'{{"msg":"{SECRET}"}}\n')
    link(open_tmp / "root-only" / "deep", logs / "dir", NOBODY)        # a directory link on the ** walk
    link("/proc/self/environ", logs / "env.log", 0)                    # root's link: owner would follow it
    os.mkfifo(logs / "pipe.log")
    os.chown(logs / "pipe.log", NOBODY, NOBODY)
    pods = open_tmp / "pods"                                           # a runtime's file, root's link to it
    pods.mkdir()
    write_lines(pods / "0.log", range(1000, 1010))
    os.chown(pods / "0.log", NOBODY, NOBODY)
    link(pods / "0.log", logs / "kube.log", 0)
    t0 = time.monotonic()
    write_lines(logs / "app.log", range(0, 20))
    os.chown(logs / "app.log", NOBODY, NOBODY)
    d = start(open_tmp, es, daemon_factory, f"{logs}/**/*.log", SHIPPER_TEST_TOKEN=SECRET)
    expected = list(range(0, 20)) + list(range(1000, 1010))
    wait_until(lambda: es.count(PATTERN) >= len(expected), lambda: d.tail(40), timeout_s=BOUND_S)
    no_secret(es, d)
    shipped_within(es, d, expected, t0)
    # later observable points: a new file (found by a rescan) and more lines, shipped in turn
    for n in range(3):
        t1 = time.monotonic()
        write_lines(logs / f"later{n}.log", range(2000 + 10 * n, 2010 + 10 * n))
        expected += list(range(2000 + 10 * n, 2010 + 10 * n))
        shipped_within(es, d, expected, t1)
    no_secret(es, d)
    not_read = [r for r in log_records(d) if r.get("msg") == "file not read"]
    for name in ("evil.log", "dir"):
        said = [r for r in not_read if r.get("link") == str(logs / name)]
        assert len(said) == 1 and said[0]["rule"] == "symlinks: owner" and said[0]["level"] == "info", (name, said)
    assert [r["reason"] for r in not_read if r["path"] == str(logs / "env.log")] == ["on /proc, /sys or /dev"]
    assert [r["reason"] for r in not_read if r["path"] == str(logs / "pipe.log")] == ["not a regular file (a FIFO)"]
    assert d.alive and d.health() == 200


def log_records(d: Daemon) -> list[dict[str, Any]]:
    out = []
    for line in d.output().splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if isinstance(rec, dict):
            out.append(rec)
    return out


def test_the_rotated_copy_lookup_reads_no_link(open_tmp: Path, es: ES, daemon_factory: Any) -> None:
    """app.log begins as the key file does; it is truncated, and app.log.1 links to the key: the
    copy lookup matched the first bytes and shipped the key's body "from the rotated copy"."""
    logs = logs_dir(open_tmp)
    head = "-----BEGIN OPENSSH PRIVATE KEY-----"
    key = root_only(open_tmp, "id_rsa", f"{head}\n{SECRET}AAAAC3NzaC1lZDI1NTE5\n-----END OPENSSH PRIVATE KEY-----\n")
    app = logs / "app.log"
    app.write_text(head + "\n")
    os.chown(app, NOBODY, NOBODY)
    d = start(open_tmp, es, daemon_factory, f"{logs}/*.log")
    wait_until(lambda: es.count(PATTERN) >= 1, lambda: d.tail(30), timeout_s=BOUND_S)
    link(key, logs / "app.log.1", NOBODY)
    with open(app, "r+b") as f:
        f.truncate(0)
    t0 = time.monotonic()
    with open(app, "ab") as f:
        f.write(b"".join(pino_line(s) for s in range(0, 10)))
    promptness.note_written(b"".join(pino_line(s) for s in range(0, 10)))
    wait_until(lambda: es.count(PATTERN) >= 11, lambda: d.tail(30), timeout_s=BOUND_S)
    assert time.monotonic() - t0 < BOUND_S
    es.assert_exactly_once(list(range(0, 10)), index=PATTERN, allow_extra=True)
    docs = es.all_docs(PATTERN)
    assert len(docs) == 11 and sum(doc["_source"].get("message") == head for doc in docs) == 1
    no_secret(es, d)


def test_a_fifo_renamed_over_a_rotated_name_blocks_nothing(open_tmp: Path, es: ES, daemon_factory: Any) -> None:
    """While FIFOs and empty plain files are swapped in turn (rename, RENAME_EXCHANGE) at app.log.1
    to app.log.5, app.log is truncated again and again (each time its copy is looked for among its
    rotated siblings). A look that stat'ed a plain file and then opened the FIFO blocked a thread for
    good: shipping stopped, /health said ok, SIGTERM no longer ended the process. Shipping goes on,
    /health is ok, and SIGTERM ends it."""
    logs = logs_dir(open_tmp)
    app = logs / "app.log"
    app.write_text("")
    os.chown(app, NOBODY, NOBODY)
    spare = open_tmp / "spare"               # same filesystem, not under the glob
    spare.mkdir()
    pairs = []
    for i in range(1, 6):
        (logs / f"app.log.{i}").write_text("")      # empty: no lines of its own to ship
        os.mkfifo(spare / f"fifo{i}")
        pairs.append((os.fsencode(logs / f"app.log.{i}"), os.fsencode(spare / f"fifo{i}")))
    d = start(open_tmp, es, daemon_factory, f"{logs}/*.log")
    stop = threading.Event()
    libc = ctypes.CDLL(None, use_errno=True)

    def swapper() -> None:
        while not stop.is_set():
            for a, b in pairs:
                if libc.renameat2(AT_FDCWD, a, AT_FDCWD, b, RENAME_EXCHANGE) != 0:
                    raise OSError(ctypes.get_errno(), "renameat2")

    t = threading.Thread(target=swapper, daemon=True)
    t.start()
    expected: list[int] = []
    try:
        for cycle in range(15):
            seqs = list(range(100 * cycle, 100 * cycle + 5))
            t0 = time.monotonic()
            with open(app, "ab") as f:
                f.write(b"".join(pino_line(s) for s in seqs))
            promptness.note_written(b"".join(pino_line(s) for s in seqs))
            expected += seqs
            shipped_within(es, d, expected, t0)
            with open(app, "r+b") as g:
                g.truncate(0)                 # copytruncate's second half: look for the copy
        assert t.is_alive(), "the swaps went on all along"
    finally:
        stop.set()
        t.join()
        for i in range(1, 6):
            _unblock(logs / f"app.log.{i}")
            _unblock(spare / f"fifo{i}")
    assert d.health() == 200
    t0 = time.monotonic()
    with open(app, "ab") as f:
        f.write(b"".join(pino_line(s) for s in range(5000, 5005)))
    promptness.note_written(b"".join(pino_line(s) for s in range(5000, 5005)))
    expected += list(range(5000, 5005))
    shipped_within(es, d, expected, t0)
    d.send(signal.SIGTERM)
    assert d.wait_exit(15.0) == 0


AT_FDCWD, RENAME_EXCHANGE = -100, 2


def _unblock(path: Path) -> None:
    """A reader stuck in open() of a FIFO there gets its writer (so no thread outlives the test)."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
    except OSError:
        return
    os.close(fd)


def _rchar(pid: int) -> int:
    for line in Path(f"/proc/{pid}/io").read_text().splitlines():
        if line.startswith("rchar:"):
            return int(line.split()[1])
    raise AssertionError("no rchar")


def test_holes_of_sparse_files_are_not_read(open_tmp: Path, es: ES, daemon_factory: Any) -> None:
    """A 2 GiB hole between two lines, and one after a line up to the end (truncate -s 2G): both
    lines and the ones written later are shipped once, and the daemon reads a few MiB, not 4 GiB."""
    logs = logs_dir(open_tmp)
    t0 = time.monotonic()
    with open(logs / "holes.log", "wb") as f:
        f.write(pino_line(1))
        f.seek(2 * 1024 ** 3)
        f.write(pino_line(2))
    with open(logs / "tail.log", "wb") as f:
        f.write(pino_line(3))
        f.truncate(2 * 1024 ** 3)
    promptness.note_written(pino_line(1) + pino_line(2) + pino_line(3))
    for p in ("holes.log", "tail.log"):
        os.chown(logs / p, NOBODY, NOBODY)
    d = start(open_tmp, es, daemon_factory, f"{logs}/*.log")
    assert d.pid is not None
    shipped_within(es, d, [1, 2, 3], t0)
    t1 = time.monotonic()
    with open(logs / "holes.log", "ab") as f:
        f.write(pino_line(4))
    with open(logs / "tail.log", "ab") as f:           # after the hole's end
        f.write(pino_line(5))
    promptness.note_written(pino_line(4) + pino_line(5))
    shipped_within(es, d, [1, 2, 3, 4, 5], t1)

    def lags() -> dict[str, int]:
        return {os.path.basename(f["path"]): f["lag_bytes"] for f in d.status_json()["files"]}

    # the holes are no lag: nothing is left to read in either file
    wait_until(lambda: lags() == {"holes.log": 0, "tail.log": 0}, lambda: f"no lag (have {lags()})", timeout_s=BOUND_S)
    read = _rchar(d.pid)
    assert read < 256 * 1024 * 1024, f"the daemon read {read} bytes for 5 lines"
    assert d.alive


def test_check_walks_a_looping_fanning_tree_once_and_says_what_it_will_not_read(
        open_tmp: Path, es: ES) -> None:
    """16 directories each linking to all the others, a link back to the top: glob's walk does not
    end (`shipper check` used it); the scanner lists each directory once."""
    logs = logs_dir(open_tmp)
    names = [f"d{i:02d}" for i in range(16)]
    for n in names:
        (logs / n).mkdir()
        write_lines(logs / n / f"{n}.log", range(1))
    for n in names:
        for m in names:
            if m != n:
                os.symlink(f"../{m}", logs / n / m)
        os.symlink("..", logs / n / "up")
    secret_dir = root_only(open_tmp, "x", "x").parent
    link(secret_dir, logs / "away", NOBODY)
    cfg = write_config(open_tmp, es_url=es.url, paths=[f"{logs}/**/*.log"])
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    try:
        proc = subprocess.run([sys.executable, "-m", "shipper", "check", "-c", str(cfg)], capture_output=True,
                              text=True, timeout=60, env=env)
    except subprocess.TimeoutExpired:
        pytest.fail("shipper check did not end within 60 s on a tree with links fanning out")
    out = proc.stdout
    assert f"{len(names)} file(s)" in out, out
    listed = [ln.strip().split(" ")[0] for ln in out.splitlines() if ln.strip().endswith("bytes)")]
    assert sorted(os.path.realpath(p) for p in listed) == sorted(str(logs / n / f"{n}.log") for n in names)
    assert f"{logs / 'away'}: not read: a symbolic link owned by uid {NOBODY}, its target by uid 0 (symlinks: owner)" \
        in out, out
