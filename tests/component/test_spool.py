"""The spool on a real state dir: records and checkpoints in one transaction, surviving SIGKILL;
ack, replace, dead letters (list, replay, purge), shipped offsets, byte accounting, AsyncSpool.

The kill tests run a real child process that writes the spool and is killed with SIGKILL, then
reopen the spool here, as `shipper run` does after a crash.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import orjson
import pytest

from shipper.codec import decode_body
from shipper.model import Checkpoint, DeadLetter
from shipper.spool import AsyncSpool, Spool
from tests.support.daemon import REPO_ROOT
from tests.support.wait import wait_until


def cp(inc: str, offset: int, path: str = "/var/log/a.log", **kw: object) -> Checkpoint:
    return Checkpoint(inc, path, 1, 100, 16, "fp", offset, **kw)  # type: ignore[arg-type]


def body(n: int, tag: str = "x") -> bytes:
    return b"".join(b'{"create":{"_index":"i","_id":"%s-%d"}}\n{"n":%d}\n' % (tag.encode(), i, i) for i in range(n))


@pytest.fixture
def spool(tmp_path: Path):
    s = Spool(str(tmp_path))
    yield s
    s.close()


def reopen(s: Spool) -> Spool:
    state_dir = os.path.dirname(s.path)
    s.close()
    return Spool(state_dir)


# ---------------------------------------------------------------- commit, reopen, ack

@pytest.mark.parametrize("gzip", [True, False])
def test_commit_stores_records_and_checkpoints_together(tmp_path: Path, gzip: bool) -> None:
    s = Spool(str(tmp_path))
    recs = s.commit([(body(3), 3), (body(2, "y"), 2)], {"inc1": (0, 500)}, [cp("inc1", 500)], gzip)
    assert [m.seq for m, _ in recs] == [1, 2]
    assert decode_body(recs[0][1], gzip) == body(3) and recs[0][0].gzipped is gzip
    assert s.queued_events == 5 and s.queued_bytes == sum(len(st) for _, st in recs)
    s = reopen(s)
    try:
        assert sorted(s.pending) == [1, 2]
        assert s.pending[1].events == 3 and s.pending[1].covers == {"inc1": (0, 500)}
        assert decode_body(s.read(2) or b"", gzip) == body(2, "y")
        assert s.checkpoints["inc1"].offset == 500 and s.checkpoints["inc1"].path == "/var/log/a.log"
        assert s.next_seq == 3
        assert s.shipped_offsets() == {"inc1": 0}
        s.ack(1)
        assert s.shipped_offsets() == {"inc1": 0}             # record 2 covers the same range
        s.ack(2)
        assert s.shipped_offsets() == {"inc1": 500} and s.queued_events == 0
        s = reopen(s)
        assert s.pending == {} and s.read(1) is None and s.checkpoints["inc1"].offset == 500
    finally:
        s.close()


def test_checkpoint_only_commit_stores_no_record(spool: Spool) -> None:
    assert spool.commit([], {"a": (0, 10)}, [cp("a", 10)], True) == []
    assert spool.commit([(b"", 0)], {"a": (10, 20)}, [cp("a", 20)], True) == []
    assert spool.pending == {} and reopen(spool).checkpoints["a"].offset == 20


def test_shipped_offsets_are_the_lowest_unacked_start(spool: Spool) -> None:
    spool.commit([(body(1), 1)], {"a": (0, 100), "b": (50, 80)}, [cp("a", 100), cp("b", 80)], False)
    spool.commit([(body(1), 1)], {"a": (100, 200)}, [cp("a", 200)], False)
    spool.save_checkpoints([cp("c", 70)])
    assert spool.shipped_offsets() == {"a": 0, "b": 50, "c": 70}
    spool.ack(1)
    assert spool.shipped_offsets() == {"a": 100, "b": 80, "c": 70}
    spool.ack(2)
    assert spool.shipped_offsets() == {"a": 200, "b": 80, "c": 70}


def test_forget_and_save_checkpoints(spool: Spool) -> None:
    spool.save_checkpoints([cp("a", 10, finished=True), cp("b", 20)])
    spool.forget_checkpoints(["a", "missing"])
    s = reopen(spool)
    try:
        assert set(s.checkpoints) == {"b"} and s.checkpoints["b"].offset == 20
    finally:
        s.close()


def test_replace_shrinks_a_partly_delivered_record(spool: Spool) -> None:
    (meta, _), = spool.commit([(body(10), 10)], {"a": (0, 1000)}, [cp("a", 1000)], True)
    spool.replace(meta.seq, body(2, "rest"), 2, True)
    assert spool.replace(999, b"", 0, True) is None
    s = reopen(spool)
    try:
        m = s.pending[meta.seq]
        assert m.events == 2 and m.covers == {"a": (0, 1000)}
        assert decode_body(s.read(meta.seq) or b"", True) == body(2, "rest")
        assert s.queued_events == 2
    finally:
        s.close()


def test_an_orphan_body_without_metadata_is_removed_on_open(tmp_path: Path) -> None:
    s = Spool(str(tmp_path))
    s.commit([(body(1), 1)], {"a": (0, 10)}, [cp("a", 10)], False)
    s.cache.set(77, b"orphan")                  # a body whose metadata never made it
    s = reopen(s)
    try:
        assert 77 not in s.pending and s.read(77) is None and sorted(s.pending) == [1]
    finally:
        s.close()


def test_read_only_open_of_a_missing_spool_fails_and_creates_nothing(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        Spool(str(tmp_path / "nothing"), read_only=True)
    assert not (tmp_path / "nothing").exists()


# ---------------------------------------------------------------- dead letters

def test_dead_letters_are_stored_with_the_ack_listed_replayed_and_purged(spool: Spool) -> None:
    (meta, _), = spool.commit([(body(3), 3)], {"a": (0, 300)}, [cp("a", 300)], True)
    dead = [DeadLetter("logs-x", "mapper_parsing_exception: failed to parse [n]", 400, b'{"n":"bad"}', 1000.0, "a-0"),
            DeadLetter("logs-x", "document_parsing_exception: x", 400, b'{"n":"worse"}', 1001.0, "a-100")]
    spool.ack(meta.seq, dead)
    assert spool.dead_letters == 2 and spool.pending == {}
    s = reopen(spool)
    try:
        assert s.dead_letters == 2
        items = s.dead_letter_items()
        assert [v["id"] for _, v in items] == ["a-0", "a-100"]
        assert items[0][1]["reason"].startswith("mapper_parsing_exception") and items[0][1]["status"] == 400
        assert items[0][1]["document"] == b'{"n":"bad"}' and items[0][1]["index"] == "logs-x"

        def make_bodies(docs: list[dict]) -> list[tuple[bytes, int]]:
            return [(b"".join(b'{"create":{"_index":"%s","_id":"%s"}}\n%s\n' % (d["index"].encode(), d["id"].encode(),
                                                                                d["document"]) for d in docs), len(docs))]

        replayed = s.replay_dead_letters(make_bodies, gzip=False)
        assert [m.events for m, _ in replayed] == [2]
        assert s.dead_letters == 0 and s.dead_letter_items() == []
        (seq,) = s.pending
        assert s.pending[seq].events == 2 and s.pending[seq].covers == {}
        assert b'"_id":"a-100"' in (s.read(seq) or b"")
        s = reopen(s)
        assert s.dead_letters == 0 and list(s.pending) == [seq]
        s.ack(seq, [DeadLetter("i", "again", 400, b"{}", 1.0, "z")])
        assert s.purge_dead_letters() == 1 and s.dead_letters == 0
        assert s.replay_dead_letters(make_bodies, gzip=False) == []
        s = reopen(s)
        assert s.dead_letters == 0 and s.pending == {}
    finally:
        s.close()


def test_dead_letter_numbering_continues_after_reopen(spool: Spool) -> None:
    for i in range(3):
        (m, _), = spool.commit([(body(1), 1)], {}, [], False)
        spool.ack(m.seq, [DeadLetter("i", f"r{i}", 400, b"{}", float(i), f"id{i}")])
        spool = reopen(spool)
    try:
        assert [v["reason"] for _, v in spool.dead_letter_items()] == ["r0", "r1", "r2"]
    finally:
        spool.close()


# ---------------------------------------------------------------- AsyncSpool

async def test_async_spool_runs_every_call_on_one_thread(tmp_path: Path) -> None:
    a = await AsyncSpool.open(str(tmp_path))
    seen: set[int] = set()

    def who() -> int:
        seen.add(threading.get_ident())
        return threading.get_ident()

    results = await asyncio.gather(*(a._call(who) for _ in range(20)))
    recs = await asyncio.gather(*(a.commit([(body(1), 1)], {"a": (i, i + 1)}, [cp("a", i + 1)], False)
                                  for i in range(10)))
    assert len(seen) == 1 and threading.get_ident() not in seen and len(set(results)) == 1
    assert sorted(m.seq for r in recs for m, _ in r) == list(range(1, 11))
    await a.close()


async def test_async_spool_checkpoints_the_wal_off_the_spool_thread(tmp_path: Path) -> None:
    """A checkpoint's fdatasync can take seconds on a busy disk: the spool thread never runs one
    (autocheckpoint off on its connection), a second thread copies the WAL into the database."""
    a = await AsyncSpool.open(str(tmp_path), checkpoint_every_s=0.05)
    db = os.path.join(tmp_path, "spool", "cache.db")
    size0 = os.path.getsize(db)
    # test-only look at the spool thread's own connection
    pages = await a._call(lambda: a._spool.cache._sql("PRAGMA wal_autocheckpoint").fetchone()[0])
    assert pages == 0
    for i in range(40):      # ~2.4 MB: under SQLite's own 1000-page autocheckpoint, so only the thread copies it
        await a.commit([(os.urandom(60_000), 1)], {"a": (i, i + 1)}, [cp("a", i + 1)], False)
    await asyncio.to_thread(wait_until, lambda: os.path.getsize(db) > size0 + 2_000_000,
                            "the WAL checkpointed into cache.db by the checkpoint thread")
    await a.close()
    again = Spool(str(tmp_path))
    try:
        assert len(again.pending) == 40 and again.checkpoints["a"].offset == 40
    finally:
        again.close()


# ---------------------------------------------------------------- SIGKILL

CHILD = textwrap.dedent("""
    import os, signal, sys
    from shipper.model import Checkpoint
    from shipper.spool import Spool
    state_dir, mode = sys.argv[1], sys.argv[2]
    s = Spool(state_dir)
    body = b'{"create":{"_index":"i","_id":"k-0"}}\\n{"n":0}\\n'
    if mode == "once":
        s.commit([(body, 1)], {"inc": (0, 4096)}, [Checkpoint("inc", "/l", 1, 2, 16, "fp", 4096)], True)
        os.kill(os.getpid(), signal.SIGKILL)     # right after commit returned: no close, no atexit
    # loop: commit record i covering [i*100, (i+1)*100) and ack record i-3 (drain: every record
    # at once, so each ack moves the checkpoint to its own row), forever, until killed
    i = s.checkpoints["inc"].offset // 100 if "inc" in s.checkpoints else 0
    n = 0
    while True:
        s.commit([(body * (1 + i % 5), 1 + i % 5)], {"inc": (i * 100, (i + 1) * 100)},
                 [Checkpoint("inc", "/l", 1, 2, 16, "fp", (i + 1) * 100)], i % 2 == 0)
        old = [q for q in s.pending if mode == "drain" or q <= s.next_seq - 4]
        for q in old:
            s.ack(q)
        n += 1
        if n == 20:
            print("running", flush=True)
        i += 1
""")


def run_child(state_dir: Path, mode: str) -> subprocess.Popen[str]:
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    return subprocess.Popen([sys.executable, "-c", CHILD, str(state_dir), mode], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_a_commit_that_returned_survives_sigkill(tmp_path: Path) -> None:
    p = run_child(tmp_path, "once")
    _out, err = p.communicate(timeout=60)
    assert p.returncode == -signal.SIGKILL, err
    s = Spool(str(tmp_path))
    try:
        assert list(s.pending) == [1] and s.pending[1].covers == {"inc": (0, 4096)}
        assert s.checkpoints["inc"].offset == 4096
        assert decode_body(s.read(1) or b"", True).startswith(b'{"create"')
    finally:
        s.close()


def test_sigkill_at_random_moments_never_splits_a_record_from_its_checkpoint(tmp_path: Path) -> None:
    """Kill -9 the writer at random instants, reopen each time: the pending records always cover a
    contiguous range that ends exactly at the checkpoint (nothing committed half, nothing lost)."""
    rng = random.Random(1234)
    last_offset = 0
    for _round in range(4):
        p = run_child(tmp_path, "loop")
        try:
            assert p.stdout is not None
            line = p.stdout.readline()                   # it has committed a few records
            assert line.strip() == "running", p.stderr.read() if p.stderr else ""
            time.sleep(rng.uniform(0.0, 0.3))            # not synchronisation: the random instant of the kill
        finally:
            p.kill()
            p.communicate(timeout=30)
        assert p.returncode == -signal.SIGKILL
        s = Spool(str(tmp_path))
        try:
            offset = s.checkpoints["inc"].offset
            assert offset > last_offset
            covers = sorted(m.covers["inc"] for m in s.pending.values())
            assert covers, "the last commits are never all acked"
            assert covers[-1][1] == offset                 # the checkpoint is the newest record's end
            for (a, b), (c, d) in zip(covers, covers[1:]):
                assert b == c, covers                      # no hole between queued records
            for seq, m in s.pending.items():               # every body is there and whole
                raw = decode_body(s.read(seq) or b"", m.gzipped)
                assert raw.count(b"\n") == 2 * m.events and raw.endswith(b"\n")
            last_offset = offset
        finally:
            s.close()


def test_sigkill_while_every_ack_moves_the_checkpoint_to_its_own_row(tmp_path: Path) -> None:
    """The queue drains after every commit, so every ack writes the checkpoint the acked record
    carried: killed at random, the checkpoint is always the end of the newest committed record."""
    rng = random.Random(4321)
    last_offset = 0
    for _round in range(4):
        p = run_child(tmp_path, "drain")
        try:
            assert p.stdout is not None
            line = p.stdout.readline()
            assert line.strip() == "running", p.stderr.read() if p.stderr else ""
            time.sleep(rng.uniform(0.0, 0.3))            # not synchronisation: the random instant of the kill
        finally:
            p.kill()
            p.communicate(timeout=30)
        s = Spool(str(tmp_path))
        try:
            offset = s.checkpoints["inc"].offset
            assert offset > last_offset and offset % 100 == 0
            covers = sorted(m.covers["inc"] for m in s.pending.values())
            assert len(covers) <= 1 and (not covers or covers[0] == (offset - 100, offset))
            last_offset = offset
        finally:
            s.close()


def test_status_can_read_a_spool_another_process_writes(tmp_path: Path) -> None:
    p = run_child(tmp_path, "loop")
    try:
        assert p.stdout is not None and p.stdout.readline().strip() == "running"
        for _ in range(5):
            ro = Spool(str(tmp_path), read_only=True)
            try:
                assert ro.checkpoints["inc"].offset >= 2000 and ro.pending
            finally:
                ro.close()
        assert p.poll() is None, "the writer died while being read"
    finally:
        p.kill()
        p.communicate(timeout=30)
    s = Spool(str(tmp_path))
    try:
        assert s.checkpoints["inc"].offset > 0
    finally:
        s.close()


def test_records_round_trip_through_orjson_covers(spool: Spool) -> None:
    spool.commit([(body(1), 1)], {"x" * 12: (5, 9)}, [cp("x" * 12, 9)], False)
    s = reopen(spool)
    try:
        assert s.pending[1].covers == {"x" * 12: (5, 9)}
        assert orjson.loads(orjson.dumps(s.checkpoints["x" * 12].to_dict()))["offset"] == 9
    finally:
        s.close()


# ---------------------------------------------------------------- temporary files

TEMP_CHILD = textwrap.dedent("""
    import ctypes, os, sys
    from shipper.model import Checkpoint
    from shipper.spool import Spool
    state_dir, tmp, mode = sys.argv[1:]
    libc = ctypes.CDLL(None, use_errno=True)
    fd = libc.inotify_init1(os.O_NONBLOCK)
    assert fd >= 0 and libc.inotify_add_watch(fd, tmp.encode(), 0x100) >= 0    # IN_CREATE
    s = Spool(state_dir)
    if mode == "disk":
        s.cache.reset("sqlite_temp_store", 0)       # SQLite's default: statement journals may spill
    big = os.urandom(300_000)                       # a batch over the 64 KiB spill threshold
    for i in range(3):
        s.commit([(big, 1)], {"inc": (i, i + 1)}, [Checkpoint("inc", "/l", 1, 2, 16, "fp", i + 1)], False)
    s.ack(1)
    s.commit_acking([(big, 1)], {"inc": (3, 4)}, [Checkpoint("inc", "/l", 1, 2, 16, "fp", 4)], False, [2])
    s.close()
    try:
        print(len(os.read(fd, 65536)))
    except BlockingIOError:
        print(0)
""")


@pytest.mark.parametrize("mode, creates", [("memory", False), ("disk", True)])
def test_large_commits_write_no_temporary_file(tmp_path: Path, mode: str, creates: bool) -> None:
    """diskcache's triggers make each set() need a statement journal; over 64 KiB SQLite spilled
    it to a temporary file in $SQLITE_TMPDIR for every large batch (issue 14). The spool keeps
    them in memory; the control run (`disk`, SQLite's default) shows the watch sees them."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT), SQLITE_TMPDIR=str(tmp))
    p = subprocess.run([sys.executable, "-c", TEMP_CHILD, str(tmp_path / "state"), str(tmp), mode],
                       env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert (int(p.stdout) > 0) is creates, p.stdout
    assert list(tmp.iterdir()) == []
