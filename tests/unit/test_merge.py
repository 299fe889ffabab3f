"""The merge rule (ship/merge.py): which waiting records go out as one request when a slot frees
(in order, within bulk_max_events and bulk_max_bytes, one compression), each document's answer
mapped back to its record, the cap a 413 leaves; the outbox's `take_group` on top of it; and the
joined body: one gzip member, whatever the records were."""

from __future__ import annotations

import gzip
import zlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shipper.codec import gzip_compress, join_bodies
from shipper.events import Events
from shipper.model import BatchMeta
from shipper.ship.merge import by_record, split_cap, take_count
from shipper.ship.outbox import Outbox


def meta(seq: int, events: int, raw: int, gzipped: bool = False) -> BatchMeta:
    return BatchMeta(seq, events, raw, raw, gzipped, {"inc": (seq * 100, seq * 100 + 100)})


def test_one_record_waiting_goes_alone() -> None:
    assert take_count([meta(1, 300, 9_000)], 2000, 5 << 20) == 1
    assert take_count([], 2000, 5 << 20) == 0


def test_records_join_up_to_the_event_limit_and_no_further() -> None:
    waiting = [meta(i, 300, 9_000) for i in range(1, 12)]
    assert take_count(waiting, 2000, 5 << 20) == 6           # 6 x 300 = 1800; a 7th would be 2100
    assert take_count(waiting, 1800, 5 << 20) == 6           # exactly at the limit is within it
    assert take_count(waiting, 300, 5 << 20) == 1


def test_records_join_up_to_the_byte_limit() -> None:
    waiting = [meta(i, 10, 400_000) for i in range(1, 30)]
    assert take_count(waiting, 2000, 5 << 20) == 13          # 13 x 400 KB <= 5 MiB < 14 x 400 KB


def test_a_record_over_the_limits_still_goes_alone_first() -> None:
    assert take_count([meta(1, 3000, 9_000), meta(2, 1, 10)], 2000, 5 << 20) == 1
    assert take_count([meta(1, 5, 6 << 20), meta(2, 1, 10)], 2000, 5 << 20) == 1


def test_order_is_kept_a_later_small_record_does_not_jump_a_large_one() -> None:
    waiting = [meta(1, 1000, 100), meta(2, 1500, 100), meta(3, 10, 100)]
    assert take_count(waiting, 2000, 5 << 20) == 1


def test_records_of_another_compression_are_not_joined() -> None:
    waiting = [meta(1, 10, 100, True), meta(2, 10, 100, True), meta(3, 10, 100, False), meta(4, 10, 100, False)]
    assert take_count(waiting, 2000, 5 << 20) == 2
    assert take_count(waiting[2:], 2000, 5 << 20) == 2


@given(st.lists(st.tuples(st.integers(1, 2500), st.integers(1, 1 << 20), st.booleans()), max_size=30),
       st.integers(1, 3000), st.integers(1, 6 << 20))
def test_take_count_is_the_longest_prefix_within_the_limits(recs: list[tuple[int, int, bool]],
                                                             max_events: int, max_bytes: int) -> None:
    waiting = [meta(i + 1, e, b, g) for i, (e, b, g) in enumerate(recs)]
    n = take_count(waiting, max_events, max_bytes)
    assert n == (1 if recs else 0) or n > 1
    if n > 1:
        taken = waiting[:n]
        assert sum(m.events for m in taken) <= max_events
        assert sum(m.raw_bytes for m in taken) <= max_bytes
        assert len({m.gzipped for m in taken}) == 1
    if 0 < n < len(waiting):       # the next one would not fit (or is compressed otherwise)
        nxt = waiting[:n + 1]
        assert (sum(m.events for m in nxt) > max_events or sum(m.raw_bytes for m in nxt) > max_bytes
                or len({m.gzipped for m in nxt}) == 2)


def test_each_documents_answer_goes_back_to_its_record_in_order() -> None:
    # records of 3, 1 and 4 documents: positions 0-2, 3, 4-7
    items = [(7, "h"), (0, "a"), (3, "d"), (2, "c"), (4, "e")]
    assert by_record([3, 1, 4], items) == [["a", "c"], ["d"], ["h", "e"]]
    assert by_record([3, 1, 4], []) == [[], [], []]


def test_a_position_outside_the_request_is_refused() -> None:
    with pytest.raises(ValueError, match="not in a request of 4"):
        by_record([3, 1], [(4, "x")])
    with pytest.raises(ValueError):
        by_record([3, 1], [(-1, "x")])


@given(st.lists(st.integers(1, 50), min_size=1, max_size=10), st.data())
def test_by_record_puts_every_position_in_the_record_that_holds_it(counts: list[int], data: st.DataObject) -> None:
    total = sum(counts)
    positions = data.draw(st.lists(st.integers(0, total - 1), unique=True))
    out = by_record(counts, [(p, p) for p in positions])
    start = 0
    for k, n in enumerate(counts):
        assert out[k] == [p for p in positions if start <= p < start + n]
        start += n


def test_a_413_caps_later_merges_below_half_of_what_failed() -> None:
    assert split_cap(4_000_000, 5 << 20) == 2_000_000
    assert split_cap(4_000_000, 1_000_000) == 1_000_000      # never raised by a larger failure
    assert split_cap(1, 5 << 20) == 1


def test_the_outbox_takes_a_group_as_one_request_slot() -> None:
    ob = Outbox(1 << 30, 4, Events())
    ob.add([(meta(i, 300, 9_000), b"x" * 9_000) for i in range(1, 9)])
    group = ob.take_group(2000, 5 << 20)
    assert [m.seq for m, _ in group] == [1, 2, 3, 4, 5, 6]
    assert ob.in_flight == 1 and len(ob) == 2
    assert ob.take_group(2000, 5 << 20)[0][0].seq == 7 and ob.in_flight == 2
    ob.done()
    ob.done()
    for m, _ in group:            # each record acked on its own
        ob.acked(m, m.events)
    assert ob.queue_events == 2 * 300 and ob.cached_bytes >= 0


def test_joined_gzip_bodies_are_one_member_holding_every_record_in_order() -> None:
    parts = [b'{"create":{}}\n{"n":%d}\n' % i * 50 for i in range(4)]
    joined = join_bodies([gzip_compress(p) for p in parts], True)
    d = zlib.decompressobj(31)
    assert d.decompress(joined) == b"".join(parts)
    assert d.eof and d.unused_data == b""                      # one member: nothing after its end
    assert gzip.decompress(joined) == b"".join(parts)
    assert join_bodies(parts, False) == b"".join(parts)
