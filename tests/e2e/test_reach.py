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
from tests.support.forward_proxy import Tinyproxy
from tests.support.pki import make_ca, server_context
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


PROXY_PASSWORD = "Pr0xy-Zebra-Quartz"


def _no_secret(d: Any, secret: str, *outputs: str) -> None:
    """The secret is in none of the daemon's output, status, metrics or the given command outputs."""
    assert secret not in d.output()
    assert secret not in orjson.dumps(d.status_json()).decode()
    assert secret not in "\n".join(f"{k} {v}" for k, v in d.metrics().items())
    for text in outputs:
        assert secret not in text


def test_https_through_a_connect_proxy_with_auth_refusing_then_accepting_then_dropping(
        tmp_path: Path, es: ES, osmem_clone: Any, daemon_factory: Any) -> None:
    """HTTPS_PROXY from the environment; a tinyproxy with BasicAuth that first knows another
    password (407 to CONNECT), then ours; TLS end to end: the front (a TLS server whose certificate
    names `localhost` only) sees the SNI `localhost` and the daemon verifies against our CA; the
    proxy stopped while shipping, then back."""
    logs = _logs(tmp_path)
    pki = tmp_path / "pki"
    pki.mkdir()
    ca = make_ca(pki, "test-ca")
    ctx, sni = server_context(pki, ca, "localhost")
    with FaultProxy(osmem_clone.url, ssl_context=ctx) as front, \
            Tinyproxy(tmp_path / "tp", user="shipper", password="not-" + PROXY_PASSWORD) as tp:
        cfg = write_config(tmp_path, es_url=f"https://localhost:{front.port}", paths=[logs / "*.log"],
                           extra_yaml={"output": {"elasticsearch": {"tls": {"ca_file": str(ca[0])}}}})
        env = {"HTTPS_PROXY": tp.url_with("shipper", PROXY_PASSWORD), "NO_PROXY": "example.org"}
        d = daemon_factory(cfg, env=env)
        d.wait_ready()
        write_lines(logs / "app.log", range(200))
        # refused: 407 to CONNECT is a connection error, retried with backoff; nothing reaches the front
        wait_until(lambda: d.metric("shipper_retries_total") >= 3, lambda: f"retries after 407\n{d.tail()}")
        assert front.requests == 0 and _count(es, "logs-*") == 0
        assert "refused CONNECT" in str(d.status_json()), d.status_json()
        check_refused = d.cli("check")
        # (tinyproxy answers a CONNECT with the wrong credentials 401, others 407)
        assert "FAILED" in check_refused.stdout and "refused CONNECT" in check_refused.stdout, check_refused.stdout
        t0 = time.monotonic()
        tp.restart(user="shipper", password=PROXY_PASSWORD)
        _arrive(es, "logs-*", 200, t0, d.tail)
        assert front.requests > 0 and set(sni) == {"localhost"}, sni
        assert "CONNECT localhost:" in tp.output() or "localhost" in tp.output(), tp.output()
        # the proxy goes away while shipping (open tunnels drop with it), then comes back
        tp.stop()
        write_lines(logs / "app.log", range(200, 300))
        retries = d.metric("shipper_retries_total")
        wait_until(lambda: d.metric("shipper_retries_total") > retries, lambda: f"retries, proxy down\n{d.tail()}")
        t1 = time.monotonic()
        tp.start()
        _arrive(es, "logs-*", 300, t1, d.tail)
        es.assert_exactly_once(range(300), index="logs-*")
        check = d.cli("check")
        assert check.returncode == 0, check.stdout + check.stderr
        assert f"output: https://localhost:{front.port}: reached through proxy {tp.url} (from HTTPS_PROXY)" \
            in check.stdout, check.stdout
        _no_secret(d, PROXY_PASSWORD, check.stdout, check.stderr, check_refused.stdout, check_refused.stderr)
        assert d.alive, d.tail()


def test_http_through_proxy_url_in_absolute_form_and_no_proxy_goes_direct(
        tmp_path: Path, es: ES, fault_proxy: FaultProxy, daemon_factory: Any) -> None:
    logs = _logs(tmp_path)
    with Tinyproxy(tmp_path / "tp") as tp:
        cfg = write_config(tmp_path, es_url=fault_proxy.url, paths=[logs / "*.log"],
                           extra_yaml={"output": {"elasticsearch": {"proxy_url": tp.url}}})
        d = daemon_factory(cfg)
        d.wait_ready()
        t0 = time.monotonic()
        write_lines(logs / "app.log", range(150))
        _arrive(es, "logs-*", 150, t0, d.tail)
        # tinyproxy took absolute-form requests for the destination and passed them on
        assert f"http://127.0.0.1:{fault_proxy.port}/_bulk" in tp.output(), tp.output()
        check = d.cli("check")
        assert f"reached through proxy {tp.url} (from output.elasticsearch.proxy_url)" in check.stdout, check.stdout
        d.terminate()
        # NO_PROXY lists the destination: straight there, the proxy sees nothing more
        before = tp.output().count("/_bulk")
        d2 = daemon_factory(cfg, env={"no_proxy": "127.0.0.1"})
        d2.wait_ready()
        t1 = time.monotonic()
        write_lines(logs / "app.log", range(150, 220))
        _arrive(es, "logs-*", 220, t1, d2.tail)
        assert tp.output().count("/_bulk") == before
        assert "reached through proxy" not in d2.cli("check").stdout
        es.assert_exactly_once(range(220), index="logs-*")
        assert d2.alive, d2.tail()
