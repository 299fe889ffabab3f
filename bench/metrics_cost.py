"""Micro-benchmark of the telemetry: the cost of one update on the hot path and of one scrape.

    .venv/bin/python bench/metrics_cost.py            # prints ns per update and ms per scrape

Updates: `lines_read` (once per read chunk), `bulk_sent` (per request: a counter and three
histograms), `bulk_items`, `batch_acked`, and a labelled gauge set (`shipper_file_lag_bytes`, per
file per monitor tick). A scrape renders 50 files' lag gauges plus everything else.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from shipper.metrics import Metrics, TelemetryEvents


def per_call_ns(fn: Callable[[], object], n: int = 200_000) -> float:
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter_ns()
        for _ in range(n):
            fn()
        best = min(best, (time.perf_counter_ns() - t0) / n)
    return best


def main() -> None:
    m = Metrics()
    ev = TelemetryEvents(m)
    for i in range(50):
        m.set("shipper_file_lag_bytes", i * 1000, path=f"/var/log/app/file-{i}.log")
    ev.bulk_items({201: 10})
    print(f"lines_read        {per_call_ns(lambda: ev.lines_read('/var/log/a.log', 100, 12_000)):7.0f} ns")
    print(f"bulk_sent         {per_call_ns(lambda: ev.bulk_sent('h', 200, 500, 300_000, 0.042)):7.0f} ns")
    print(f"bulk_items        {per_call_ns(lambda: ev.bulk_items({201: 500})):7.0f} ns")
    print(f"batch_acked       {per_call_ns(lambda: ev.batch_acked(1, 500, 0)):7.0f} ns")
    print(f"set labelled      {per_call_ns(lambda: m.set('shipper_file_lag_bytes', 5, path='/var/log/app/file-7.log')):7.0f} ns")
    print(f"get (status)      {per_call_ns(lambda: m.get('shipper_events_read_total')):7.0f} ns")
    scrape = per_call_ns(m.render, n=500) / 1e6
    print(f"scrape (render)   {scrape:7.3f} ms, {len(m.render())} bytes")
    if hasattr(m, "exposition"):       # prometheus_client: the same without the process collector
        bare = Metrics(process=False)
        bare.counters, bare.gauges, bare.hist = m.counters, m.gauges, m.hist
        print(f"  without process_* {per_call_ns(bare.render, n=500) / 1e6:7.3f} ms")
        om = per_call_ns(lambda: m.exposition("application/openmetrics-text; version=1.0.0"), n=500) / 1e6
        print(f"  OpenMetrics       {om:7.3f} ms")


if __name__ == "__main__":
    main()
