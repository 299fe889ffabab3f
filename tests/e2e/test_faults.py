"""Destination faults through the FaultProxy in front of osmem: 429 with Retry-After, 503 bursts,
2 s latency, 413 splitting, connection refused, Basic auth, blocked indices, a mapping conflict
going to the dead-letter queue, two hosts with one down, and backpressure with the output down.

Each test ends with the oracle: every written line in ES exactly once (or in the dead-letter queue
where it should be), the daemon alive, and no secret in its output.
"""

from __future__ import annotations

import base64
import json
import os
import random
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from shipper.spool.headroom import RESERVE_FILE, reserve_size
from tests.support.bulk_sink import BulkSink
from tests.support.daemon import Daemon, write_config
from tests.support.es import ES, assert_exactly_once
from tests.support.promptness import Timeline
from tests.support.proxy import FaultProxy
from tests.support.wait import wait_until
from tests.support.writer import append_bytes, pino_line, write_lines

PASSWORD = "Tr0ub4dor&3-horse-battery"
MiB = 1024 * 1024


def _setup(tmp_path: Path, url: str | list[str], daemon_factory: Any, es_extra: dict[str, Any] | None = None,
           extra: dict[str, Any] | None = None) -> tuple[Path, Daemon]:
    logs = tmp_path / "logs"
    logs.mkdir(exist_ok=True)
    extra_yaml: dict[str, Any] = {"output": {"elasticsearch": dict(es_extra or {})}}
    if extra:
        extra_yaml.update(extra)
    cfg = write_config(tmp_path, es_url=url, paths=str(logs / "*.log"), extra_yaml=extra_yaml)
    d = daemon_factory(cfg)
    d.wait_ready()
    return logs / "app.log", d


def _delivered(es: ES, n: int, d: Daemon, timeout_s: float = 30.0) -> None:
    def check() -> bool:
        assert d.alive, f"daemon died\n{d.tail()}"
        return es.count() >= n
    wait_until(check, lambda: f"{n} documents in ES (have {es.count()})", timeout_s=timeout_s)


def _oracle(es: ES, d: Daemon, seqs: Any, secret: str | None = None) -> None:
    es.assert_exactly_once(seqs)
    assert d.alive, d.tail()
    out = d.output()
    if secret:
        assert secret not in out
    status = d.cli("status", "--json", check=True)
    if secret:
        assert secret not in status.stdout + status.stderr


def _dlq(d: Daemon) -> list[dict[str, Any]]:
    proc = d.cli("dlq", "list", check=True)
    return [json.loads(line) for line in proc.stdout.splitlines() if line.strip()]


def _rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError("no VmRSS")


def _dir_bytes(path: Path) -> tuple[int, dict[str, int]]:
    """Every file the state dir holds, as the disk counts it (allocated blocks, or the size when
    larger): the total, and each file's share. SPEC (Delivery): at most `queue.max_bytes` of queue
    plus 8 MiB of everything else (checkpoints, reserves, status), besides the dead letters."""
    total, files = 0, {}
    for root, _dirs, names in os.walk(path):
        for name in names:
            p = os.path.join(root, name)
            try:
                st = os.lstat(p)
            except FileNotFoundError:
                continue
            n = max(st.st_size, st.st_blocks * 512)
            files[os.path.relpath(p, path)] = n
            total += n
    return total, files


class _StateDirSampler(threading.Thread):
    """Looks at the state dir every 20 ms, for its largest size (a WAL between two checkpoints, a
    batch written while the queue is at its bound), until stopped."""

    def __init__(self, path: Path) -> None:
        super().__init__(daemon=True)
        self.path = path
        self.max_bytes = 0
        self.at_max: dict[str, int] = {}
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.wait(0.02):
            total, files = _dir_bytes(self.path)
            if total > self.max_bytes:
                self.max_bytes, self.at_max = total, files

    def stop(self) -> int:
        self._halt.set()
        self.join(10)
        return self.max_bytes


def test_429_with_retry_after_on_half_the_requests(tmp_path, es, fault_proxy, daemon_factory):
    fault_proxy.fail_ratio(429, 0.5, retry_after=1)
    app, d = _setup(tmp_path, fault_proxy.url, daemon_factory, {"bulk_max_events": 100})
    for start in range(0, 800, 200):
        write_lines(app, range(start, start + 200))
    _delivered(es, 800, d, timeout_s=60)
    assert fault_proxy.by_status.get(429, 0) >= 2
    retries = d.metric("shipper_retries_total")
    assert retries >= fault_proxy.by_status[429]
    _oracle(es, d, range(800))


def test_503_bursts(tmp_path, es, fault_proxy, daemon_factory):
    app, d = _setup(tmp_path, fault_proxy.url, daemon_factory, {"bulk_max_events": 100})
    for burst in range(3):
        fault_proxy.fail_next(503, times=4)
        write_lines(app, range(burst * 300, burst * 300 + 300))
        wait_until(lambda: es.count() >= (burst + 1) * 300, f"burst {burst} delivered", timeout_s=30)
    assert fault_proxy.by_status.get(503, 0) == 12
    _oracle(es, d, range(900))


def test_two_seconds_of_latency_keeps_several_requests_in_flight_and_memory_flat(tmp_path, es, fault_proxy,
                                                                                  daemon_factory, record_property):
    fault_proxy.latency(2.0)
    app, d = _setup(tmp_path, fault_proxy.url, daemon_factory,
                    # the template's three requests at start would add 6 s to a test of bulk overlap
                    {"bulk_max_events": 150, "max_in_flight": 4, "timeout": "10s", "index_template": "off"})
    pid = d.pid
    assert pid is not None
    rss0 = _rss_kib(pid)
    t0 = time.monotonic()
    write_lines(app, range(1500))          # 10 requests of 150: 20 s one at a time
    peak = rss0

    def done() -> bool:
        nonlocal peak
        peak = max(peak, _rss_kib(pid))
        return es.count() >= 1500
    wait_until(done, "1500 documents through a 2 s proxy", timeout_s=60, interval_s=0.2)
    took = time.monotonic() - t0
    record_property("latency_rss_kib", (rss0, peak))
    print(f"2 s latency: delivered 1500 in {took:.1f}s, RSS {rss0} KiB at start, peak {peak} KiB")
    assert took < 15, f"{took:.1f}s: requests were not overlapping (10 requests x 2 s)"
    assert peak - rss0 < 40 * 1024
    _oracle(es, d, range(1500))


def test_413_splits_the_batch_and_a_document_too_large_alone_is_dead_lettered(tmp_path, es, fault_proxy,
                                                                              daemon_factory):
    fault_proxy.max_body(6000)             # on the wire (gzip): a few dozen pino documents
    app, d = _setup(tmp_path, fault_proxy.url, daemon_factory, {"bulk_max_events": 1000})
    rnd = random.Random(7)
    huge = "".join(rnd.choice("abcdefghijklmnopqrstuvwxyz0123456789") for _ in range(20000))
    data = b"".join(pino_line(i) for i in range(500)) + pino_line(500, blob=huge) + \
        b"".join(pino_line(i) for i in range(501, 1000))
    append_bytes(app, data)
    wait_until(lambda: len(_dlq(d)) == 1, "the oversized document in the dead-letter queue", timeout_s=30)
    _delivered(es, 999, d)
    assert fault_proxy.by_status.get(413, 0) >= 3
    [dead] = _dlq(d)
    assert dead["status"] == 413 and dead["document"]["seq"] == 500
    assert "too large" in dead["reason"]
    _oracle(es, d, [i for i in range(1000) if i != 500])
    assert d.status_json()["dead_letter"] == 1


def test_connection_refused_then_recovered(tmp_path, es, fault_proxy, daemon_factory):
    fault_proxy.down()
    app, d = _setup(tmp_path, fault_proxy.url, daemon_factory)
    write_lines(app, range(600))
    wait_until(lambda: d.metric("shipper_bulk_requests_total", code="error") >= 3, "three refused attempts")
    wait_until(lambda: d.status_json()["output"]["up"] is False, "status: output down")
    st = d.status_json()
    assert "127.0.0.1" in (st["output"]["last_error"] or "")
    assert "output host unreachable" in d.output()
    assert es.count() == 0
    fault_proxy.up()
    _delivered(es, 600, d)
    wait_until(lambda: d.status_json()["output"]["up"] is True, "status: output up again")
    _oracle(es, d, range(600))


def test_basic_auth_wrong_password_is_logged_with_the_host_and_recovers_when_fixed(tmp_path, es, fault_proxy,
                                                                                   daemon_factory):
    wrong = "old-" + PASSWORD
    fault_proxy.require_basic_auth("shipper", PASSWORD)
    app, d = _setup(tmp_path, fault_proxy.url, daemon_factory, {"username": "shipper", "password": wrong})
    write_lines(app, range(400))
    wait_until(lambda: fault_proxy.by_status.get(401, 0) >= 2, "401 answers")
    wait_until(lambda: "rejected the credentials" in d.output(), "the credentials log line")
    line = next(json.loads(ln) for ln in d.output().splitlines() if "rejected the credentials" in ln)
    assert line["host"] == fault_proxy.url and line["level"] == "error"
    assert d.status_json()["output"]["up"] is False
    assert es.count() == 0
    # the operator fixes it on the cluster side: the password the daemon has becomes valid
    fault_proxy.require_basic_auth("shipper", wrong)
    _delivered(es, 400, d)
    fault_proxy.require_basic_auth("shipper", PASSWORD)
    _oracle(es, d, range(400), secret=wrong)
    assert PASSWORD not in d.output()


def test_basic_auth_from_the_url_and_env(tmp_path, es, fault_proxy, daemon_factory):
    fault_proxy.require_basic_auth("elastic", PASSWORD)
    logs = tmp_path / "logs"
    logs.mkdir()
    host = fault_proxy.url.replace("http://", "http://elastic:${SHIPPER_PW}@")
    cfg = write_config(tmp_path, es_url=host, paths=str(logs / "*.log"), extra_yaml={"log_level": "debug"})
    d = daemon_factory(cfg, env={"SHIPPER_PW": PASSWORD})
    d.wait_ready()
    write_lines(logs / "app.log", range(300))
    _delivered(es, 300, d)
    assert fault_proxy.by_status.get(401, 0) == 0
    _oracle(es, d, range(300), secret=PASSWORD)
    assert d.cli("check").stdout.count(PASSWORD) == 0


def test_blocked_index_is_retried_until_the_block_lifts(tmp_path, es, fault_proxy, daemon_factory):
    fault_proxy.blocked(True)
    app, d = _setup(tmp_path, fault_proxy.url, daemon_factory)
    write_lines(app, range(300))
    wait_until(lambda: fault_proxy.items_failed >= 600, "two rounds of blocked items")
    wait_until(lambda: "index write blocked" in d.output(), "the block log line")
    assert d.status_json()["output"]["up"] is False
    assert _dlq(d) == []
    fault_proxy.blocked(False)
    _delivered(es, 300, d)
    _oracle(es, d, range(300))
    assert _dlq(d) == []


def test_mapping_conflict_sends_one_document_to_the_dead_letter_queue(tmp_path, es, fault_proxy, daemon_factory):
    app, d = _setup(tmp_path, fault_proxy.url, daemon_factory, {"index": "conflict"})
    write_lines(app, range(0, 200), line_fn=lambda i: pino_line(i, n=1))
    _delivered(es, 200, d)
    write_lines(app, [200], line_fn=lambda i: pino_line(i, n="abc"))
    write_lines(app, range(201, 400), line_fn=lambda i: pino_line(i, n=2))
    wait_until(lambda: len(_dlq(d)) == 1, "one dead letter")
    _delivered(es, 399, d)
    [dead] = _dlq(d)
    assert dead["index"] == "conflict" and dead["status"] == 400
    assert dead["document"]["seq"] == 200 and dead["document"]["n"] == "abc"
    assert "exception" in dead["reason"]
    assert dead["at"].endswith("Z")
    _oracle(es, d, [i for i in range(400) if i != 200])
    assert d.metric("shipper_events_dead_letter_total") == 1


def test_dlq_replay_while_the_daemon_runs_delivers_after_the_cause_is_fixed(tmp_path, es, fault_proxy,
                                                                             daemon_factory):
    poison = {7, 77, 177}
    fault_proxy.item_failures(
        lambda item: (400, "mapper_parsing_exception", "failed to parse field [n]")
        if item.source is not None and json.loads(item.source).get("seq") in poison else None)
    app, d = _setup(tmp_path, fault_proxy.url, daemon_factory)
    write_lines(app, range(200))
    wait_until(lambda: len(_dlq(d)) == 3, "three dead letters")
    _delivered(es, 197, d)
    assert sorted(x["document"]["seq"] for x in _dlq(d)) == sorted(poison)
    assert all(x["reason"].startswith("mapper_parsing_exception") for x in _dlq(d))
    fault_proxy.item_failures(None)          # the mapping is fixed
    proc = d.cli("dlq", "replay", check=True)
    assert "re-queued 3" in proc.stderr
    _delivered(es, 200, d)
    assert _dlq(d) == []
    _oracle(es, d, range(200))
    assert d.cli("dlq", "purge", check=True).stderr.startswith("purged 0")


def test_two_hosts_with_one_down_costs_nothing(tmp_path, es, fault_proxy, osmem_clone, daemon_factory):
    # one host of two down is no outage: every line is still due within the bound
    with FaultProxy(osmem_clone.url, reports_outages=False) as second:
        second.down()
        app, d = _setup(tmp_path, [second.url, fault_proxy.url], daemon_factory, {"bulk_max_events": 100})
        t0 = time.monotonic()
        write_lines(app, range(1000))
        _delivered(es, 1000, d, timeout_s=20)
        took = time.monotonic() - t0
        assert took < 8, f"{took:.1f}s to deliver with one of two hosts down"
        assert d.status_json()["output"]["up"] is True
        # the host comes back and takes requests again
        second.up()
        before = second.requests
        write_lines(app, range(1000, 3000))
        wait_until(lambda: second.requests > before, "requests to the recovered host", timeout_s=20)
        _delivered(es, 3000, d)
        _oracle(es, d, range(3000))


@pytest.mark.slow
def test_backpressure_queue_full_pauses_reading_state_dir_small_rss_flat(tmp_path, daemon_factory, record_property,
                                                                          timeline):
    """1 MiB queue, output down, ~30 MB written: reading pauses, the state dir stays within SPEC's
    bound (queue.max_bytes plus 8 MiB, every file counted, the full-disk reserve too), RSS flat;
    then everything is delivered. The destination is BulkSink behind the FaultProxy, not osmem,
    which would need minutes to index 30 MB."""
    sink = BulkSink(timeline)          # osmem would need minutes to index 30 MB
    proxy = FaultProxy(sink.url).start()
    try:
        _backpressure(tmp_path, daemon_factory, record_property, sink, proxy, timeline)
    finally:
        proxy.stop()
        sink.close()


def _backpressure(tmp_path: Path, daemon_factory: Any, record_property: Any, sink: BulkSink,
                  fault_proxy: FaultProxy, timeline: Timeline) -> None:
    fault_proxy.down()
    # bodies under 1 MiB: the proxy (aiohttp) refuses to forward larger raw bodies under filterwarnings=error
    app, d = _setup(tmp_path, fault_proxy.url, daemon_factory, {"bulk_max_events": 500, "bulk_max_bytes": "512KiB"},
                    extra={"queue": {"max_bytes": "1MiB"}})
    rnd = random.Random(3)
    n_lines = 10_000

    def line(i: int) -> bytes:       # ~3 KB that gzip cannot shrink much: the queue fills in MBs, not lines
        return pino_line(i, pad=base64.b64encode(rnd.randbytes(2100)).decode())

    state = tmp_path / "state"
    assert d.pid is not None
    written = 0
    rss_samples = []
    sampler = _StateDirSampler(state)
    sampler.start()
    for start in range(0, n_lines, 1000):
        written += write_lines(app, range(start, start + 1000), line_fn=line)
        if start == 0:
            wait_until(lambda: "queue full, reading paused" in d.output(), "reading paused", timeout_s=20)
        rss_samples.append(_rss_kib(d.pid))
    assert written > 29_000_000
    # the files are the buffer: most of what was written stays unread; the queue holds about
    # queue.max_bytes (plus at most the one record being committed when the limit was reached)
    st = d.status_json()
    [f] = st["files"]
    assert os.path.getsize(app) - f["queued_offset"] > 25_000_000
    assert st["queue"]["bytes"] < 1024 * 1024 + 5 * 1024 * 1024
    assert sink.count() == 0
    assert max(rss_samples) - rss_samples[0] < 30 * 1024
    t_up = time.monotonic()
    fault_proxy.up()
    wait_until(lambda: sink.count() >= n_lines, lambda: f"{n_lines} documents in the sink (have {sink.count()})",
               timeout_s=60)
    print(f"backpressure: {n_lines} delivered {time.monotonic() - t_up:.1f}s after the output came back")
    max_state = sampler.stop()          # through the outage and the drain: every file, every 20 ms
    record_property("backpressure", {"state_dir_max_bytes": max_state, "rss_kib": rss_samples})
    print(f"backpressure: state dir at most {max_state} bytes ({sampler.at_max}), RSS samples {rss_samples} KiB")
    assert max_state <= 1024 * 1024 + 8 * 1024 * 1024, f"state dir over SPEC's bound: {sampler.at_max}"
    assert_exactly_once(sink.hits(), range(n_lines))
    assert not sink.dups
    timeline.assert_prompt(sink.hits())
    assert d.alive
    assert d.cli("status", "--json", check=True)


@pytest.mark.slow
def test_backpressure_a_backlog_spilled_from_memory_stays_within_the_queue_bound(tmp_path, daemon_factory, timeline):
    """`queue.max_bytes: 1MiB`, output down, 15 MB that gzip cannot shrink already written when the
    daemon starts: what goes out from memory (queue.spool: when_behind) and is spilled when it is
    not acknowledged must not carry the queue past its bound by more than a batch (docs/delivery.md,
    Backpressure), nor the state dir past SPEC's (queue.max_bytes plus 8 MiB). Found trying main as
    a user: 8 MiB of request bodies held in memory were spilled at once into a 1 MiB queue (7 MB)."""
    sink = BulkSink(timeline)
    proxy = FaultProxy(sink.url).start()
    try:
        proxy.down()
        logs = tmp_path / "logs"
        logs.mkdir()
        app = logs / "app.log"
        rnd = random.Random(5)
        n_lines = 5000
        written = write_lines(app, range(n_lines), line_fn=lambda i: pino_line(
            i, pad=base64.b64encode(rnd.randbytes(2100)).decode()))
        assert written > 14_000_000
        cfg = write_config(tmp_path, es_url=proxy.url, paths=str(logs / "*.log"), extra_yaml={
            "output": {"elasticsearch": {"bulk_max_events": 500, "bulk_max_bytes": "512KiB"}},
            "queue": {"max_bytes": "1MiB"}})
        sampler = _StateDirSampler(tmp_path / "state")
        sampler.start()
        d = daemon_factory(cfg)
        d.wait_ready()
        wait_until(lambda: "queue full, reading paused" in d.output(), "reading paused", timeout_s=30)
        wait_until(lambda: d.status_json()["queue"]["in_memory"]["events"] == 0,
                   "nothing left out from memory (all spilled)", timeout_s=30)
        queued = d.status_json()["queue"]["bytes"]
        assert queued <= 1024 * 1024 + 2 * 512 * 1024, f"queue at {queued} bytes with queue.max_bytes: 1MiB"
        proxy.up()
        wait_until(lambda: sink.count() >= n_lines, lambda: f"{n_lines} documents in the sink (have {sink.count()})",
                   timeout_s=60)
        max_state = sampler.stop()
        assert max_state <= 1024 * 1024 + 8 * 1024 * 1024, f"state dir over SPEC's bound: {sampler.at_max}"
        assert_exactly_once(sink.hits(), range(n_lines))
        assert not sink.dups
        timeline.assert_prompt(sink.hits())
        assert d.alive, d.tail()
    finally:
        proxy.stop()
        sink.close()


@pytest.mark.slow
def test_a_reload_that_lowers_queue_max_bytes_shrinks_the_reserve_and_the_state_dir_keeps_the_new_bound(
        tmp_path, daemon_factory, timeline):
    """SIGHUP from `queue.max_bytes: 64MiB` to `1MiB`: the full-disk reserve (an eighth of the
    queue's bound, spool/headroom.py) is cut at the reload, and through an outage that fills the
    new queue and the drain after it the state dir, every file counted, stays within SPEC's bound
    for the new value (Delivery: queue.max_bytes of queue plus 8 MiB of everything else). Before,
    the reserve made for 64 MiB (2 MiB) stayed until a restart."""
    sink = BulkSink(timeline)
    proxy = FaultProxy(sink.url).start()
    try:
        logs = tmp_path / "logs"
        logs.mkdir()
        app = logs / "app.log"
        cfg = write_config(tmp_path, es_url=proxy.url, paths=str(logs / "*.log"), extra_yaml={
            "output": {"elasticsearch": {"bulk_max_events": 500, "bulk_max_bytes": "512KiB"}},
            "queue": {"max_bytes": "64MiB"}})
        d = daemon_factory(cfg)
        d.wait_ready()
        state = tmp_path / "state"
        reserve = state / RESERVE_FILE
        st = os.statvfs(state)
        fs_bytes = st.f_blocks * st.f_frsize
        assert reserve.stat().st_size == reserve_size(fs_bytes, queue_max_bytes=64 * MiB)
        data = yaml.safe_load(cfg.read_text())
        data["queue"]["max_bytes"] = "1MiB"
        cfg.write_text(yaml.safe_dump(data, sort_keys=False))
        d.send(signal.SIGHUP)
        wait_until(lambda: "config reloaded" in d.output(), lambda: f"the reload\n{d.tail(20)}")
        small = reserve_size(fs_bytes, queue_max_bytes=MiB)
        assert small <= MiB // 8
        assert reserve.stat().st_size == small and reserve.stat().st_blocks * 512 <= small, d.tail(20)
        proxy.down()
        sampler = _StateDirSampler(state)
        sampler.start()
        rnd = random.Random(7)
        n_lines = 4000
        written = write_lines(app, range(n_lines), line_fn=lambda i: pino_line(
            i, pad=base64.b64encode(rnd.randbytes(2100)).decode()))
        assert written > 11_000_000
        wait_until(lambda: "queue full, reading paused" in d.output(), "reading paused at the new bound", timeout_s=30)
        proxy.up()
        wait_until(lambda: sink.count() >= n_lines, lambda: f"{n_lines} documents in the sink (have {sink.count()})",
                   timeout_s=60)
        max_state = sampler.stop()
        print(f"reload: state dir at most {max_state} bytes ({sampler.at_max})")
        assert max_state <= MiB + 8 * MiB, f"state dir over SPEC's bound for queue.max_bytes 1MiB: {sampler.at_max}"
        assert sampler.at_max.get(RESERVE_FILE, 0) <= small
        assert_exactly_once(sink.hits(), range(n_lines))
        assert not sink.dups
        timeline.assert_prompt(sink.hits())
        assert d.alive, d.tail()
    finally:
        proxy.stop()
        sink.close()


def test_a_400_page_from_a_proxy_is_retried_not_dead_lettered(tmp_path, es, fault_proxy, daemon_factory):
    """A 400 that is no Elasticsearch answer (nginx: plain HTTP to an HTTPS port) says the destination
    is wrong, not a document: the batch waits and goes once it is fixed; the dead-letter queue stays empty."""
    app, d = _setup(tmp_path, fault_proxy.url, daemon_factory, {"bulk_max_events": 100})
    page = "<html><head><title>400 The plain HTTP request was sent to HTTPS port</title></head></html>"
    fault_proxy.fail_next(400, times=6, body=page)
    write_lines(app, range(0, 300))
    _delivered(es, 300, d)
    assert fault_proxy.by_status.get(400, 0) == 6
    assert _dlq(d) == []
    assert d.metric("shipper_events_dead_letter_total") in (0, None)
    assert d.output().count("without an Elasticsearch error") == 1, "logged once per episode"
    _oracle(es, d, range(300))
