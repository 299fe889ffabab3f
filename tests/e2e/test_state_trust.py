"""The state dir is data, whoever wrote it (SPEC, Trust boundaries), with real users and processes.

`nobody` owns a state dir and plants in it what an attacker would: pickles whose unpickling
creates a marker file (in a checkpoint row, a dead letter, a batch row's header, a key), and
symbolic links where shipper's files go (status.json to a root-only secret, lock and
SQLite's -wal to root-only files). Root then runs `shipper status`, `dlq list` and `state
check`, as an admin would with sudo: no marker, no secret printed, no root file written, and a
clear answer naming what was refused. A daemon started with umask 0 makes its state dir 0700
and every file in it 0600, and ships every line once, promptly.
"""

from __future__ import annotations

import os
import pickle
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from shipper.codec import crc32
from shipper.model import Checkpoint, DeadLetter
from shipper.spool import Spool, rows
from tests.support.daemon import REPO_ROOT, Daemon, write_config
from tests.support.es import ES
from tests.support.wait import wait_until
from tests.support.writer import write_lines

NOBODY = 65534

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root: root's commands on another user's state dir")


class Marker:
    """Unpickling it creates the marker file: code run with the rights of whoever unpickles."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)

    def __reduce__(self) -> tuple[Any, ...]:
        return (open, (self.path, "w"))


def chown_tree(top: Path, uid: int) -> None:
    os.chown(top, uid, uid, follow_symlinks=False)
    for root, dirs, files in os.walk(top):
        for n in dirs + files:
            os.chown(os.path.join(root, n), uid, uid, follow_symlinks=False)


def real_state(state: Path) -> None:
    """A spool as this version writes it: a queued batch with its checkpoint, a dead letter."""
    s = Spool(str(state))
    try:
        cp = Checkpoint("inc1", "/var/log/app.log", 1, 2, 16, "ff", 100)
        s.commit([(b'{"create":{"_index":"logs","_id":"x"}}\n{"a":1}\n', 1)], {"inc1": (0, 100)}, [cp], False)
        (m, _), = s.commit([(b'{"create":{"_index":"logs","_id":"y"}}\n{"a":2}\n', 1)], {}, [], False)
        s.ack(m.seq, [DeadLetter("logs", "mapper_parsing_exception: x", 400, b'{"a":2}', 1000.0, "y")])
    finally:
        s.close()


def plant(state: Path, kind: str, marker: Path) -> str:
    """What `nobody` plants (written with diskcache's default Disk, which pickles). Returns the key."""
    import diskcache
    cache = diskcache.Cache(str(state / "spool"), disk_min_file_size=2**30)
    try:
        if kind == "checkpoint":
            cache.set("c:evil", Marker(marker))
            return "c:evil"
        if kind == "dead letter":
            cache.set("d:0000000000000099", {"index": "logs", "document": Marker(marker)})
            return "d:0000000000000099"
        if kind == "batch header":
            meta = pickle.dumps({"e": 1, "r": 1, "g": False, "cv": {}, "at": Marker(marker), "cp": {}}, 5)
            head = rows.HEADER.pack(rows.MAGIC, 1, crc32(b"x"), len(meta))     # version 1: b19ade4's header
            cache.set(77, head + meta + b"x")
            return "77"
        if kind == "key":
            cache.set(Marker(marker), 1)
            return "a key stored as a pickle"
        raise AssertionError(kind)
    finally:
        cache.close()


def shipper(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    return subprocess.run([sys.executable, "-m", "shipper", *args], capture_output=True, text=True, timeout=60,
                          env=env, cwd=str(cwd), check=False)


def config(tmp: Path, state: Path) -> Path:
    cfg = write_config(tmp, es_url="http://127.0.0.1:9", paths=str(tmp / "logs" / "*.log"), state_dir=state,
                       extra_yaml={"metrics": {"listen": None}})
    os.chmod(cfg, 0o600)
    return cfg


@pytest.mark.parametrize("kind", ["checkpoint", "dead letter", "batch header", "key"])
def test_root_commands_on_a_planted_pickle_run_nothing_and_say_what_they_refused(open_tmp: Path, kind: str) -> None:
    state = open_tmp / "state"
    real_state(state)
    marker = open_tmp / "marker"
    key = plant(state, kind, marker)
    chown_tree(state, NOBODY)
    cfg = config(open_tmp, state)
    answers = {"status": shipper("status", "--state-dir", str(state), cwd=open_tmp),
               "status --json": shipper("status", "--json", "-c", str(cfg), cwd=open_tmp),
               "dlq list": shipper("dlq", "list", "-c", str(cfg), cwd=open_tmp),
               "state check": shipper("state", "check", "--state-dir", str(state), cwd=open_tmp)}
    assert not marker.exists(), f"a planted pickle ({kind}) was unpickled"
    for what, p in answers.items():
        out = p.stdout + p.stderr
        assert "Traceback" not in out, (what, out)
    check = answers["state check"]
    assert check.returncode == 3 and "DAMAGED" in check.stdout, check.stdout + check.stderr
    assert key in check.stdout or kind == "key", check.stdout
    refused = "not plain data" if kind != "key" else "a key stored as a pickle"
    assert refused in check.stdout + check.stderr
    if kind == "dead letter":        # status only counts dead letters; the listing decodes them
        assert answers["status"].returncode == 0
        assert answers["dlq list"].returncode == 3 and refused in answers["dlq list"].stderr
    else:
        for what in ("status", "status --json", "dlq list"):
            p = answers[what]
            assert p.returncode == 3 and refused in p.stderr, (what, p.returncode, p.stderr)
    # nothing the commands made in the state dir belongs to root: they acted as its owner
    for root, dirs, files in os.walk(state):
        for n in dirs + files:
            assert os.lstat(os.path.join(root, n)).st_uid == NOBODY, os.path.join(root, n)


def test_root_commands_follow_no_link_in_another_users_state_dir(open_tmp: Path) -> None:
    state = open_tmp / "state"
    real_state(state)
    vault = open_tmp / "vault"                    # root's: 0700, files 0600
    vault.mkdir(mode=0o700)
    secret = vault / "secret.json"
    secret.write_text('{"output": {"last_error": "TOPSECRET-7f3a", "hosts": ["TOPSECRET-7f3a"]}, "mode": "daemon"}')
    precious = {name: vault / name for name in ("lock-target", "wal-target")}
    for f in precious.values():
        f.write_bytes(b"precious root data\n")
    for f in [secret, *precious.values()]:
        os.chmod(f, 0o600)
    chown_tree(state, NOBODY)
    # nobody's links: SQLite's -wal is made anew by the next open, so a link there is what it would open
    for name, target in (("status.json", secret), ("lock", precious["lock-target"])):
        os.symlink(target, state / name)
        os.chown(state / name, NOBODY, NOBODY, follow_symlinks=False)
    os.symlink(precious["wal-target"], state / "spool" / "cache.db-wal")
    os.chown(state / "spool" / "cache.db-wal", NOBODY, NOBODY, follow_symlinks=False)
    cfg = config(open_tmp, state)
    answers = [shipper("status", "--json", "-c", str(cfg), cwd=open_tmp),
               shipper("status", "--state-dir", str(state), cwd=open_tmp),
               shipper("dlq", "list", "-c", str(cfg), cwd=open_tmp),
               shipper("state", "check", "--state-dir", str(state), cwd=open_tmp),
               shipper("state", "repair", "--state-dir", str(state), cwd=open_tmp)]
    for p in answers:
        out = p.stdout + p.stderr
        assert "TOPSECRET" not in out and "Traceback" not in out, out
        assert p.returncode != 0 and "is a symbolic link: not followed" in p.stderr, (p.args, p.returncode, out)
    for f in precious.values():
        assert f.read_bytes() == b"precious root data\n" and f.stat().st_uid == 0, f
    # with the -wal link gone, the reads work: status.json's link is still not followed
    os.unlink(state / "spool" / "cache.db-wal")
    p = shipper("status", "--json", "-c", str(cfg), cwd=open_tmp)
    assert p.returncode == 0 and "TOPSECRET" not in p.stdout + p.stderr, p.stdout + p.stderr
    assert '"dead_letter":1' in p.stdout
    # `state check` reads the spool only (it takes no lock, SPEC: it checks and reports): sound,
    # and the lock's link is not even opened; `state repair` takes the lock and refuses the link
    p = shipper("state", "check", "--state-dir", str(state), cwd=open_tmp)
    assert p.returncode == 0 and "sound" in p.stdout and "TOPSECRET" not in p.stdout + p.stderr, p.stdout + p.stderr
    p = shipper("state", "repair", "--state-dir", str(state), cwd=open_tmp)
    assert "is a symbolic link: not followed" in p.stderr and p.returncode == 1     # the lock
    assert precious["lock-target"].read_bytes() == b"precious root data\n"
    assert (state / "lock").is_symlink() and os.readlink(state / "lock") == str(precious["lock-target"])


def test_root_commands_refuse_a_state_dir_others_may_write(open_tmp: Path) -> None:
    state = open_tmp / "state"
    real_state(state)
    os.chmod(state, 0o777)
    p = shipper("status", "--state-dir", str(state), cwd=open_tmp)
    assert p.returncode == 1 and "writable by users other than its owner (mode 0777)" in p.stderr, p.stderr


def test_a_daemon_started_with_umask_0_keeps_its_state_private(tmp_path: Path, es: ES, daemon_factory: Any) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    write_lines(logs / "app.log", range(50))
    cfg = write_config(tmp_path, es_url=es.url, paths=str(logs / "*.log"))
    state = tmp_path / "state"
    old = os.umask(0)
    try:
        d: Daemon = daemon_factory(cfg)
    finally:
        os.umask(old)
    wait_until(lambda: es.count() >= 50, "50 lines shipped", timeout_s=20)
    write_lines(logs / "app.log", range(50, 60))
    wait_until(lambda: es.count() >= 60, "10 more, promptly", timeout_s=10)
    wait_until(lambda: (state / "status.json").exists() and (state / "spool" / "cache.db-wal").exists(),
               "status.json and the spool's WAL")
    es.assert_exactly_once(range(60))
    assert stat.S_IMODE(state.stat().st_mode) == 0o700
    found = []
    for root, dirs, files in os.walk(state):
        for n in dirs:
            assert stat.S_IMODE(os.lstat(os.path.join(root, n)).st_mode) == 0o700, n
        for n in files:
            found.append(n)
            assert stat.S_IMODE(os.lstat(os.path.join(root, n)).st_mode) == 0o600, n
    assert {"lock", "status.json", "cache.db", "cache.db-wal", "cache.db-shm"} <= set(found), found
    assert d.alive
