"""The spool's layout on a real state dir: a batch is one row that carries its commit's
checkpoints; they move to rows of their own only when an ack would take the newest along. A
state dir written by the previous layout (073664d, the fixture) opens, drains and upgrades in
place; a damaged batch row is named, not guessed at.
"""

from __future__ import annotations

import importlib.util
import os
import sqlite3
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from shipper.codec import decode_body
from shipper.errors import SpoolCorruptError
from shipper.model import Checkpoint, DeadLetter
from shipper.spool import Spool
from shipper.spool.disk import Pickled

OLD_SPOOL = Path(__file__).resolve().parents[1] / "fixtures" / "spool_073664d.py.txt"


def cp(inc: str, offset: int, path: str = "/var/log/a.log", **kw: Any) -> Checkpoint:
    return Checkpoint(inc, path, 1, 100, 16, "fp", offset, **kw)


def body(n: int, tag: str = "x") -> bytes:
    return b"".join(b'{"create":{"_index":"i","_id":"%s-%d"}}\n{"n":%d}\n' % (tag.encode(), i, i) for i in range(n))


def reopen(s: Spool) -> Spool:
    s.close()
    return Spool(str(Path(s.path).parent))


@pytest.fixture
def spool(tmp_path: Path) -> Iterator[Spool]:
    s = Spool(str(tmp_path))
    yield s
    s.close()


def rows(s: Spool) -> list[Any]:
    return list(s.cache.iterkeys())


# ---------------------------------------------------------------- where checkpoints live

def test_an_ack_under_load_is_one_delete_and_the_last_one_keeps_the_checkpoint(spool: Spool) -> None:
    spool.commit([(body(1), 1)], {"a": (0, 100)}, [cp("a", 100)], True)
    spool.commit([(body(1), 1)], {"a": (100, 200)}, [cp("a", 200)], True)
    assert rows(spool) == [1, 2]
    spool.ack(1)                                   # batch 2 carries a newer checkpoint of "a"
    assert rows(spool) == [2]
    s = reopen(spool)
    try:
        assert s.checkpoints["a"].offset == 200 and list(s.pending) == [2]
        s.ack(2)                                   # nothing newer: the checkpoint gets its own row
        assert rows(s) == ["c:a"]
        s = reopen(s)
        assert s.checkpoints["a"].offset == 200 and s.pending == {}
    finally:
        s.close()


def test_an_ack_out_of_order_keeps_the_newest_checkpoint(spool: Spool) -> None:
    spool.commit([(body(1), 1)], {"a": (0, 100)}, [cp("a", 100)], False)
    spool.commit([(body(1), 1)], {"a": (100, 200)}, [cp("a", 200)], False)
    spool.ack(2)                                   # the newest leaves first: its checkpoint stays
    s = reopen(spool)
    try:
        assert s.checkpoints["a"].offset == 200    # not batch 1's older 100
        assert s.shipped_offsets() == {"a": 0}
        s.ack(1)
        assert rows(s) == ["c:a"]
        s = reopen(s)
        assert s.checkpoints["a"].offset == 200 and s.shipped_offsets() == {"a": 200}
    finally:
        s.close()


def test_a_checkpoint_only_commit_outranks_an_older_carried_one(spool: Spool) -> None:
    spool.commit([(body(1), 1)], {"a": (0, 100)}, [cp("a", 100)], False)
    assert spool.commit([], {"a": (100, 150)}, [cp("a", 150)], False) == []       # filtered lines
    s = reopen(spool)
    try:
        assert s.checkpoints["a"].offset == 150
        s.ack(1)                                   # carries 100: not the newest, nothing written
        s = reopen(s)
        assert s.checkpoints["a"].offset == 150
    finally:
        s.close()


def test_a_commit_of_several_batches_carries_its_checkpoints_in_the_last(spool: Spool) -> None:
    out = spool.commit([(body(2, "p"), 2), (body(2, "q"), 2), (body(1, "r"), 1)], {"a": (0, 500), "b": (0, 60)},
                       [cp("a", 500), cp("b", 60, path="/var/log/b.log")], True)
    assert [m.seq for m, _ in out] == [1, 2, 3] and all(m.covers == {"a": (0, 500), "b": (0, 60)} for m, _ in out)
    spool.ack(3)
    assert sorted(rows(spool), key=str) == [1, 2, "c:a", "c:b"]
    spool.ack(1)
    spool.ack(2)
    s = reopen(spool)
    try:
        assert {inc: c.offset for inc, c in s.checkpoints.items()} == {"a": 500, "b": 60}
        assert s.checkpoints["b"].path == "/var/log/b.log" and s.shipped_offsets() == {"a": 500, "b": 60}
    finally:
        s.close()


def test_a_checkpoint_carried_by_a_queued_batch_is_not_forgotten(spool: Spool) -> None:
    spool.commit([(body(1), 1)], {}, [cp("a", 10, finished=True)], False)     # carried, not covered
    assert spool.forget_checkpoints(["a"]) == []
    spool.ack(1)
    assert spool.forget_checkpoints(["a"]) == ["a"]
    s = reopen(spool)
    try:
        assert s.checkpoints == {} and rows(s) == []
    finally:
        s.close()


def test_replace_keeps_what_the_batch_carries(spool: Spool) -> None:
    spool.commit([(body(10), 10)], {"a": (0, 1000)}, [cp("a", 1000)], True)
    new = spool.replace(1, body(2, "rest"), 2, True)
    assert new is not None and new.events == 2 and new.covers == {"a": (0, 1000)}
    s = reopen(spool)
    try:
        assert s.pending[1] == new and s.checkpoints["a"].offset == 1000
        s.ack(1)
        assert reopen(s).checkpoints["a"].offset == 1000
    finally:
        s.close()


def test_contents_is_a_copy(spool: Spool) -> None:
    spool.commit([(body(1), 1)], {"a": (0, 100)}, [cp("a", 100)], False)
    snap = spool.contents()
    snap.checkpoints[0].offset = 999
    spool.commit([(body(1), 1)], {"a": (100, 200)}, [cp("a", 200)], False)
    assert [m.seq for m in snap.pending] == [1] and spool.checkpoints["a"].offset == 200
    assert spool.contents().checkpoints[0].offset == 200
    assert snap.queued_events == 1 and snap.shipped_offsets() == {"a": 0}


def test_the_stored_checkpoint_is_the_one_committed_not_the_callers_object(spool: Spool) -> None:
    mine = cp("a", 100)
    spool.commit([(body(1), 1)], {"a": (0, 100)}, [mine], False)
    mine.offset = 5000                             # the reader goes on with its own copy
    spool.ack(1)                                   # the checkpoint moves to its row now
    assert reopen(spool).checkpoints["a"].offset == 100


def test_a_file_name_that_is_not_utf8_is_kept(spool: Spool) -> None:
    name = os.fsdecode(b"/var/log/caf\xe9.log")          # a surrogate escape, as os.listdir gives it
    spool.commit([(body(1), 1)], {"a": (0, 10)}, [cp("a", 10, path=name)], False)
    assert reopen(spool).checkpoints["a"].path == name


# ---------------------------------------------------------------- damage

def test_a_damaged_body_is_reported_on_read(spool: Spool) -> None:
    spool.commit([(body(3), 3)], {"a": (0, 10)}, [cp("a", 10)], True)
    value = spool.cache.get(1)
    spool.cache.set(1, value[:-10] + bytes(10))    # ten bytes of the gzip body zeroed
    with pytest.raises(SpoolCorruptError, match=r"cache\.db: batch 1: .*checksum"):
        spool.read_strict(1)
    assert spool.read(1) is None                   # the sending path quarantines it (issue 19)
    assert 1 not in spool.pending and spool.quarantined == 1


def test_an_error_that_names_the_disk_is_not_a_full_disk(spool: Spool) -> None:
    """Only SQLITE_FULL is a full disk: "database disk image is malformed" was reported as one."""
    spool.cache._sql("CREATE TRIGGER damaged BEFORE INSERT ON Cache"      # test-only fault injection
                     " BEGIN SELECT RAISE(ABORT, 'database disk image is malformed'); END")
    with pytest.raises(sqlite3.IntegrityError, match="malformed"):
        spool.commit([(body(1), 1)], {}, [], False)


def test_a_damaged_header_stops_the_open_naming_the_file(tmp_path: Path) -> None:
    s = Spool(str(tmp_path))
    s.commit([(body(1), 1)], {}, [], False)
    s.cache.set(2, b"\x00SB\x01" + bytes(8) + b"not json")
    s.close()
    with pytest.raises(SpoolCorruptError) as e:
        Spool(str(tmp_path))
    assert e.value.seq == 2 and e.value.path.endswith("spool/cache.db")


# ---------------------------------------------------------------- the previous layout

def fixture_module(path: Path, name: str) -> ModuleType:
    """An old version's module, from its fixture (our own old code)."""
    spec = importlib.util.spec_from_loader(name, loader=None)
    assert spec is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod                        # dataclasses look their module up
    try:
        exec(compile(path.read_text(), str(path), "exec"), mod.__dict__)  # noqa: S102 (our own old code)
    finally:
        del sys.modules[name]
    return mod


def old_spool_module() -> ModuleType:
    """shipper/spool.py as of 073664d (raw SQL into diskcache's Cache table), from the fixture."""
    return fixture_module(OLD_SPOOL, "spool_073664d")


def test_a_state_dir_of_the_previous_layout_opens_drains_and_upgrades(tmp_path: Path) -> None:
    old_mod = old_spool_module()
    old = old_mod.Spool(str(tmp_path))
    old.commit([(body(3), 3), (body(2, "y"), 2)], {"a": (0, 500)}, [cp("a", 500)], True)          # 1, 2
    old.commit([(body(1, "p"), 1)], {"b": (0, 50)}, [cp("b", 50, path="/var/log/b.log")], False)  # 3
    old.save_checkpoints([cp("c", 70, path="/var/log/c.log", finished=True)])
    old.replace(2, body(1, "y2"), 1, True)
    (dl, _), = old.commit([(body(1, "d"), 1)], {}, [], False)                                       # 4
    old.ack(dl.seq, [DeadLetter("logs", "mapper_parsing_exception: x", 400, b'{"n":"bad"}', 1000.0, "d-0"),
                     DeadLetter("logs", "mapper_parsing_exception: y", 400, b'{"n":"worse"}', 1001.0, "d-1")])
    old_metas = {seq: (m.events, m.raw_bytes, m.stored_bytes, m.gzipped, m.covers, m.at)
                 for seq, m in old.pending.items()}
    old_bodies = {seq: old.read(seq) for seq in old.pending}
    old_items = old.dead_letter_items()
    old.cache.set(99, b"an orphan body")           # a body whose metadata never made it
    old.close()

    s = Spool(str(tmp_path))
    try:
        assert {seq: (m.events, m.raw_bytes, m.stored_bytes, m.gzipped, m.covers, m.at)
                for seq, m in s.pending.items()} == old_metas
        assert {seq: s.read(seq) for seq in s.pending} == old_bodies
        assert decode_body(s.read(2) or b"", True) == body(1, "y2")
        assert {inc: (c.offset, c.path, c.finished) for inc, c in s.checkpoints.items()} == {
            "a": (500, "/var/log/a.log", False), "b": (50, "/var/log/b.log", False), "c": (70, "/var/log/c.log", True)}
        assert s.dead_letters == 2 and s.dead_letter_items() == old_items
        assert 99 not in rows(s) and s.queued_events == 3 + 1 + 1
        assert s.shipped_offsets() == {"a": 0, "b": 0, "c": 70}

        # new batches on top of old ones; old ones acked and replaced in the new layout
        (new, _), = s.commit([(body(1, "n"), 1)], {"a": (500, 600)}, [cp("a", 600)], True)
        assert new.seq == 100                       # after the orphan, as before
        s.ack(1)
        assert "m:1" not in rows(s) and 1 not in rows(s)
        s = reopen(s)
        assert sorted(s.pending) == [2, 3, 100] and s.checkpoints["a"].offset == 600
        s.replace(3, body(1, "p2"), 1, False)
        assert "m:3" not in rows(s)
        s = reopen(s)
        assert s.read(3) == body(1, "p2") and s.pending[3].covers == {"b": (0, 50)}
        for seq in list(s.pending):
            s.ack(seq)
        s.ack(100, [DeadLetter("logs", "again", 400, b"{}", 1002.0, "n-0")])
        s = reopen(s)
        assert s.pending == {} and not [k for k in rows(s) if isinstance(k, int) or k.startswith("m:")]
        assert {inc: c.offset for inc, c in s.checkpoints.items()} == {"a": 600, "b": 50, "c": 70}
        assert [v["id"] for _, v in s.dead_letter_items()] == ["d-0", "d-1", "n-0"]     # numbering goes on
    finally:
        s.close()


def test_the_previous_layout_is_rewritten_once_at_open_and_read_as_it_is_by_a_read_only_view(tmp_path: Path) -> None:
    """A writer rewrites 073664d's two-row batches at open (no write path meets them afterwards);
    metadata whose body is gone is quarantined with its ranges; a read-only view rewrites nothing."""
    from shipper.spool import rows as rows_mod
    old_mod = old_spool_module()
    old = old_mod.Spool(str(tmp_path))
    old.commit([(body(3), 3)], {"a": (0, 300)}, [cp("a", 300)], True)                            # 1
    old.commit([(body(1, "p"), 1)], {"b": (0, 50)}, [cp("b", 50, path="/var/log/b.log")], False)  # 2
    old_bodies = {seq: old.read(seq) for seq in old.pending}
    old.cache.delete(2)                             # metadata without its body
    old.close()

    view = Spool(str(tmp_path), read_only=True)
    try:
        assert view.read(1) == old_bodies[1] and "m:1" in rows(view) and "m:2" in rows(view)
    finally:
        view.close()
    s = Spool(str(tmp_path))
    try:
        assert not [k for k in rows(s) if isinstance(k, str) and k.startswith("m:")]
        assert [k for k in rows(s) if isinstance(k, int)] == [1]
        assert rows_mod.is_batch_row(s.cache.get(1)) and s.read_strict(1) == old_bodies[1]
        assert sorted(s.pending) == [1] and s.quarantined == 1
        [q] = s.quarantined_items()
        assert q["seq"] == 2 and q["covers"] == {"b": (0, 50)} and q["events"] == 1
        assert s.checkpoints["a"].offset == 300 and s.checkpoints["b"].offset == 50
    finally:
        s.close()


# ---------------------------------------------------------------- b19ade4's layout: pickles, read as data

OLD_ROWS = Path(__file__).resolve().parents[1] / "fixtures" / "rows_b19ade4.py.txt"


def b19ade4_rows() -> ModuleType:
    """shipper/spool/rows.py as of b19ade4 (a batch row's metadata pickled), from the fixture."""
    return fixture_module(OLD_ROWS, "rows_b19ade4")


def write_b19ade4_state(state: Path) -> dict[str, Any]:
    """A spool as b19ade4 wrote it: batch rows with pickled metadata, and checkpoints, dead letters
    and a quarantined row that diskcache pickled (its default Disk). Returns what they hold."""
    import diskcache

    from shipper.model import BatchMeta
    old = b19ade4_rows()
    spool = state / "spool"
    spool.mkdir(parents=True)
    cache = diskcache.Cache(str(spool), size_limit=2**62, eviction_policy="none", cull_limit=0, statistics=False,
                            tag_index=False, disk_min_file_size=2**30)
    weird = "/var/log/caf\udce9.log"                # a non-UTF-8 file name, as os.fsdecode gives it
    carried = {"a": dict(cp("a", 500, path=weird).to_dict(), v=3)}
    b1 = body(3)
    cache.set(1, old.pack_batch(BatchMeta(1, 3, len(b1), len(b1), False, {"a": (0, 500)}, 1000.0), carried, b1))
    cache.set("c:b", dict(cp("b", 50, path="/var/log/b.log", finished=True).to_dict(), v=2))
    cache.set("c:a", dict(cp("a", 100).to_dict(), v=1))      # older than the one batch 1 carries
    cache.set("d:0000000000000001", old.dead_letter_value("logs", "mapper_parsing_exception: x", 400,
                                                          b'{"n":"bad"}\n{"x":1}', 1000.0, "d-0"))
    cache.set("n:dlq", 1)
    cache.set("q:0000000000000007", old.quarantine_value(7, "the stored body does not match its checksum",
                                                         b"\x00SB garbage", 999.0))
    cache.close()
    return {"path": weird, "body": b1}


def test_a_state_dir_of_b19ade4s_layout_is_read_as_data_and_drains(tmp_path: Path) -> None:
    old = write_b19ade4_state(tmp_path)
    s = Spool(str(tmp_path))
    try:
        assert {seq: (m.events, m.covers) for seq, m in s.pending.items()} == {1: (3, {"a": (0, 500)})}
        assert s.read(1) == old["body"]
        assert {inc: (c.offset, c.path, c.finished) for inc, c in s.checkpoints.items()} == {
            "a": (500, old["path"], False), "b": (50, "/var/log/b.log", True)}
        [(_k, dl)] = s.dead_letter_items()
        assert (dl["index"], dl["status"], dl["document"], dl["id"]) == ("logs", 400, b'{"n":"bad"}\n{"x":1}', "d-0")
        [q] = s.quarantined_items()
        assert q["seq"] == 7 and q["value"] == b"\x00SB garbage"
        # written anew in this version's layout: the ack moves the carried checkpoint to its own row
        (new, _), = s.commit([(body(1, "n"), 1)], {"b": (50, 60)}, [cp("b", 60, path="/var/log/b.log")], False)
        s.ack(1, [DeadLetter("logs", "again", 400, b"{}", 1002.0, "n-0")])
        s = reopen(s)
        assert s.checkpoints["a"].offset == 500 and s.checkpoints["a"].path == old["path"]
        assert s.checkpoints["b"].offset == 60 and list(s.pending) == [new.seq]
        assert [v["id"] for _, v in s.dead_letter_items()] == ["d-0", "n-0"]
        s.ack(new.seq)
        s = reopen(s)
        assert s.checkpoints["b"].offset == 60 and s.pending == {}
        for key in ("c:a", "c:b", "d:0000000000000002"):
            assert isinstance(s.cache.get(key), bytes), key      # data rows, no pickle
        assert isinstance(s.cache.get("d:0000000000000001"), Pickled)    # untouched: still read as data
    finally:
        s.close()


def test_state_check_names_the_layout_it_found(tmp_path: Path) -> None:
    from shipper.commands.state import render
    from shipper.spool import salvage
    write_b19ade4_state(tmp_path / "old")
    text = render(salvage.check(str(tmp_path / "old")), "check")
    assert "sound" in text and "5 rows with pickled metadata (b19ade4 and earlier)" in text
    assert "read as data (never unpickled)" in text
    s = Spool(str(tmp_path / "new"))
    s.commit([(body(1), 1)], {"a": (0, 100)}, [cp("a", 100)], False)
    s.close()
    text = render(salvage.check(str(tmp_path / "new")), "check")
    assert "layout: 1 data rows (this version)" in text and "pickled" not in text


def test_a_repair_writes_every_row_in_this_versions_layout(tmp_path: Path) -> None:
    from shipper.spool import salvage
    old = write_b19ade4_state(tmp_path)
    ins = salvage.inspect(str(tmp_path))
    fresh = tmp_path / "fresh" / "spool"
    fresh.mkdir(parents=True)
    from shipper.spool.database import open_cache
    cache = open_cache(str(fresh), str(fresh / "cache.db"))
    try:
        with cache.transact():
            for key, value in ins.good_rows():
                cache.set(key, value)
    finally:
        cache.close()
    s = Spool(str(tmp_path / "fresh"))
    try:
        assert s.read(1) == old["body"] and s.checkpoints["a"].path == old["path"]
        assert salvage.inspect(str(tmp_path / "fresh")).layouts == {"data": 5}
    finally:
        s.close()
