"""The bulk protocol: answers classified per item, whole answers judged, Retry-After, pairs, replays."""

from __future__ import annotations

import zlib

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as hs

from shipper import codec
from shipper.ship import batching, bulk
from shipper.spool.made import make_bodies


def _items(*statuses: int | tuple[int, str]) -> dict:
    items = []
    for s in statuses:
        status, etype = (s, None) if isinstance(s, int) else s
        body: dict = {"status": status}
        if status >= 300:
            body["error"] = {"type": etype or "exception", "reason": f"reason {status}"}
        items.append({"create": body})
    return {"errors": any((s if isinstance(s, int) else s[0]) >= 300 for s in statuses), "items": items}


def test_all_delivered_with_errors_false() -> None:
    out = bulk.classify({"errors": False}, 3)
    assert out.delivered == [0, 1, 2] and not out.retry and not out.dead


def test_409_on_create_counts_as_delivered() -> None:
    out = bulk.classify(_items(201, (409, "version_conflict_engine_exception"), 201), 3)
    assert out.delivered == [0, 1, 2] and out.statuses == {201: 2, 409: 1}


def test_429_and_5xx_items_are_retried_alone_400s_are_dead() -> None:
    ans = _items(201, (429, "es_rejected_execution_exception"), (400, "mapper_parsing_exception"), 503,
                 (400, "illegal_argument_exception"), 500, 201, (404, "index_not_found_exception"))
    out = bulk.classify(ans, 8)
    assert out.delivered == [0, 6]
    assert out.retry == [1, 3, 5]
    assert [(i, s) for i, s, _ in out.dead] == [(2, 400), (4, 400), (7, 404)]
    assert out.dead[0][2].startswith("mapper_parsing_exception: reason 400")
    assert out.pushback and not out.blocked
    assert out.first_error is not None and out.first_error.startswith("429 es_rejected_execution_exception")


def test_a_blocked_index_is_retried_never_dead() -> None:
    for st in (403, 429):
        out = bulk.classify(_items((st, "cluster_block_exception"), 201), 2)
        assert out.retry == [0] and out.blocked and not out.dead
    out = bulk.classify(_items((401, "security_exception")), 1)
    assert out.retry == [0] and out.blocked


def test_caused_by_is_part_of_the_reason() -> None:
    ans = {"errors": True, "items": [{"create": {"status": 400, "error": {
        "type": "document_parsing_exception", "reason": "failed to parse field [n] of type [long]",
        "caused_by": {"type": "illegal_argument_exception", "reason": "For input string: \"abc\""}}}}]}
    [(_, _, reason)] = bulk.classify(ans, 1).dead
    assert reason == ('document_parsing_exception: failed to parse field [n] of type [long] '
                      '(caused by illegal_argument_exception: For input string: "abc")')


@pytest.mark.parametrize("answer", [{}, {"errors": True}, {"errors": True, "items": [{"create": {"status": 201}}]},
                                    {"took": 3}, {"errors": True, "items": "nope"}])
def test_nothing_is_assumed_delivered_without_evidence(answer: dict) -> None:
    out = bulk.classify(answer, 2)
    assert out.retry == [0, 1] and not out.delivered and out.first_error


def test_an_item_without_status_is_retried() -> None:
    out = bulk.classify({"errors": True, "items": [{"create": {}}, {}, {"create": {"status": "x"}}]}, 3)
    assert out.retry == [0, 1, 2]


@pytest.mark.parametrize(("status", "answer", "count", "kind", "pushback"), [
    (200, {"errors": False}, 5, "items", False),
    (200, None, 5, "retry", False),
    (413, None, 5, "split", False),
    (413, None, 1, "dead", False),
    (400, {"error": {"type": "parse_exception", "reason": "bad"}}, 4, "split", False),
    (400, {"error": {"type": "parse_exception", "reason": "bad"}}, 1, "dead", False),
    (400, None, 4, "retry", False),                     # a proxy's HTML page: the destination, not a document
    (400, None, 1, "retry", False),
    (400, {"message": "Bad Request"}, 1, "retry", False),
    (401, {"error": {"type": "security_exception", "reason": "missing authentication credentials"}}, 5, "auth", False),
    (403, {"error": {"type": "security_exception", "reason": "unauthorized"}}, 5, "auth", False),
    (403, {"error": {"type": "cluster_block_exception", "reason": "index [x] blocked by: [FORBIDDEN/8/index write (api)]"}}, 5, "blocked", False),
    (429, {"error": {"type": "cluster_block_exception", "reason": "disk usage exceeded flood-stage watermark"}}, 5, "blocked", True),
    (429, None, 5, "retry", True),
    (503, None, 5, "retry", True),
    (500, None, 5, "retry", False),
    (404, None, 5, "retry", False),
    (302, None, 5, "retry", False),
])
def test_judge_whole_answers(status: int, answer: dict | None, count: int, kind: str, pushback: bool) -> None:
    v = bulk.judge(status, answer, count)
    assert (v.kind, v.pushback) == (kind, pushback)
    assert v.reason


def test_status_reason_prefers_elasticsearch_error() -> None:
    assert bulk.status_reason(400, {"error": {"type": "t", "reason": "r"}}) == "t: r"
    assert bulk.status_reason(413, None) == "request entity too large"
    assert bulk.status_reason(418, None) == "HTTP 418"


def test_retry_after_seconds_and_http_dates() -> None:
    assert bulk.parse_retry_after("7", 0.0) == 7.0
    assert bulk.parse_retry_after(" 1.5 ", 0.0) == 1.5
    assert bulk.parse_retry_after("-3", 0.0) == 0.0
    assert bulk.parse_retry_after(None, 0.0) is None and bulk.parse_retry_after("", 0.0) is None
    assert bulk.parse_retry_after("soon", 0.0) is None
    now = 1_800_000_000.0          # 2027-01-15T08:00:00Z
    assert bulk.parse_retry_after("Fri, 15 Jan 2027 08:00:30 GMT", now=now) == pytest.approx(30.0)
    assert bulk.parse_retry_after("Fri, 15 Jan 2027 07:00:00 GMT", now=now) == 0.0


def test_split_join_and_pair_parts_round_trip() -> None:
    pairs = [orjson.dumps({"create": {"_index": "i", "_id": f"id{n}"}}) + b"\n" + orjson.dumps({"n": n, "m": "a\nb"}) + b"\n"
             for n in range(4)]
    body = bulk.join_pairs(pairs)
    assert bulk.split_pairs(body) == pairs
    meta, source = bulk.pair_parts(pairs[2])
    assert meta == {"_index": "i", "_id": "id2"} and orjson.loads(source) == {"n": 2, "m": "a\nb"}


def test_dead_letters_become_bodies_with_their_index_and_id_within_the_limits() -> None:
    items = [{"index": "logs-a", "id": f"x{n}", "document": orjson.dumps({"n": n}), "reason": "r", "status": 400, "at": 0.0}
             for n in range(5)] + [{"index": "logs-b", "id": "", "document": b'{"n":5}', "reason": "r", "status": 400, "at": 0.0}]
    bodies = bulk.dead_letter_bodies(items, max_events=2, max_bytes=1 << 20)
    assert [n for _, n in bodies] == [2, 2, 2]
    pairs = [p for b, _ in bodies for p in bulk.split_pairs(b)]
    metas = [bulk.pair_parts(p)[0] for p in pairs]
    assert metas[0] == {"_index": "logs-a", "_id": "x0"}
    assert metas[5] == {"_index": "logs-b"}                 # no _id stored: none invented
    assert [orjson.loads(bulk.pair_parts(p)[1])["n"] for p in pairs] == list(range(6))


def test_group_respects_bytes_and_never_makes_an_empty_body() -> None:
    pairs = [b"x" * 40, b"y" * 40, b"z" * 100, b"w" * 10]
    assert [n for _, n in batching.group(pairs, 10, 90)] == [2, 1, 1]
    assert batching.group([], 10, 90) == []


@settings(max_examples=200, deadline=None)
@given(parts=hs.lists(hs.binary(max_size=3000) | hs.sampled_from([b"", b"\n", b"{}" * 700]), max_size=8))
def test_a_body_compressed_from_its_parts_is_one_gzip_member_of_their_bytes(parts: list[bytes]) -> None:
    z = codec.gzip_compress(parts)
    d = zlib.decompressobj(31)                  # what Elasticsearch's gzip reader takes: one member, whole
    assert d.decompress(z) == b"".join(parts) and d.eof and d.unused_data == b""
    assert codec.gzip_decompress(z) == codec.gzip_decompress(codec.gzip_compress(b"".join(parts)))


def test_bodies_made_from_parts_are_those_made_from_the_joined_bodies() -> None:
    parts = [b'{"create":{"_id":"a-%d"}}\n{"n":%d}\n' % (i, i) for i in range(5)]
    covers = {"inc": (0, 50)}
    for gzip in (False, True):
        from_parts = make_bodies([(parts[:3], 3), (parts[3:], 2), ([], 0)], covers, gzip)
        joined = make_bodies([(b"".join(parts[:3]), 3), (b"".join(parts[3:]), 2)], covers, gzip)
        assert [(m.raw_bytes, m.events, m.gzipped, m.covers) for m in from_parts] == \
            [(m.raw_bytes, m.events, m.gzipped, m.covers) for m in joined]
        assert [codec.decode_body(m.stored, gzip) for m in from_parts] == [b"".join(parts[:3]), b"".join(parts[3:])]
        assert all(type(m.stored) is bytes for m in from_parts)


def test_failure_store_items_are_delivered_and_counted_apart() -> None:
    ans = {"errors": False, "items": [{"create": {"status": 201}},
                                      {"create": {"status": 201, "failure_store": "used"}},
                                      {"create": {"status": 201, "failure_store": "used"}},
                                      {"create": {"status": 409, "error": {"type": "version_conflict_engine_exception"}}}]}
    out = bulk.classify(ans, 4)
    assert out.delivered == [0, 1, 2, 3] and not out.retry and not out.dead
    assert out.failure_store == [1, 2]
    assert out.statuses == {201: 1, bulk.FAILURE_STORE: 2, 409: 1}


def test_failure_store_that_failed_or_is_off_is_an_ordinary_item_failure() -> None:
    # `not_enabled`/`failed` come with the item's own error: judged by its status as ever
    ans = {"errors": True, "items": [
        {"create": {"status": 400, "failure_store": "not_enabled",
                    "error": {"type": "document_parsing_exception", "reason": "bad"}}},
        {"create": {"status": 500, "failure_store": "failed", "error": {"type": "exception", "reason": "x"}}}]}
    out = bulk.classify(ans, 2)
    assert [i for i, _s, _r in out.dead] == [0] and out.retry == [1] and not out.failure_store


def test_the_filter_path_keeps_the_failure_store_mark() -> None:
    assert "items.*.failure_store" in bulk.FILTER_PATH.split(",")


def test_indices_of_counts_the_index_each_position_was_sent_to() -> None:
    pairs = [b'{"create":{"_index":"logs-a-default","_id":"x-1"}}\n{"m":1}\n',
             b'{"create":{"_index":"logs-b-default","_id":"x-2"}}\n{"m":2}\n',
             b'{"create":{"_index":"logs-a-default"}}\n{"m":3}\n']
    assert bulk.indices_of(pairs, [0, 2]) == {"logs-a-default": 2}
    assert bulk.indices_of(pairs, [0, 1, 2]) == {"logs-a-default": 2, "logs-b-default": 1}


def test_tally_reports_at_most_once_per_period_per_key_with_everything_since() -> None:
    t = bulk.Tally(60.0)
    assert t.add("a", 3, 1000.0) == 3          # the first one at once
    assert t.add("a", 2, 1010.0) == 0
    assert t.add("b", 1, 1010.0) == 1          # keys are apart
    assert t.add("a", 4, 1059.9) == 0
    assert t.add("a", 1, 1060.0) == 7          # 2 + 4 + 1 since the last report
    assert t.add("a", 1, 1061.0) == 0


def test_an_amazon_opensearch_message_is_the_reason() -> None:
    answer = {"message": "The security token included in the request is expired"}
    assert bulk.status_reason(403, answer) == "The security token included in the request is expired"
    assert bulk.judge(403, answer, 3).reason == "The security token included in the request is expired"
