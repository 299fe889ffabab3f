"""kill -9 after a multiline group was cut by its timeout, step by step on real files: the reading
side of a real pipeline (tests/support/pipeline_rig.py) dropped where it stands, with the keeper's
timer not fired (the checkpoint the acks moved not written), then a new pipeline on the same spool.

A group G is read, nothing follows for `timeout`, so it goes as one event (its `_id` from its first
line's offset) and is acknowledged. A continuation line L (no start match) is written after the
timeout: its own event. After the restart the file is read again from the stored checkpoint, at or
before G: G and L are read together. If they were grouped as one event, it would carry G's `_id`,
Elasticsearch would answer 409 (that `_id` holds G alone) and L's text would be in no document.
Each line's text must be in exactly one document as Elasticsearch keeps them (the first of an `_id`),
and each event must go within its timeout of its last line's write."""

from __future__ import annotations

from pathlib import Path

from shipper.config import MultilineConfig
from tests.support.container_writer import RuntimeLog, cri_pieces, ticks
from tests.support.pipeline_rig import Rig, RigFactory

TIMEOUT_S = 1.0
ML = MultilineConfig(start=r"^\S", timeout_s=TIMEOUT_S)


def _texts(rig: Rig) -> list[str]:
    return [str(d.get("message", "")) for d in rig.kept.values()]


def _in_exactly_one(rig: Rig, lines: list[str]) -> None:
    texts = _texts(rig)
    for line in lines:
        n = sum(1 for t in texts if line in t.split("\n"))
        assert n == 1, f"{line!r} is in {n} documents as Elasticsearch keeps them: {texts}"
    for doc_id in rig.dup_ids:                   # a re-send (409) carries the text it was sent with
        assert rig.docs[doc_id]["message"] == rig.kept[doc_id]["message"], \
            f"{doc_id} re-sent as {rig.docs[doc_id]['message']!r}, indexed as {rig.kept[doc_id]['message']!r}"


async def _ship_g_then_late_l(rig: Rig, app: Path, *, l_shipped: bool) -> None:
    rig.flush_acked = False                      # the keeper's timer has not written what acks moved
    with open(app, "ab") as f:
        f.write(b"G start\n  g continued\n")
    await rig.step()
    assert not rig.kept                          # held: the group may go on
    await rig.step(advance_s=TIMEOUT_S)          # quiet for `timeout`: cut, shipped, acked
    assert _texts(rig) == ["G start\n  g continued"]
    with open(app, "ab") as f:
        f.write(b"  late continuation\n")
    await rig.step()
    if l_shipped:
        await rig.step(advance_s=TIMEOUT_S)      # L alone, quiet for `timeout`: its own event
        assert sorted(_texts(rig)) == ["  late continuation", "G start\n  g continued"]


async def test_a_late_continuation_shipped_alone_is_not_lost_after_a_kill(make_rig: RigFactory, tmp_path: Path) -> None:
    rig = make_rig(input_multiline=ML)
    app = tmp_path / "logs" / "app.log"
    await _ship_g_then_late_l(rig, app, l_shipped=True)
    await rig.kill()
    rig.flush_acked = True
    await rig.step()
    await rig.settle(steps=2, advance_s=TIMEOUT_S)
    _in_exactly_one(rig, ["G start", "  g continued", "  late continuation"])


async def test_a_late_continuation_held_at_the_kill_is_not_lost(make_rig: RigFactory, tmp_path: Path) -> None:
    rig = make_rig(input_multiline=ML)
    app = tmp_path / "logs" / "app.log"
    await _ship_g_then_late_l(rig, app, l_shipped=False)
    await rig.kill()                             # L held in memory, not sent
    rig.flush_acked = True
    await rig.step()
    await rig.step(advance_s=TIMEOUT_S)          # within its timeout of the re-read
    _in_exactly_one(rig, ["G start", "  g continued", "  late continuation"])


async def test_a_cut_in_one_stream_of_a_container_log_is_kept_per_stream(make_rig: RigFactory, tmp_path: Path) -> None:
    """CRI, multiline per stream after the join: stderr's G cut by its timeout, then a stdout event
    and stderr's late continuation interleaved; kill -9 with the continuation held. The re-read
    cuts stderr's G where it was cut (the cut names G's end, not a position both streams pass)."""
    clock = ticks()
    w = RuntimeLog(tmp_path / "logs" / "app.log")
    rig = make_rig(input_format="cri", input_multiline=ML)
    rig.flush_acked = False
    w.write_records([r for ln in (b"G start", b"  g continued") for r in cri_pieces(ln, "stderr", next(clock))])
    await rig.step()
    await rig.step(advance_s=TIMEOUT_S)
    assert _texts(rig) == ["G start\n  g continued"]
    w.write_records(cri_pieces(b"S start", "stdout", next(clock)) + cri_pieces(b"  late continuation", "stderr",
                                                                              next(clock)))
    await rig.step()
    await rig.kill()
    rig.flush_acked = True
    await rig.step()
    await rig.step(advance_s=TIMEOUT_S)
    _in_exactly_one(rig, ["G start", "  g continued", "S start", "  late continuation"])
    w.close()
