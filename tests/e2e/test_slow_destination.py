"""A slow destination must not outrun shipper (issues 41 and 44): a real loopback proxy that takes
3 s over every request, a writer at a steady rate, both spool modes. While every slot is busy the
reader cuts a partial batch every flush_interval (the tests' 200 ms), so batches are small; the
senders must join those that wait into full requests, or the queue grows without bound (before:
4 slots x 20 lines / 3 s = 27 lines/s drained of 100 written). Then the same for a queue built up
during an outage and replayed through the slow proxy. Oracle: each line exactly once, each within
the bound, the queue bounded, and requests that carried many batches.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from tests.support.daemon import Daemon, write_config
from tests.support.es import ES
from tests.support.promptness import DEFAULT_BOUND_S
from tests.support.proxy import FaultProxy
from tests.support.wait import wait_until
from tests.support.writer import Writer, write_lines

LATENCY_S = 3.0           # the proxy's time over each request, before it forwards it
RATE = 100                # lines a second
SECONDS = 30
# The proxy sits in front of the recording proxy, so the oracle counts its 3 s as shipper's: a line
# is in a request that takes LATENCY_S to reach Elasticsearch, on top of the tests' usual bound.
BOUND_S = DEFAULT_BOUND_S + LATENCY_S
# With requests joined, a line waits about one round trip for a slot and one in flight: at most the
# lines of four round trips are outstanding (two of slack: osmem's own indexing time on a shared
# machine adds to each). Without joining, 4 slots x 20 lines / 3 s drain 27 lines/s of the 100
# written: the queue grows by ~73 a second, ~2,200 by the end, and the backlog takes over a minute.
QUEUE_BOUND = int(RATE * 4 * LATENCY_S)


def _daemon(tmp_path: Path, daemon_factory: Any, url: str, spool: str) -> tuple[Path, Daemon]:
    logs = tmp_path / "logs"
    logs.mkdir()
    cfg = write_config(tmp_path, es_url=url, paths=str(logs / "*.log"),
                       extra_yaml={"output": {"elasticsearch": {"index_template": "off", "timeout": "20s"}},
                                   "queue": {"spool": spool}})
    d = daemon_factory(cfg)
    d.wait_ready()
    return logs / "app.log", d


def _outstanding(d: Daemon) -> float:
    """Events read and not yet acknowledged: in the on-disk queue or out from memory."""
    return d.metric("shipper_queue_events") + d.metric("shipper_memory_events")


def _docs_per_request(d: Daemon, n: int) -> float:
    return n / max(1.0, d.metric("shipper_bulk_requests_total"))


@pytest.mark.parametrize("spool", ["when_behind", "always"])
def test_a_slow_destination_is_sent_full_requests_and_the_queue_stays_bounded(tmp_path: Path, es: ES,
                                                                              fault_proxy: FaultProxy,
                                                                              daemon_factory: Any, spool: str) -> None:
    fault_proxy.latency(LATENCY_S)
    app, d = _daemon(tmp_path, daemon_factory, fault_proxy.url, spool)
    n = RATE * SECONDS
    peak = 0.0
    t0 = time.monotonic()
    with Writer(app, rate=RATE, max_lines=n) as w:
        def written() -> bool:
            nonlocal peak
            assert d.alive, d.tail()
            peak = max(peak, _outstanding(d))
            return w.is_done
        wait_until(written, f"{n} lines written at {RATE}/s", timeout_s=SECONDS * 3, interval_s=0.5)
    wrote_s = time.monotonic() - t0

    def delivered() -> bool:
        nonlocal peak
        peak = max(peak, _outstanding(d))
        return es.count() >= n
    # what is outstanding when the writer stops goes in at most two more round trips
    wait_until(delivered, lambda: f"{n} documents (have {es.count()}, queue {_outstanding(d):.0f})",
               timeout_s=4 * LATENCY_S + 10, interval_s=0.5)
    drained_s = time.monotonic() - t0 - wrote_s
    merged = d.metric("shipper_batches_merged_total")
    print(f"{spool}: {n} lines at {RATE}/s through {LATENCY_S:.0f} s a request: peak outstanding {peak:.0f} "
          f"events, {_docs_per_request(d, n):.0f} docs a request, "
          f"{merged:.0f} batches joined, drained {drained_s:.1f} s after the writer stopped")
    assert peak <= QUEUE_BOUND, f"the queue grew to {peak:.0f} events (bound {QUEUE_BOUND})"
    assert merged > 0
    es.assert_exactly_once(range(n), bound_s=BOUND_S)
    assert d.alive, d.tail()


def test_a_queue_built_during_an_outage_is_replayed_in_full_requests(tmp_path: Path, es: ES,
                                                                     fault_proxy: FaultProxy,
                                                                     daemon_factory: Any) -> None:
    app, d = _daemon(tmp_path, daemon_factory, fault_proxy.url, "when_behind")
    fault_proxy.down()
    n = 3000
    with Writer(app, rate=600, max_lines=n) as w:      # small batches, one every flush_interval
        wait_until(lambda: w.is_done, f"{n} lines written", timeout_s=30)
    wait_until(lambda: d.metric("shipper_queue_events") >= n, "every line in the on-disk queue", timeout_s=30)
    fault_proxy.latency(LATENCY_S)
    before = fault_proxy.requests
    fault_proxy.up()
    t0 = time.monotonic()
    # one at a time, the ~50 small batches would take 50 x 3 s / 4 slots, about 40 s
    wait_until(lambda: es.count() >= n, lambda: f"{n} documents (have {es.count()})", timeout_s=6 * LATENCY_S)
    took = time.monotonic() - t0
    requests = fault_proxy.requests - before
    print(f"replayed {n} queued lines in {requests} requests, {took:.1f} s through {LATENCY_S:.0f} s a request")
    write_lines(app, range(n, n + 10))                   # after the backlog, a line goes at once again
    wait_until(lambda: es.count() >= n + 10, "the lines written after the replay", timeout_s=4 * LATENCY_S)
    es.assert_exactly_once(range(n + 10), bound_s=BOUND_S)
    assert d.alive, d.tail()


def test_kill_9_while_joined_requests_are_out_loses_nothing_and_indexes_nothing_twice(tmp_path: Path, es: ES,
                                                                                     fault_proxy: FaultProxy,
                                                                                     daemon_factory: Any) -> None:
    fault_proxy.latency(LATENCY_S)
    app, d = _daemon(tmp_path, daemon_factory, fault_proxy.url, "when_behind")
    n = RATE * 20
    with Writer(app, rate=RATE, max_lines=n) as w:
        def joined_and_out() -> bool:
            assert d.alive, d.tail()
            out = fault_proxy.requests - len(fault_proxy.history)     # arrived, not yet answered
            return d.metric("shipper_batches_merged_total") >= 2 and out >= 1
        wait_until(joined_and_out, "joined requests out at the destination", timeout_s=30, interval_s=0.1)
        d.kill9()
        d.restart()
        wait_until(lambda: w.is_done, f"{n} lines written", timeout_s=60)
    wait_until(lambda: es.count() >= n, lambda: f"{n} documents (have {es.count()})", timeout_s=6 * LATENCY_S + 10)
    es.assert_exactly_once(range(n), bound_s=BOUND_S)
    assert d.alive, d.tail()
