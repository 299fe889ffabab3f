"""The ES oracle client against osmem, and the exactly-once assertion on its own."""

from __future__ import annotations

import gzip
import json
import threading
from typing import Any

import pytest

from tests.support.es import ES, ESError, assert_exactly_once
from tests.support.promptness import Timeline


def hit(doc_id: str, seq: object, index: str = "i") -> dict[str, Any]:
    return {"_id": doc_id, "_index": index, "_source": {"seq": seq}}


def test_all_docs_pages_past_ten_thousand_across_indices(es: ES) -> None:
    n = 12_000
    lines = []
    for s in range(n):
        lines.append(json.dumps({"create": {"_index": f"logs-{s % 2}", "_id": f"d{s:05d}"}}))
        lines.append(json.dumps({"seq": s, "message": "hello"}))
    body = gzip.compress(("\n".join(lines) + "\n").encode())
    answer = es.request("POST", "/_bulk?filter_path=errors", body,
                        headers={"Content-Type": "application/x-ndjson", "Content-Encoding": "gzip"})
    assert answer == {"errors": False}
    assert es.count() == n and es.count("logs-1") == n // 2
    docs = es.all_docs()
    assert len(docs) == n and {d["_index"] for d in docs} == {"logs-0", "logs-1"}
    assert set(docs[0]) == {"_id", "_index", "_source"}
    es.assert_exactly_once(range(n))
    with pytest.raises(AssertionError, match=r"1 missing, e\.g\. \[12000\]"):
        es.assert_exactly_once(range(n + 1))
    es.bulk_create("logs-9", [{"seq": 7}], ids=["again"])
    with pytest.raises(AssertionError, match="1 duplicated"):
        es.assert_exactly_once(range(n))
    assert es.ids().count("again") == 1 and len(es.ids("logs-*")) == n + 1


def test_a_line_written_a_moment_ago_is_not_reported_missing_beside_duplicates(es: ES) -> None:
    """A test's wait for a count returns as soon as duplicates make it up; the oracle then read the
    index while the last write (a moment old, inside flush_interval) was still on its way, and
    reported it missing beside the duplicates (test_rotation's compress run in a fresh-clone CI: 8
    missing, the last writer batch, and 300 duplicated). Lines not due yet are waited for; the
    report names what is wrong: the duplicate."""
    timeline = Timeline()
    oracle = ES(es.url, timeline=timeline)
    timeline.wrote(range(10), at=timeline.now() - 60.0)
    es.bulk_create("late", [{"seq": s} for s in range(10)], ids=[f"a{s}" for s in range(10)])
    es.bulk_create("late", [{"seq": 3}], ids=["again"])              # the duplicate
    assert es.count("late") == 11                                     # the count a test waits for: reached
    timeline.wrote([10])                                              # written now, indexed a moment later
    late = threading.Timer(0.5, lambda: es.bulk_create("late", [{"seq": 10}], ids=["a10"]))
    late.start()
    try:
        with pytest.raises(AssertionError) as exc:
            oracle.assert_exactly_once(range(11), index="late")
    finally:
        late.join()
    assert "1 duplicated" in str(exc.value) and "missing" not in str(exc.value), exc.value
    # a line written long ago and not there is missing at once
    timeline.wrote([11], at=timeline.now() - 60.0)
    with pytest.raises(AssertionError, match=r"1 missing, e\.g\. \[11\]"):
        oracle.assert_exactly_once(range(12), index="late")


def test_setup_and_reads(es: ES) -> None:
    es.create_index("typed", {"properties": {"n": {"type": "long"}}})
    assert es.indices() == ["typed"]
    es.bulk_create("typed", [{"n": 1}, {"n": 2}], ids=["a", "b"], compress=True)
    assert es.get("typed", "a") == {"_id": "a", "_index": "typed", "_source": {"n": 1}}
    assert es.get("typed", "zzz") is None and es.get("missing-index", "a") is None
    assert es.count(query={"term": {"n": 2}}) == 1
    with pytest.raises(ESError) as exc:
        es.request("GET", "/missing-index/_count")
    assert exc.value.status == 404


@pytest.mark.parametrize(("kind", "status"), [("read_only_allow_delete", 429), ("write", 403), ("read_only", 403)])
def test_index_blocks_answer_cluster_block_per_item(es: ES, kind: str, status: int) -> None:
    es.bulk_create("blk", [{"seq": 0}])
    es.block_writes("blk", kind)
    with pytest.raises(AssertionError, match="cluster_block_exception") as exc:
        es.bulk_create("blk", [{"seq": 1}])
    assert f"'status': {status}" in str(exc.value)
    es.unblock_writes("blk", kind)
    es.bulk_create("blk", [{"seq": 1}])
    es.assert_exactly_once([0, 1])


def test_assert_exactly_once_reports_every_kind_of_violation() -> None:
    docs = [hit("a", 1), hit("b", 2), hit("c", 2), hit("d", 99), {"_id": "e", "_index": "i", "_source": {}}, hit("a", 3, "j")]
    with pytest.raises(AssertionError) as exc:
        assert_exactly_once(docs, [1, 2, 3, 4])
    text = str(exc.value)
    assert "1 missing, e.g. [4]" in text
    assert "1 duplicated (1 extra docs)" in text and "'i/b', 'i/c'" in text
    assert "1 _id values in more than one document, e.g. ['a']" in text
    assert "1 unexpected keys, e.g. [99]" in text and "1 documents without a key" in text
    assert_exactly_once([hit("a", 1), hit("b", 2), hit("x", None)], [1, 2], allow_extra=True)
    assert_exactly_once([hit("a", 1)], [("i", 1)], key_fn=lambda d: (d["_index"], d["_source"]["seq"]))
