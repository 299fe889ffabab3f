"""Telemetry: counters, gauges and histograms with their Prometheus text rendering (pure), and the
/metrics, /health and /status HTTP server. `TelemetryEvents` turns pipeline occurrences into log
lines and metric updates; `monitor.py` watches a running pipeline. Pure modules never import this one.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

from shipper.events import Events
from shipper.model import JournalGap

log = logging.getLogger("shipper")

HELP = {
    "shipper_events_read_total": ("counter", "Events read from files, stdin or the journal."),
    "shipper_events_shipped_total": ("counter", "Events acknowledged by Elasticsearch (409 duplicates included)."),
    "shipper_events_dead_letter_total": ("counter", "Events rejected for good and kept in the dead-letter queue."),
    "shipper_bulk_requests_total": ("counter", "Bulk requests by HTTP status, or error when no answer came."),
    "shipper_bulk_items_total": ("counter", "Items inside bulk answers, by status."),
    "shipper_retries_total": ("counter", "Bulk attempts that had to be retried."),
    "shipper_queue_events": ("gauge", "Events in the on-disk queue, not yet acknowledged."),
    "shipper_queue_bytes": ("gauge", "Bytes the queue holds on disk."),
    "shipper_file_lag_bytes": ("gauge", "Bytes of a file not yet acknowledged by the output (size minus shipped offset)."),
    "shipper_output_up": ("gauge", "1 when the last bulk request succeeded."),
    "shipper_output_down_seconds": ("gauge", "Seconds the output has been down in the current episode (0 when up)."),
    "shipper_bytes_at_risk": ("gauge", "Unread bytes in rotated or deleted files still held open."),
    "shipper_dead_letter_events": ("gauge", "Events currently held in the dead-letter queue."),
    "shipper_files_open": ("gauge", "Files currently being tailed."),
    "shipper_backlog_eta_seconds": ("gauge", "Estimated seconds to ship the current file lag at the recent rate (-1: unknown)."),
    "shipper_start_time_seconds": ("gauge", "Unix time the process started."),
    "shipper_journal_lag_entries": ("gauge", "Journal entries of a journald input not yet acknowledged (sequence numbers behind the newest matching entry; -1: unknown)."),
    "shipper_journal_lag_seconds": ("gauge", "Seconds of journal time between the newest matching entry and the last acknowledged one (-1: unknown)."),
    "shipper_journal_gaps_total": ("counter", "Gaps in a journald input: entries the journal vacuumed before they were read, or a stored cursor it no longer knows."),
    "shipper_journal_entries_lost_total": ("counter", "Journal entries vacuumed before they were read (from sequence-number distances)."),
    "shipper_journal_reader_restarts_total": ("counter", "Times a journald input's journalctl child ended and was started again."),
    "shipper_journal_entries_skipped_total": ("counter", "Journal entries skipped: not JSON, no cursor, or over the size limit."),
    "shipper_state_dir_full": ("gauge", "1 while the state dir's filesystem is full: reading paused, sending and acking go on (issue 19)."),
    "shipper_state_dir_free_bytes": ("gauge", "Bytes free on the state dir's filesystem (statvfs, for unprivileged users)."),
    "shipper_bulk_latency_seconds": ("histogram", "Bulk request latency, answered requests only."),
    "shipper_bulk_docs": ("histogram", "Documents per bulk request."),
    "shipper_bulk_request_bytes": ("histogram", "Bytes per bulk request body, as sent (compressed when gzip is on)."),
}
JOURNAL_COUNTERS = ("shipper_journal_gaps_total", "shipper_journal_entries_lost_total",
                    "shipper_journal_reader_restarts_total", "shipper_journal_entries_skipped_total")
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
DOCS_BUCKETS = (1, 10, 50, 100, 250, 500, 1000, 2000, 5000)
BYTES_BUCKETS = (1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216)



class Histogram:
    __slots__ = ("buckets", "counts", "sum", "count")

    def __init__(self, buckets: tuple[float, ...]) -> None:
        self.buckets = buckets
        self.counts = [0] * len(buckets)   # cumulative: counts[i] is observations <= buckets[i]
        self.sum = 0.0
        self.count = 0

    def observe(self, v: float) -> None:
        self.sum += v
        self.count += 1
        for i, b in enumerate(self.buckets):
            if v <= b:
                self.counts[i] += 1


LabelKey = tuple[str, tuple[tuple[str, str], ...]]


class Metrics:
    def __init__(self) -> None:
        self.counters: dict[LabelKey, float] = {}
        self.gauges: dict[LabelKey, float] = {}
        self.hist = {"shipper_bulk_latency_seconds": Histogram(LATENCY_BUCKETS),
                     "shipper_bulk_docs": Histogram(DOCS_BUCKETS),
                     "shipper_bulk_request_bytes": Histogram(BYTES_BUCKETS)}
        for name, (kind, _) in HELP.items():
            if kind == "counter" and name not in ("shipper_bulk_requests_total", "shipper_bulk_items_total") \
                    and name not in JOURNAL_COUNTERS:        # those are per input: 0 once an input starts
                self.counters[(name, ())] = 0
        for name in ("shipper_queue_events", "shipper_queue_bytes", "shipper_bytes_at_risk",
                     "shipper_dead_letter_events", "shipper_files_open", "shipper_output_down_seconds"):
            self.gauges[(name, ())] = 0
        self.gauges[("shipper_output_up", ())] = 1
        self.gauges[("shipper_backlog_eta_seconds", ())] = -1
        self.gauges[("shipper_start_time_seconds", ())] = round(time.time(), 3)

    def inc(self, name: str, value: float = 1, **labels: str) -> None:
        key = (name, tuple(sorted(labels.items())))
        self.counters[key] = self.counters.get(key, 0) + value

    def set(self, name: str, value: float, **labels: str) -> None:
        self.gauges[(name, tuple(sorted(labels.items())))] = value

    def clear_gauge(self, name: str) -> None:
        for k in [k for k in self.gauges if k[0] == name]:
            del self.gauges[k]

    def get(self, name: str, **labels: str) -> float:
        key = (name, tuple(sorted(labels.items())))
        return self.counters.get(key, self.gauges.get(key, 0))

    def render(self) -> str:
        return render_prometheus(self.counters, self.gauges, self.hist)


def _esc(v: str) -> str:
    return v.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(labels: tuple[tuple[str, str], ...], extra: str = "") -> str:
    parts = [f'{k}="{_esc(str(v))}"' for k, v in labels]
    if extra:
        parts.append(extra)
    return "{" + ",".join(parts) + "}" if parts else ""


def _num(v: float) -> str:
    return str(int(v)) if float(v).is_integer() else repr(float(v))


def render_prometheus(counters: dict[Any, float], gauges: dict[Any, float], hist: dict[str, Histogram]) -> str:
    """Prometheus text exposition format 0.0.4, with HELP and TYPE for every family."""
    fam: dict[str, list[str]] = {}
    for store in (counters, gauges):
        for (name, labels), v in sorted(store.items()):
            fam.setdefault(name, []).append(f"{name}{_labels(labels)} {_num(v)}")
    for name, h in hist.items():
        rows = fam.setdefault(name, [])
        for b, c in zip(h.buckets, h.counts, strict=True):
            rows.append(f'{name}_bucket{{le="{b:g}"}} {c}')
        rows.append(f'{name}_bucket{{le="+Inf"}} {h.count}')
        rows.append(f"{name}_sum {_num(h.sum)}")
        rows.append(f"{name}_count {h.count}")
    out: list[str] = []
    for name in sorted(set(fam) | {n for n in HELP}):
        kind, text = HELP.get(name, ("untyped", name))
        out.append(f"# HELP {name} {text}")
        out.append(f"# TYPE {name} {kind}")
        out.extend(fam.get(name, []))
    return "\n".join(out) + "\n"


# ================================================================ rates and ETAs (pure: time passed in)

# ================================================================ occurrences -> logs and metrics

class TelemetryEvents(Events):
    """The real Events: log lines (once per episode for faults) and metric updates."""

    def __init__(self, metrics: Metrics) -> None:
        self.m = metrics
        self.output_up = True
        self.output_error: str | None = None
        self.output_down_since: float | None = None       # monotonic
        self.output_down_since_wall: float | None = None  # the same instant, wall clock (for status)
        self._last_retry_log = 0.0

    def file_opened(self, path: str, inode: int, offset: int, incarnation: str) -> None:
        log.info("file opened", extra={"path": path, "inode": inode, "offset": offset, "incarnation": incarnation})

    def file_rotated(self, path: str, inode: int, how: str) -> None:
        log.info("file rotated", extra={"path": path, "inode": inode, "how": how})

    def file_truncated(self, path: str, inode: int, old_offset: int) -> None:
        log.info("file truncated", extra={"path": path, "inode": inode, "old_offset": old_offset})

    def file_closed(self, path: str, inode: int, offset: int, reason: str) -> None:
        log.info("file closed", extra={"path": path, "inode": inode, "offset": offset, "reason": reason})

    def file_error(self, path: str, error: str) -> None:
        log.warning("file error", extra={"path": path, "error": error})

    def file_parked(self, path: str, inode: int, offset: int, reason: str) -> None:
        log.debug("file parked", extra={"path": path, "inode": inode, "offset": offset, "reason": reason})

    def file_reopened(self, path: str, inode: int, offset: int) -> None:
        log.debug("file reopened", extra={"path": path, "inode": inode, "offset": offset})

    def rotated_copy_opened(self, path: str, copy_path: str, incarnation: str, offset: int) -> None:
        log.info("reading the rest from a rotated copy", extra={"path": path, "copy": copy_path,
                                                               "incarnation": incarnation, "offset": offset})

    def bytes_lost(self, path: str, inode: int, nbytes: int, reason: str) -> None:
        log.warning("unread bytes lost", extra={"path": path, "inode": inode, "bytes": nbytes, "reason": reason})

    def checkpoints_forgotten(self, count: int, remaining: int) -> None:
        log.info("checkpoints of removed files forgotten", extra={"count": count, "remaining": remaining})

    def lines_read(self, path: str, count: int, nbytes: int) -> None:
        self.m.inc("shipper_events_read_total", count)

    def bulk_sent(self, host: str, status: int | str, docs: int, nbytes: int, seconds: float) -> None:
        self.m.inc("shipper_bulk_requests_total", code=str(status))
        if isinstance(status, int):
            self.m.hist["shipper_bulk_latency_seconds"].observe(seconds)
            self.m.hist["shipper_bulk_docs"].observe(docs)
            self.m.hist["shipper_bulk_request_bytes"].observe(nbytes)

    def bulk_items(self, statuses: dict[int, int]) -> None:
        for s, n in statuses.items():
            self.m.inc("shipper_bulk_items_total", n, status=str(s))

    def batch_acked(self, seq: int, delivered: int, dead: int) -> None:
        self.m.inc("shipper_events_shipped_total", delivered)

    def dead_lettered(self, count: int, reason: str) -> None:
        self.m.inc("shipper_events_dead_letter_total", count)
        log.warning("events dead-lettered", extra={"count": count, "reason": reason})

    def retry_scheduled(self, reason: str, delay_s: float, host: str | None) -> None:
        self.m.inc("shipper_retries_total")
        now = time.monotonic()
        # ship/sender.py logs each fault episode per host; this is a reminder at most once a minute
        if now - self._last_retry_log > 60:
            self._last_retry_log = now
            log.warning("output retrying", extra={"reason": reason, "host": host, "delay_s": round(delay_s, 3)})

    def output_state(self, up: bool, error: str | None) -> None:
        if up and not self.output_up:
            log.info("output recovered", extra={"down_s": round(time.monotonic() - (self.output_down_since or 0), 1)})
            self.output_down_since = None
            self.output_down_since_wall = None
        if not up and self.output_up:
            self.output_down_since = time.monotonic()
            self.output_down_since_wall = time.time()
        self.output_up = up
        if error is not None:
            self.output_error = error
        self.m.set("shipper_output_up", 1 if up else 0)

    def queue_state(self, events: int, nbytes: int) -> None:
        self.m.set("shipper_queue_events", events)
        self.m.set("shipper_queue_bytes", nbytes)

    def backpressure(self, paused: bool, queue_bytes: int) -> None:
        if paused:
            log.warning("queue full, reading paused", extra={"queue_bytes": queue_bytes})
        else:
            log.info("queue drained, reading resumed", extra={"queue_bytes": queue_bytes})

    def spool_error(self, error: str) -> None:
        log.error("spool write failed, retrying", extra={"error": error})

    def journal_started(self, key: str, cursor: str | None, argv: Sequence[str]) -> None:
        for name in JOURNAL_COUNTERS:
            self.m.inc(name, 0, input=key)
        log.info("journal reader started", extra={"input": key, "cursor": cursor, "argv": list(argv)})

    def journal_gap(self, key: str, gap: JournalGap) -> None:
        log.warning("journal entries lost before they were read", extra={
            "input": key, "reason": gap.reason, "after": gap.after, "resumed_at": gap.resumed_at,
            "lost_entries": gap.lost_entries, "seconds": gap.seconds})
        self.m.inc("shipper_journal_gaps_total", 1, input=key)
        if gap.lost_entries:
            self.m.inc("shipper_journal_entries_lost_total", gap.lost_entries, input=key)

    def journal_reader_exited(self, key: str, returncode: int | None, kind: str, error: str,
                              attempt: int, restart_in_s: float) -> None:
        # once per episode: the first exit after output is a warning, the retries that follow are debug
        level = logging.WARNING if attempt == 1 else logging.DEBUG
        log.log(level, "journal reader exited", extra={"input": key, "returncode": returncode, "kind": kind,
                                                       "error": error, "attempt": attempt,
                                                       "restart_in_s": round(restart_in_s, 3)})
        self.m.inc("shipper_journal_reader_restarts_total", 1, input=key)

    def journal_entry_skipped(self, key: str, reason: str) -> None:
        log.warning("journal entry skipped", extra={"input": key, "reason": reason})
        self.m.inc("shipper_journal_entries_skipped_total", 1, input=key)

    def info(self, msg: str, **fields: Any) -> None:
        log.info(msg, extra=fields)


# ================================================================ HTTP

PROMETHEUS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


async def serve_metrics(listen: str, metrics: Metrics, health: Callable[[], tuple[bool, str]],
                        status: Callable[[], dict[str, Any]] | None = None) -> Any:
    """Start the /metrics, /health (and /status, JSON) server on HOST:PORT or [IPv6]:PORT (an empty
    host is 127.0.0.1: loopback unless asked otherwise). Returns the aiohttp runner (call .cleanup())."""
    import orjson
    from aiohttp import web

    async def metrics_handler(_req: web.Request) -> web.Response:
        return web.Response(body=metrics.render().encode(),
                            headers={"Content-Type": PROMETHEUS_CONTENT_TYPE, "X-Content-Type-Options": "nosniff"})

    async def health_handler(_req: web.Request) -> web.Response:
        ok, reason = health()
        return web.json_response({"status": "ok" if ok else "unhealthy", "reason": reason}, status=200 if ok else 503)

    async def status_handler(_req: web.Request) -> web.Response:
        assert status is not None
        return web.Response(body=orjson.dumps(status()), content_type="application/json")

    app = web.Application()
    app.router.add_get("/metrics", metrics_handler)
    app.router.add_get("/health", health_handler)
    if status is not None:
        app.router.add_get("/status", status_handler)
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    host, _, port = listen.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]                      # [::1]:9607
    site = web.TCPSite(runner, host or "127.0.0.1", int(port), reuse_address=True)
    try:
        await site.start()
    except BaseException:
        await runner.cleanup()
        raise
    return runner
