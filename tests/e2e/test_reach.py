"""Destinations of every kind, through the real daemon: Elastic's failure store, `document_id:
none` (OpenSearch Serverless time series), a forward proxy, AWS SigV4. Each test ends with the
oracle: every written line exactly once, within a bound of when it was written, nothing secret in
the output.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.support.daemon import write_config
from tests.support.es import ES, ESError
from tests.support.proxy import FAILURE_STORE, BulkItem, FaultProxy, ItemVerdict
from tests.support.wait import wait_until
from tests.support.writer import write_lines

pytestmark = pytest.mark.slow

ARRIVAL_BOUND_S = 30.0      # each line written is in the destination within this (a loaded 2-core machine)


def _logs(tmp_path: Path) -> Path:
    logs = tmp_path / "logs"
    logs.mkdir()
    return logs


def _records(output: str) -> list[dict[str, Any]]:
    out = []
    for line in output.splitlines():
        try:
            rec = orjson.loads(line)
        except orjson.JSONDecodeError:
            continue
        if isinstance(rec, dict):
            out.append(rec)
    return out


def _count(es: ES, index: str) -> int:
    try:
        return es.count(index)
    except ESError as e:
        if e.status == 404:          # not created yet
            return 0
        raise


def _arrive(es: ES, index: str, n: int, written_at: float, tail: Any) -> None:
    """All `n` documents are in `index` within ARRIVAL_BOUND_S of when they were written."""
    wait_until(lambda: _count(es, index) >= n,
               lambda: f"{n} documents in {index} (have {_count(es, index)})\n{tail()}",
               timeout_s=max(1.0, written_at + ARRIVAL_BOUND_S - time.monotonic()))


def test_failure_store_items_count_as_delivered_with_their_metric_and_one_log_line(
        tmp_path: Path, es: ES, fault_proxy: FaultProxy, daemon_factory: Any) -> None:
    logs = _logs(tmp_path)
    stored_seqs: set[int] = set()

    def every_seventh(item: BulkItem) -> ItemVerdict:
        seq = orjson.loads(item.source or b"{}").get("seq")
        if isinstance(seq, int) and seq % 7 == 3:
            stored_seqs.add(seq)
            return FAILURE_STORE
        return None

    fault_proxy.item_failures(every_seventh)
    cfg = write_config(tmp_path, es_url=fault_proxy.url, paths=[logs / "*.log"],
                       extra_yaml={"output": {"elasticsearch": {"data_stream": {"dataset": "app"},
                                                                 "index_template": "off"}}})
    d = daemon_factory(cfg)
    d.wait_ready()
    t0 = time.monotonic()
    write_lines(logs / "app.log", range(300))
    _arrive(es, "logs-app-*,.fs-logs-app-*", 300, t0, d.tail)
    expected_stored = len([s for s in range(300) if s % 7 == 3])
    wait_until(lambda: d.metric("shipper_bulk_items_total", status="failure_store") >= expected_stored,
               lambda: f"the failure_store items counted\n{d.tail()}")
    t1 = time.monotonic()
    write_lines(logs / "app.log", range(300, 400))       # a second round within the minute: no second line
    _arrive(es, "logs-app-*,.fs-logs-app-*", 400, t1, d.tail)
    expected_stored = len([s for s in range(400) if s % 7 == 3])
    wait_until(lambda: d.metric("shipper_bulk_items_total", status="failure_store") == expected_stored,
               lambda: f"{expected_stored} failure_store items counted\n{d.tail()}")
    assert d.metric("shipper_bulk_items_total", status="201") == 400 - expected_stored
    assert d.metric("shipper_events_dead_letter_total") == 0
    lines = [r for r in _records(d.output()) if r.get("msg") == "documents went to the failure store"]
    assert len(lines) == 1, lines                        # at most once a minute, per index
    assert lines[0]["index"] == "logs-app-default" and 1 <= lines[0]["count"] <= expected_stored, lines
    es.assert_exactly_once(range(400), index="logs-app-*,.fs-logs-app-*")
    stored = es.all_docs(".fs-logs-app-default")
    assert {h["_source"]["seq"] for h in stored} == {s for s in range(400) if s % 7 == 3}
    assert d.alive, d.tail()


def test_document_id_none_sends_create_without_id_and_says_at_least_once(
        tmp_path: Path, es: ES, fault_proxy: FaultProxy, daemon_factory: Any) -> None:
    logs = _logs(tmp_path)
    seen: list[BulkItem] = []
    fault_proxy.item_failures(lambda item: seen.append(item))      # records, fails none
    cfg = write_config(tmp_path, es_url=fault_proxy.url, paths=[logs / "*.log"],
                       extra_yaml={"output": {"elasticsearch": {"document_id": "none", "index": "ts-metrics"}}})
    d = daemon_factory(cfg)
    d.wait_ready()
    t0 = time.monotonic()
    write_lines(logs / "app.log", range(250))
    _arrive(es, "ts-metrics", 250, t0, d.tail)
    assert len(seen) == 250 and all(item.op == "create" and item.id is None for item in seen)
    docs = es.assert_exactly_once(range(250), index="ts-metrics")
    assert len({h["_id"] for h in docs}) == 250                   # the ids Elasticsearch made
    warned = [r for r in _records(d.output()) if str(r.get("msg", "")).startswith("document_id: none: delivery is at least once")]
    assert len(warned) == 1, d.tail()
    check = d.cli("check")
    assert "output: WARNING: document_id: none: delivery is at least once, not exactly once" in check.stdout, check.stdout
    assert d.alive, d.tail()
