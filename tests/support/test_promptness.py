"""The promptness oracle on its own: the measure (daemon runs, outages), what it fails on, the seq
scan of written bytes, and the recording proxy against a real osmem clone."""

from __future__ import annotations

import gzip
import json
import threading
from typing import Any

import pytest

from tests.support import promptness
from tests.support.container_writer import cri_pieces, docker_pieces
from tests.support.es import ES
from tests.support.journal import export_entry
from tests.support.promptness import Timeline, seqs_in
from tests.support.proxy import RecordingProxy
from tests.support.writer import pino_line


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def hit(seq: int, doc_id: str | None = None) -> dict[str, Any]:
    return {"_id": doc_id or f"id-{seq}", "_index": "i", "_source": {"seq": seq}}


def test_without_a_daemon_latency_is_arrival_minus_write() -> None:
    tl = Timeline(Clock())
    assert tl.latency(10.0, 13.5) == 3.5


def test_time_without_a_daemon_and_outages_do_not_count() -> None:
    clock = Clock()
    tl = Timeline(clock)
    d = object()
    tl.serving(d, at=110.0)          # written at 100, before the start: counts from 110
    assert tl.latency(100.0, 112.0) == 2.0
    tl.not_serving(d, at=120.0)      # killed at 120, started again at 130
    tl.serving(d, at=130.0)
    assert tl.latency(118.0, 131.0) == 3.0
    tl.outage_begins("down", at=140.0)
    tl.outage_ends("down", at=150.0)
    assert tl.latency(139.0, 151.5) == 2.5
    tl.outage_begins("blocked", at=160.0)          # not over yet: nothing after 160 counts
    assert tl.latency(158.0, 500.0) == 2.0
    other = object()                                # a second daemon running covers the first's gap
    tl.serving(other, at=119.0)
    tl.not_serving(other, at=125.0)
    assert tl.latency(118.0, 131.0) == 8.0


def test_a_stall_fails_and_names_the_slowest_line() -> None:
    tl = Timeline(Clock())
    tl.wrote([1, 2, 3], at=100.0)
    tl.acked(["id-1", "id-2"], 100.5, at=101.0)
    tl.acked(["id-3"], 120.0, at=120.2)
    tl.assert_prompt([hit(1), hit(2)], bound_s=5)
    with pytest.raises(AssertionError, match=r"1 waited longer than 5s in shipper, slowest: 3 \(id-3\) 19\.0s "
                                             r"\(arrived 20\.2s after its write\)"):
        tl.assert_prompt([hit(1), hit(2), hit(3)], bound_s=5)


def test_a_backlog_may_drain_at_the_destination_s_pace_but_never_pause() -> None:
    tl = Timeline(Clock())
    tl.wrote(range(40), at=100.0)
    for k in range(4):                     # ten lines a request, each request 4 s inside Elasticsearch
        tl.acked([f"id-{i}" for i in range(k * 10, k * 10 + 10)], 100.5 + 4.2 * k, at=104.5 + 4.2 * k)
    tl.assert_prompt([hit(i) for i in range(40)], bound_s=1)
    tl.wrote([40], at=100.0)               # one more line of that write, sent 6 s after the last answer
    tl.acked(["id-40"], 123.1, at=123.4)
    with pytest.raises(AssertionError, match=r"1 waited longer than 5s in shipper, slowest: 40 \(id-40\) 6\.0s"):
        tl.assert_prompt([hit(i) for i in range(41)], bound_s=5)


def test_the_destination_s_own_time_is_not_shipper_s() -> None:
    tl = Timeline(Clock())
    tl.wrote([1], at=100.0)
    tl.acked(["id-1"], 100.3, at=130.0)    # Elasticsearch took 30 s to answer
    tl.assert_prompt([hit(1)], bound_s=1)


def test_a_line_nobody_wrote_or_nobody_saw_arrive_fails() -> None:
    tl = Timeline(Clock())
    tl.wrote([1], at=100.0)
    with pytest.raises(AssertionError, match="1 were never seen created"):
        tl.assert_prompt([hit(1)])
    tl.acked(["id-2"], 100.5, at=101.0)
    with pytest.raises(AssertionError, match="1 have no write time"):
        tl.assert_prompt([hit(2)])
    tl.assert_prompt([hit(2)], written={2: 99.0})
    tl.assert_prompt([hit(2)], written=lambda d: 100.0)


def test_the_first_write_of_a_key_is_the_one_measured() -> None:
    tl = Timeline(Clock())
    tl.wrote([7], at=100.0)
    tl.wrote([7], at=119.0)
    tl.acked(["id-7"], 119.5, at=120.0)
    with pytest.raises(AssertionError, match="waited longer"):
        tl.assert_prompt([hit(7)])


def test_seqs_are_found_in_every_writer_s_bytes() -> None:
    assert seqs_in(pino_line(5) + pino_line(-1)) == [5, -1]
    assert seqs_in(b'{"seq": 3000, "msg": "no trailing newline"}') == [3000]
    assert seqs_in(b"".join(docker_pieces(pino_line(9).rstrip(b"\n"), "stdout", 0))) == [9]
    assert seqs_in(b"".join(cri_pieces(pino_line(11).rstrip(b"\n"), "stdout", 0))) == [11]
    assert seqs_in(export_entry([("MESSAGE", '{"level":30,"seq":12}'), ("_PID", 1)])) == [12]


def test_note_written_reports_to_the_active_timeline_only() -> None:
    outside = Timeline(Clock())
    promptness.note_written(pino_line(1))
    with promptness.active(outside) as tl:
        promptness.note_written(pino_line(2))
    promptness.note_written(pino_line(3))
    assert set(tl.written) == {2}


def test_the_recording_proxy_notes_created_items_only(osmem_clone: Any) -> None:
    clone_url = osmem_clone.url
    tl = Timeline()
    with RecordingProxy(clone_url, tl) as rec:
        es = ES(rec.url)
        lines = []
        for i in range(3):
            lines += [json.dumps({"create": {"_index": "rec", "_id": f"r{i}"}}), json.dumps({"seq": i})]
        body = gzip.compress(("\n".join(lines) + "\n").encode())
        headers = {"Content-Type": "application/x-ndjson", "Content-Encoding": "gzip"}
        # shipper's own filter_path: no _id in the answer, items matched by position
        path = "/_bulk?filter_path=errors,items.*.status,items.*.error.type"
        es.request("POST", path, body, headers=headers)
        assert set(tl.arrived) == {"r0", "r1", "r2"}
        assert all(tl.sent[i] <= tl.arrived[i] for i in tl.arrived)
        first = dict(tl.arrived)
        es.request("POST", path, body, headers=headers)           # 409s: arrivals keep their first time
        assert tl.arrived == first
        es.bulk_create("rec", [{"seq": 9}], ids=["r9"])
        assert "r9" in tl.arrived
        es.request("PUT", "/rec2", {"mappings": {"properties": {"n": {"type": "long"}}}})
        bad = "\n".join([json.dumps({"create": {"_index": "rec2", "_id": "bad"}}), json.dumps({"n": "x"})]) + "\n"
        es.request("POST", "/_bulk", bad.encode(), headers={"Content-Type": "application/x-ndjson"})
        assert "bad" not in tl.arrived                            # a 400 item did not arrive


def test_an_answer_still_on_its_way_to_the_recorder_is_waited_for() -> None:
    """Elasticsearch shows a document before its bulk answer reaches the recorder's thread."""
    tl = Timeline()
    tl.wrote([1])
    sent = tl.bulk_sent()
    timer = threading.Timer(0.2, lambda: tl.acked(["id-1"], sent, announced=True))
    timer.start()
    try:
        tl.assert_prompt([hit(1)])
    finally:
        timer.join()
    assert tl.in_flight == 0
