"""The spool's rows as data (SPEC, Trust boundaries): this version's rows are JSON and bytes, and
the pickles older versions wrote are read by legacy.read_pickle, which runs nothing: a pickle
that would run code (a global, a call) is refused, whatever its protocol."""

from __future__ import annotations

import dataclasses
import os
import pickle
import pickletools
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shipper.model import BatchMeta, Checkpoint
from shipper.spool import rows
from shipper.spool.disk import Pickled
from shipper.spool.legacy import NotData, read_pickle

scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False),
                    st.text(alphabet=st.characters(codec="utf-8") | st.sampled_from("\udce9\udcff\ud800")),
                    st.binary(max_size=40))
keys = st.one_of(st.text(max_size=10), st.integers())
plain = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.tuples(inner, inner), st.dictionaries(keys, inner, max_size=4)), max_leaves=20)


@settings(max_examples=300, deadline=None)
@given(value=plain, protocol=st.integers(3, pickle.HIGHEST_PROTOCOL))
def test_plain_data_of_any_protocol_reads_back_equal(value: Any, protocol: int) -> None:
    assert read_pickle(pickle.dumps(value, protocol)) == value


def test_the_protocols_before_3_read_back_what_holds_no_bytes() -> None:
    value = {"e": 3, "cv": {"a": (0, 500)}, "at": 1.5, "g": True, "p": "/var/log/caf\udce9.log", "n": None,
             "big": 2**80, "l": [1, [2.5, -3]]}
    for protocol in (0, 1, 2):
        assert read_pickle(pickle.dumps(value, protocol)) == value


class Marker:
    """Unpickling it creates `path` (what a planted row would do with root's rights)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, ...]:
        return (open, (self.path, "w"))


def test_a_pickle_that_would_run_code_is_refused_and_runs_nothing(tmp_path: Path) -> None:
    marker = tmp_path / "marker"
    for protocol in range(pickle.HIGHEST_PROTOCOL + 1):
        for planted in (Marker(str(marker)), {"cp": {"a": Marker(str(marker))}}, [1, (2, Marker(str(marker)))]):
            with pytest.raises(NotData, match="not plain data"):
                read_pickle(pickle.dumps(planted, protocol))
    assert not marker.exists()


@pytest.mark.parametrize("opcode", [b"c", b"\x93", b"R", b"b", b"\x81", b"\x82", b"P", b"Q", b"i", b"o"])
def test_opcodes_that_reach_code_are_refused_wherever_they_stand(opcode: bytes) -> None:
    # GLOBAL, STACK_GLOBAL, REDUCE, BUILD, NEWOBJ, EXT1, PERSID, BINPERSID, INST, OBJ
    names = {op.code.encode("latin-1"): op.name for op in pickletools.opcodes}
    with pytest.raises(NotData):
        read_pickle(b"\x80\x04(" + opcode + b"os\nsystem\n.")
    assert names[opcode]


def test_shared_containers_cannot_make_a_small_pickle_huge() -> None:
    x: list[Any] = []
    for _ in range(12):
        x = [x, x, x, x]            # 4**12 leaves when copied, a few hundred bytes pickled
    data = pickle.dumps(x)
    assert len(data) < 1000
    with pytest.raises(NotData):
        read_pickle(data)


@pytest.mark.parametrize("data", [b"", b"\x80\x05", b"garbage", pickle.dumps({"x": 1})[:-3], b"\x80\x04K\x01K\x02.",
                                  b"\x80\x04h\x05."])
def test_bytes_that_are_not_a_whole_pickle_are_refused(data: bytes) -> None:
    with pytest.raises(NotData):
        read_pickle(data)


# ---------------------------------------------------------------- this version's rows

def test_a_batch_row_is_json_metadata_and_reads_back_with_a_non_utf8_path() -> None:
    weird = "/var/log/caf\udce9.log"
    carried = {"a": {"incarnation": "a", "path": weird, "dev": 1, "inode": 2, "fp_len": 16, "fp": "ff",
                     "offset": 500, "v": 4}}
    meta = BatchMeta(9, 3, 120, 11, True, {"a": (0, 500)}, 1000.5)
    value = rows.pack_batch(meta, carried, b"stored body")
    assert b"pickle" not in value and value[3] == rows.VERSION
    row = rows.unpack_batch(9, value)
    assert row.meta == meta and row.checkpoints == carried
    assert rows.batch_body(row, value) == b"stored body" and rows.layout_of(value) == "data"


def test_a_batch_row_of_b19ade4_reads_as_data() -> None:
    m = pickle.dumps({"e": 2, "r": 10, "g": False, "cv": {"a": (0, 10)}, "at": 5.0, "cp": {}}, 5)
    from shipper.codec import crc32
    value = rows.HEADER.pack(rows.MAGIC, rows.PICKLED_VERSION, crc32(b"body"), len(m)) + m + b"body"
    row = rows.unpack_batch(4, value)
    assert row.meta == BatchMeta(4, 2, 10, 4, False, {"a": (0, 10)}, 5.0) and rows.layout_of(value) == "pickled"
    evil = pickle.dumps(Marker("/nonexistent/x"), 5)
    planted = rows.HEADER.pack(rows.MAGIC, rows.PICKLED_VERSION, crc32(b"body"), len(evil)) + evil + b"body"
    with pytest.raises(rows.BadRow, match="not plain data"):
        rows.unpack_batch(4, planted)


def test_dead_letters_and_quarantined_rows_keep_their_bytes_whole() -> None:
    d = rows.dead_letter_value("logs", "mapper_parsing_exception: \udce9", 400, b'{"a":"x\n"}\n\x00\xff', 1.5, "id-1")
    assert rows.unpack_dead_letter(rows.pack_dead_letter(d)) == d
    q = rows.quarantine_value(7, "checksum", b"\x00SB\x02 half a row\n", 2.0)
    assert rows.unpack_quarantine(rows.pack_quarantine(q)) == q
    assert rows.unpack_dead_letter(Pickled(pickle.dumps(d, 5))) == d


@pytest.mark.parametrize("value", [b"[]", b'{"incarnation": "a"}', b'{"incarnation": 1, "path": "p", "dev": 1, '
                                   b'"inode": 1, "fp_len": 1, "fp": "", "offset": 0}', b"\x80\x05", 5])
def test_a_checkpoint_row_of_the_wrong_shape_is_a_bad_row(value: Any) -> None:
    with pytest.raises(rows.BadRow):
        rows.unpack_checkpoint(value)


def test_a_planted_checkpoint_pickle_is_a_bad_row_and_runs_nothing(tmp_path: Path) -> None:
    marker = tmp_path / "marker"
    with pytest.raises(rows.BadRow, match="not plain data"):
        rows.unpack_checkpoint(Pickled(pickle.dumps({"incarnation": Marker(str(marker))}, 5)))
    assert not marker.exists() and not os.path.exists(str(marker))


def test_a_checkpoints_cuts_read_back_and_a_bad_cut_is_a_bad_row() -> None:
    cp = Checkpoint("inc", "/var/log/app.log", 1, 2, 10, "ab", 100, cuts=(130, 250))
    d = rows.checkpoint_dict(orjson.loads(rows.pack_checkpoint(cp.to_dict())))
    assert Checkpoint.from_dict(d) == cp
    assert "cuts" not in dataclasses.replace(cp, cuts=()).to_dict()       # most files: nothing more stored
    for bad in ([1.5], ["130"], [-1], [True], 7):
        with pytest.raises(rows.BadRow, match="cuts"):
            rows.checkpoint_dict(dict(cp.to_dict(), cuts=bad))


def test_a_cut_record_moves_no_stored_offset_and_cuts_are_kept_above_it() -> None:
    """A multiline cut is stored by a record at offset 0 (sources/base.record_cuts): it keeps the
    stored offset; a copy planned before the cut keeps the cut; cuts at or below the offset go."""
    from shipper.spool.carried import CheckpointBook
    book = CheckpointBook({}, 0, {}, {})
    base = Checkpoint("inc", "/var/log/app.log", 1, 2, 10, "ab", 100)

    def write(cp: Checkpoint) -> Checkpoint:
        stamped = book.stamp([cp])
        book.remember(stamped, None)
        return book.checkpoints["inc"]

    assert write(base).offset == 100
    got = write(dataclasses.replace(base, offset=0, cuts=(130,)))
    assert (got.offset, got.cuts) == (100, (130,))
    got = write(dataclasses.replace(base, offset=120))                     # planned before the cut
    assert (got.offset, got.cuts) == (120, (130,))
    got = write(dataclasses.replace(base, offset=0, cuts=(130, 200)))
    assert (got.offset, got.cuts) == (120, (130, 200))
    got = write(dataclasses.replace(base, offset=130, cuts=(200,)))
    assert (got.offset, got.cuts) == (130, (200,))
    got = write(dataclasses.replace(base, offset=260))
    assert (got.offset, got.cuts) == (260, ())
