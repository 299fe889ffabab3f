"""A damaged spool (issue 19): found at open (quick_check, a record that does not decode) with an
error naming the file; `state check` reports it; `state repair` salvages every readable record,
checkpoint and dead letter into a fresh spool, sets the damaged one aside and names what was lost
by file and offset range; a record that does not decode when it is sent is quarantined."""

from __future__ import annotations

import os
import pickle
import random
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from shipper.commands import state as state_cmd
from shipper.errors import SpoolCorruptError, StateDamagedError
from shipper.model import BatchMeta, Checkpoint, DeadLetter
from shipper.spool import Spool, salvage
from shipper.spool.lost import lost_ranges

PATH = "/var/log/app.log"


def _cp(offset: int, inc: str = "inc1", path: str = PATH) -> Checkpoint:
    return Checkpoint(inc, path, 1, 2, 0, "", offset)


def _body(rng: random.Random, n: int) -> bytes:
    return b"".join(b'{"create":{"_index":"x","_id":"i-%d"}}\n{"m":"%s"}\n'
                    % (i, rng.randbytes(300).hex().encode()) for i in range(n))


def _filled(state: Path, batches: int = 80, acked: int = 20) -> dict[int, tuple[int, int]]:
    """A spool as a daemon leaves it: batches of ~30 KB (overflow pages), the first acked, dead
    letters, and checkpoints in their own rows and in batch rows. Returns seq -> range queued."""
    rng = random.Random(19)
    s = Spool(str(state))
    off, ranges = 0, {}
    for _ in range(batches):
        [(m, _)] = s.commit([(_body(rng, 40), 40)], {"inc1": (off, off + 10_000)}, [_cp(off + 10_000)], True)
        ranges[m.seq] = (off, off + 10_000)
        off += 10_000
    s.save_checkpoints([_cp(777, inc="inc2", path="/var/log/other.log")])
    for seq in range(1, acked + 1):
        dead = [DeadLetter("x", "mapper_parsing_exception: bad", 400, b'{"n":%d}' % seq, 1000.0, f"d-{seq}")] \
            if seq % 10 == 0 else []
        s.ack(seq, dead)
        del ranges[seq]
    s.close()
    return ranges


def _garbage(db: str, at: float = 0.5, nbytes: int = 4096) -> None:
    size = os.path.getsize(db)
    with open(db, "r+b") as f:
        f.seek(int(size * at) - nbytes // 2)
        f.write(random.Random(7).randbytes(nbytes))


def test_garbage_in_the_middle_is_found_at_open_and_repaired_with_the_loss_named(tmp_path: Path) -> None:
    ranges = _filled(tmp_path)
    db = salvage.db_path(str(tmp_path))
    _garbage(db)
    with pytest.raises(StateDamagedError) as e:
        salvage.check_at_start(str(tmp_path))
        Spool(str(tmp_path)).close()        # quick_check passed: then the records as they load
    assert e.value.path == db and "shipper state repair" in str(e.value)
    assert e.value.exit_code == 3

    report = salvage.check(str(tmp_path))
    assert report.inspection.damaged
    kept_before = set(report.inspection.batches)
    report = salvage.repair(str(tmp_path), 1_800_000_000.0)
    assert report.repaired and report.aside is not None
    assert os.path.basename(report.aside) == "spool.damaged-20270115T080000Z"
    assert os.path.exists(os.path.join(report.aside, "cache.db"))          # kept as it was
    assert set(report.inspection.batches) == kept_before

    s = Spool(str(tmp_path))                                               # the daemon starts on it
    try:
        assert salvage.quick_check(db) == []
        kept = set(s.pending)
        assert kept and kept <= set(ranges)
        for seq in kept:
            assert s.read_strict(seq) is not None
        assert s.dead_letters == 2
        assert s.checkpoints["inc2"].offset == 777
        # every queued range is either kept or named as lost (or read again from the file)
        named = [(r.start, r.end) for r in report.lost if r.path == PATH]
        for seq, (a, b) in ranges.items():
            if seq in kept:
                continue
            assert any((ra is None or ra <= a) and (rb is None or b <= rb) for ra, rb in named), (seq, a, b, named)
    finally:
        s.close()
    text = state_cmd.render(report, "repair")
    assert "lost:" in text and PATH in text and "offsets" in text and report.aside in text
    assert salvage.check(str(tmp_path)).inspection.damaged is False


def test_the_commands_exit_3_on_damage_and_0_once_repaired(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _filled(tmp_path, batches=40, acked=5)
    _garbage(salvage.db_path(str(tmp_path)))
    assert state_cmd.state("/nonexistent.yaml", "check", str(tmp_path)) == 3
    out = capsys.readouterr().out
    assert "DAMAGED" in out and "shipper state repair" in out
    assert state_cmd.state("/nonexistent.yaml", "repair", str(tmp_path)) == 0
    assert "repaired" in capsys.readouterr().out
    assert state_cmd.state("/nonexistent.yaml", "check", str(tmp_path)) == 0
    assert "sound" in capsys.readouterr().out
    assert state_cmd.state("/nonexistent.yaml", "repair", str(tmp_path)) == 0
    assert "nothing to repair" in capsys.readouterr().out


def test_a_checkpoint_row_that_does_not_unpickle_stops_the_open_naming_the_file(tmp_path: Path) -> None:
    s = Spool(str(tmp_path))
    s.save_checkpoints([_cp(10)])
    s.close()
    con = sqlite3.connect(salvage.db_path(str(tmp_path)))
    con.execute("UPDATE Cache SET value = ? WHERE key = 'c:inc1'", (pickle.dumps({"x": 1})[:-3],))
    con.commit()
    con.close()
    with pytest.raises(SpoolCorruptError, match=r"spool/cache\.db: .*does not decode"):
        Spool(str(tmp_path))
    report = salvage.repair(str(tmp_path), 0.0)
    assert report.lost_checkpoints == ["inc1"]
    Spool(str(tmp_path)).close()


def test_a_record_that_does_not_decode_when_sent_is_quarantined_and_reported(tmp_path: Path) -> None:
    rng = random.Random(1)
    s = Spool(str(tmp_path))
    s.commit([(_body(rng, 5), 5)], {"inc1": (0, 100)}, [_cp(100)], True)
    [(m, _)] = s.commit([(_body(rng, 5), 5)], {"inc1": (100, 200)}, [_cp(200)], True)
    value = s.cache.get(m.seq)
    s.cache.set(m.seq, value[:-40] + bytes(40))
    assert s.read(m.seq) is None                       # never raised into the sender
    assert m.seq not in s.pending and s.quarantined == 1
    s.close()
    s = Spool(str(tmp_path))                           # opens: the bad row is out of the queue
    try:
        assert sorted(s.pending) == [1] and s.quarantined == 1
        assert s.checkpoints["inc1"].offset == 200     # its lines are not read again
        [q] = s.quarantined_items()
        assert q["seq"] == m.seq and q["covers"] == {"inc1": (100, 200)} and "checksum" in q["reason"]
    finally:
        s.close()
    report = salvage.check(str(tmp_path))
    assert not report.inspection.damaged
    assert "quarantined batch 2" in state_cmd.render(report, "check")


def test_lost_ranges_come_from_the_header_or_from_the_neighbours() -> None:
    def meta(seq: int, covers: dict[str, tuple[int, int]]) -> BatchMeta:
        return BatchMeta(seq, 10, 1, 1, True, covers, 0.0)

    good = {1: meta(1, {"a": (0, 100)}), 4: meta(4, {"a": (300, 400)}), 5: meta(5, {"a": (400, 500)}),
            7: meta(7, {"a": (400, 500)}), 9: meta(9, {"a": (600, 700)})}
    lost = {2: None, 3: meta(3, {"a": (200, 300)}), 6: None, 8: None}
    cps = {"a": {"incarnation": "a", "path": "/l/a.log", "offset": 700, "v": 3}}
    got = {(r.start, r.end, r.seqs, r.exact)
           for r in lost_ranges(good, lost, cps, closing=[1, 4, 7, 9])}
    assert got == {(100, 400, (2,), False),        # 1 closed its commit; 4 may end one that 2 began
                   (200, 300, (3,), True),         # its own header
                   (400, 500, (6,), False),        # 5 and 7 are one commit: 6 was of it too
                   (500, 700, (8,), False)}        # 7 closed its commit; up to 9's end
    # a kept batch that does not close its commit: the lost one after it may hold its lines
    [r] = lost_ranges({1: meta(1, {"a": (0, 100)}), 3: meta(3, {"a": (100, 200)})}, {2: None}, cps)
    assert (r.start, r.end) == (0, 200)
    # the newest checkpoint was in the lost record: what it held is read again from the file
    [again] = lost_ranges({7: good[7]}, {8: None}, {"a": {"incarnation": "a", "path": "/l/a.log",
                                                                 "offset": 500, "v": 1}}, closing=[7])
    assert again.reread and again.path == "/l/a.log" and (again.start, again.end) == (500, None)


def test_a_batch_queued_and_acked_while_check_reads_is_no_damage(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`state check` reads beside a running daemon (no lock, read-only): a batch queued after the
    table scan passed its place is named by the index, and acked before its row is looked up. It is
    gone from table and index alike, which is no damage. The interleaving is made exact by running
    the daemon's two writes between check's own steps."""
    state = tmp_path / "state"
    rng = random.Random(3)
    daemon = Spool(str(state))
    try:
        for i in range(3):
            daemon.commit([(_body(rng, 5), 5)], {"inc1": (i * 100, i * 100 + 100)}, [_cp(i * 100 + 100)], True)
        late: list[int] = []
        scan_table, scan_index = salvage._scan_table, salvage._scan_index

        def table_then_queue(con: sqlite3.Connection, problems: list[str]) -> Any:
            got = scan_table(con, problems)
            # no checkpoint on it: its ack is one delete (a settled checkpoint would take its rowid)
            [(m, _)] = daemon.commit([(_body(rng, 5), 5)], {"inc1": (300, 400)}, [], True)
            late.append(m.seq)
            return got

        def index_then_ack(con: sqlite3.Connection) -> Any:
            got = scan_index(con)
            assert any(key == late[0] for key, _raw in got.values())     # the index named it
            daemon.ack(late[0], [])
            return got

        monkeypatch.setattr(salvage, "_scan_table", table_then_queue)
        monkeypatch.setattr(salvage, "_scan_index", index_then_ack)
        report = salvage.check(str(state))
        assert not report.inspection.damaged, (report.inspection.bad, report.inspection.sqlite_problems)
        assert sorted(report.inspection.batches) == [1, 2, 3]
    finally:
        daemon.close()
