"""Telemetry: the metric families (HELP), counters, gauges and histograms as dicts updated on the
loop and rendered at scrape time by prometheus_client; `TelemetryEvents`, the real Events (log lines
and metric updates); `serve_metrics`. Pure modules never import this one; monitor.py watches."""

from __future__ import annotations

import logging
from bisect import bisect_left
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from itertools import accumulate
from typing import TYPE_CHECKING, Any, Literal

from shipper import __version__
from shipper.clock import Clock, SystemClock
from shipper.events import Events
from shipper.model import JournalGap

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry
    from prometheus_client.metrics_core import Metric

log = logging.getLogger("shipper")

Kind = Literal["counter", "gauge", "histogram"]


@dataclass(frozen=True)
class Family:
    """One metric family. `initial`: the value an unlabelled series shows from the start (None: the
    family has no sample until its first update, as for labelled families)."""

    kind: Kind
    help: str
    initial: float | None = None
    buckets: tuple[float, ...] = ()


LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
DOCS_BUCKETS = (1, 10, 50, 100, 250, 500, 1000, 2000, 5000)
BYTES_BUCKETS = (1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216)

# Every family shipper exposes (SPEC.md's names), one line each: name -> (kind, help). A new gauge
# is one line here and a `metrics.set(name, value)` where the value is known; it has no sample
# until then, unless INITIAL gives it a value to show from the start.
HELP = {
    "shipper_events_read_total": ("counter", "Events read from files, stdin or the journal."),
    "shipper_events_shipped_total": ("counter", "Events acknowledged by Elasticsearch (409 duplicates included)."),
    "shipper_events_dead_letter_total": ("counter", "Events rejected for good and kept in the dead-letter queue."),
    "shipper_events_dropped_total": ("counter", "Events an input's filters dropped (not shipped, checkpointed as shipped), by input and reason: drop_when, sample, throttle, exclude_lines, include_lines."),
    "shipper_bulk_requests_total": ("counter", "Bulk requests by HTTP status, or error when no answer came."),
    "shipper_bulk_items_total": ("counter", "Items inside bulk answers, by status (failure_store: taken into the data stream's failure store)."),
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
    "shipper_build_info": ("gauge", "Always 1; the version label is the running shipper's version."),
    "shipper_journal_lag_entries": ("gauge", "Journal entries of a journald input not yet acknowledged (sequence numbers behind the newest matching entry; -1: unknown)."),
    "shipper_journal_lag_seconds": ("gauge", "Seconds of journal time between the newest matching entry and the last acknowledged one (-1: unknown)."),
    "shipper_journal_gaps_total": ("counter", "Gaps in a journald input: entries the journal vacuumed before they were read, or a stored cursor it no longer knows."),
    "shipper_journal_entries_lost_total": ("counter", "Journal entries vacuumed before they were read (from sequence-number distances)."),
    "shipper_journal_reader_restarts_total": ("counter", "Times a journald input's journalctl child ended and was started again (it exited, or it held back an entry)."),
    "shipper_journal_entries_skipped_total": ("counter", "Journal entries skipped: not JSON, no cursor, or over the size limit."),
    "shipper_state_dir_full": ("gauge", "1 while the state dir's filesystem is full: reading paused, sending and acking go on (issue 19)."),
    "shipper_state_dir_free_bytes": ("gauge", "Bytes free on the state dir's filesystem (statvfs, for unprivileged users)."),
    "shipper_events_spilled_total": ("counter", "Events sent from memory and written to the on-disk queue before their acknowledgement, by reason (late: not acknowledged within queue.spill_after; file_gone: their file is deleted or truncated; stop)."),
    "shipper_batches_merged_total": ("counter", "Queued batches sent joined with others in one bulk request (behind: several waited when a request slot freed; each is still acknowledged on its own)."),
    "shipper_memory_events": ("gauge", "Events sent from memory (queue.spool: when_behind) not yet acknowledged nor written to the queue."),
    "shipper_memory_bytes": ("gauge", "Bytes of the request bodies sent from memory not yet acknowledged nor written to the queue."),
    "shipper_state_written_bytes_total": ("counter", "Bytes written to the state dir: queue, checkpoints and dead letters, with SQLite's own pages (what the spool's threads passed to write(2))."),
    "shipper_bulk_latency_seconds": ("histogram", "Bulk request latency, answered requests only."),
    "shipper_bulk_docs": ("histogram", "Documents per bulk request."),
    "shipper_bulk_request_bytes": ("histogram", "Bytes per bulk request body, as sent (compressed when gzip is on)."),
}
# unlabelled series shown from the start, with this value (labelled ones appear with their first update)
INITIAL: dict[str, float] = {
    "shipper_events_read_total": 0, "shipper_events_shipped_total": 0, "shipper_events_dead_letter_total": 0,
    "shipper_retries_total": 0, "shipper_queue_events": 0, "shipper_queue_bytes": 0, "shipper_bytes_at_risk": 0,
    "shipper_dead_letter_events": 0, "shipper_files_open": 0, "shipper_output_down_seconds": 0,
    "shipper_output_up": 1, "shipper_backlog_eta_seconds": -1,
}
BUCKETS = {"shipper_bulk_latency_seconds": LATENCY_BUCKETS, "shipper_bulk_docs": DOCS_BUCKETS,
           "shipper_bulk_request_bytes": BYTES_BUCKETS}


def families_table() -> dict[str, Family]:
    """HELP, INITIAL and BUCKETS as one Family per name (read at every `Metrics()` and scrape, so a
    family added to HELP at run time, as a test does, is seen)."""
    return {name: Family(kind, text, INITIAL.get(name), BUCKETS.get(name, ()))   # type: ignore[arg-type]
            for name, (kind, text) in HELP.items()}


JOURNAL_COUNTERS = ("shipper_journal_gaps_total", "shipper_journal_entries_lost_total",
                    "shipper_journal_reader_restarts_total", "shipper_journal_entries_skipped_total")


class Histogram:
    """Per-bucket counts (one increment per observation, found by bisection), cumulated at a scrape."""

    __slots__ = ("buckets", "counts", "sum", "count")

    def __init__(self, buckets: tuple[float, ...]) -> None:
        self.buckets = buckets
        self.counts = [0] * (len(buckets) + 1)     # the last one: above every bound (+Inf only)
        self.sum = 0.0
        self.count = 0

    def observe(self, v: float) -> None:
        self.sum += v
        self.count += 1
        self.counts[bisect_left(self.buckets, v)] += 1

    def cumulative(self) -> list[int]:
        """counts[i]: observations <= buckets[i] (the Prometheus `le` buckets, +Inf excluded)."""
        return list(accumulate(self.counts[:-1]))


LabelKey = tuple[str, tuple[tuple[str, str], ...]]


class Metrics:
    """The daemon's counters, gauges and histograms: plain dicts and lists on the hot path (an
    update is a dict write, no lock: everything runs on the event loop), rendered by
    prometheus_client at scrape time from a private registry that also holds its ProcessCollector
    (process_cpu_seconds_total, process_resident_memory_bytes, process_open_fds, ...). Several
    daemons in one process (the tests) each have their own."""

    def __init__(self, clock: Clock | None = None, process: bool = True) -> None:
        self.clock = clock or SystemClock()
        self.counters: dict[LabelKey, float] = {}
        self.gauges: dict[LabelKey, float] = {}
        fams = families_table()
        self.hist = {name: Histogram(f.buckets) for name, f in fams.items() if f.kind == "histogram"}
        for name, f in fams.items():
            if f.initial is not None:
                (self.counters if f.kind == "counter" else self.gauges)[(name, ())] = f.initial
        self.gauges[("shipper_start_time_seconds", ())] = round(self.clock.time(), 3)
        self.gauges[("shipper_build_info", (("version", __version__),))] = 1
        self._process = process
        self._registry: CollectorRegistry | None = None
        self._probes: dict[str, Callable[[], float | None]] = {}    # counters kept elsewhere (`probe`)

    @property
    def registry(self) -> CollectorRegistry:
        """Made at the first scrape: prometheus_client is imported then, not at every start (its
        import is ~15-28 ms of a backlog run's startup, issue 14)."""
        if self._registry is None:
            from prometheus_client import CollectorRegistry, ProcessCollector
            reg = CollectorRegistry(auto_describe=False)
            reg.register(_collector(self._families))
            if self._process:
                ProcessCollector(registry=reg)
            self._registry = reg
        return self._registry

    def probe(self, name: str, read: Callable[[], float | None]) -> None:
        """An unlabelled counter kept elsewhere, `read` at each scrape (None: the last value stays)."""
        self._probes[name] = read

    def _families(self) -> list[Metric]:
        for name, read in self._probes.items():
            v = read()
            if v is not None:
                self.counters[(name, ())] = v
        return families(self.counters, self.gauges, self.hist)

    def inc(self, name: str, value: float = 1, **labels: str) -> None:
        key = (name, tuple(sorted(labels.items())) if labels else ())
        self.counters[key] = self.counters.get(key, 0) + value

    def set(self, name: str, value: float, **labels: str) -> None:
        self.gauges[(name, tuple(sorted(labels.items())) if labels else ())] = value

    def clear_gauge(self, name: str) -> None:
        self.gauges = {k: v for k, v in self.gauges.items() if k[0] != name}

    def series(self, name: str) -> list[tuple[dict[str, str], float]]:
        """Every labelled series of a counter: (labels, value)."""
        return [(dict(labels), v) for (n, labels), v in self.counters.items() if n == name]

    def get(self, name: str, **labels: str) -> float:
        key = (name, tuple(sorted(labels.items())) if labels else ())
        return self.counters.get(key, self.gauges.get(key, 0))

    def exposition(self, accept: str | None = None) -> tuple[bytes, str]:
        """(body, Content-Type) for a scrape: OpenMetrics when Accept asks for it, else Prometheus text 0.0.4."""
        from prometheus_client.exposition import choose_encoder
        encoder, content_type = choose_encoder(accept or "")
        return encoder(self.registry), content_type

    def render(self) -> str:
        """The Prometheus text format (0.0.4)."""
        from prometheus_client import generate_latest
        return generate_latest(self.registry).decode()


def _le(bound: float) -> str:
    """A bucket bound as its exact value: 1048576 (not 1.04858e+06), 0.005."""
    return str(int(bound)) if float(bound).is_integer() else repr(float(bound))


def families(counters: dict[Any, float], gauges: dict[Any, float], hist: dict[str, Histogram]) -> list[Metric]:
    """The samples as prometheus_client families (pure, by name): all of HELP, even unsampled; others `unknown`."""
    from prometheus_client.metrics_core import Metric
    fams = families_table()
    rows: dict[str, list[tuple[str, dict[str, str], float]]] = {name: [] for name in fams}
    for store in (counters, gauges):
        for (name, labels), v in sorted(store.items()):
            rows.setdefault(name, []).append((name, dict(labels), v))
    for name, h in hist.items():
        out = rows.setdefault(name, [])
        for b, c in zip(h.buckets, h.cumulative(), strict=True):
            out.append((name + "_bucket", {"le": _le(b)}, c))
        out.append((name + "_bucket", {"le": "+Inf"}, h.count))
        out.append((name + "_count", {}, h.count))
        out.append((name + "_sum", {}, h.sum))
    result: list[Metric] = []
    for name in sorted(rows):
        f = fams.get(name)
        kind = f.kind if f else "unknown"
        # prometheus_client names a counter family without its _total (OpenMetrics); the samples keep it
        fam = Metric(name[:-6] if kind == "counter" and name.endswith("_total") else name, f.help if f else name, kind)
        for sample_name, labels, v in rows[name]:
            fam.add_sample(sample_name, labels, v)
        result.append(fam)
    return result


def _collector(collect: Callable[[], list[Metric]]) -> Any:
    """A prometheus_client Collector whose collect() returns what `collect` makes."""
    from prometheus_client.registry import Collector

    class _Collector(Collector):
        def collect(self) -> Iterable[Metric]:
            return collect()

    return _Collector()


def render_prometheus(counters: dict[Any, float], gauges: dict[Any, float], hist: dict[str, Histogram]) -> str:
    """Prometheus text exposition format 0.0.4 of these samples (no process metrics), by prometheus_client."""
    from prometheus_client import generate_latest
    fams = families(counters, gauges, hist)
    return generate_latest(_collector(lambda: fams)).decode()


# ================================================================ occurrences -> logs and metrics

class TelemetryEvents(Events):
    """The real Events: log lines (once per episode for faults) and metric updates."""

    def __init__(self, metrics: Metrics) -> None:
        self.m = metrics
        self.clock = metrics.clock
        self.output_up = True
        self.output_error: str | None = None
        self.output_down_since: float | None = None       # monotonic
        self.output_down_since_wall: float | None = None  # the same instant, wall clock (for status)
        self._last_retry_log, self._spill_logged_at = 0.0, float("-inf")     # monotonic: the last such line
        self._refused_told: set[tuple[str, str]] = set()

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

    def file_refused(self, path: str, reason: str, link: str | None, rule: str) -> None:
        """A file the trust rules keep from being read (SPEC, Trust boundaries): said once per path
        and reason, up to REFUSED_TOLD_MAX of them, then once that more are not said."""
        told = self._refused_told
        if (path, reason) in told or len(told) > REFUSED_TOLD_MAX:
            return
        told.add((path, reason))
        if len(told) > REFUSED_TOLD_MAX:
            log.info("more files not read; they are not logged any more", extra={"logged": REFUSED_TOLD_MAX})
            return
        extra: dict[str, Any] = {"path": path, "reason": reason}
        if link is not None:
            extra["link"] = link
        if rule:
            extra["rule"] = rule
        log.info("file not read", extra=extra)

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

    def events_dropped(self, input: str, reason: str, count: int) -> None:
        self.m.inc("shipper_events_dropped_total", count, input=input, reason=reason)

    def lines_read(self, path: str, count: int, nbytes: int) -> None:
        self.m.inc("shipper_events_read_total", count)

    def bulk_sent(self, host: str, status: int | str, docs: int, nbytes: int, seconds: float) -> None:
        self.m.inc("shipper_bulk_requests_total", code=str(status))
        if isinstance(status, int):
            self.m.hist["shipper_bulk_latency_seconds"].observe(seconds)
            self.m.hist["shipper_bulk_docs"].observe(docs)
            self.m.hist["shipper_bulk_request_bytes"].observe(nbytes)

    def bulk_items(self, statuses: dict[int | str, int]) -> None:
        for s, n in statuses.items():
            self.m.inc("shipper_bulk_items_total", n, status=str(s))

    def batch_acked(self, seq: int, delivered: int, dead: int) -> None:
        self.m.inc("shipper_events_shipped_total", delivered)

    def dead_lettered(self, count: int, reason: str) -> None:
        self.m.inc("shipper_events_dead_letter_total", count)
        log.warning("events dead-lettered", extra={"count": count, "reason": reason})

    def retry_scheduled(self, reason: str, delay_s: float, host: str | None) -> None:
        self.m.inc("shipper_retries_total")
        now = self.clock.monotonic()
        # ship/sender.py logs each fault episode per host; this is a reminder at most once a minute
        if now - self._last_retry_log > 60:
            self._last_retry_log = now
            log.warning("output retrying", extra={"reason": reason, "host": host, "delay_s": round(delay_s, 3)})

    def output_state(self, up: bool, error: str | None) -> None:
        if up and not self.output_up:
            log.info("output recovered", extra={"down_s": round(self.clock.monotonic() - (self.output_down_since or 0), 1)})
            self.output_down_since = None
            self.output_down_since_wall = None
        if not up and self.output_up:
            self.output_down_since = self.clock.monotonic()
            self.output_down_since_wall = self.clock.time()
        self.output_up = up
        if error is not None:
            self.output_error = error
        self.m.set("shipper_output_up", 1 if up else 0)

    def queue_state(self, events: int, nbytes: int) -> None:
        self.m.set("shipper_queue_events", events)
        self.m.set("shipper_queue_bytes", nbytes)

    def spilled(self, reason: str, batches: int, events: int) -> None:
        self.m.inc("shipper_events_spilled_total", events, reason=reason)
        if self.clock.monotonic() - self._spill_logged_at >= 60:      # a line a minute at most (the metric counts all)
            self._spill_logged_at = self.clock.monotonic()
            log.info("events in flight written to the queue", extra={"reason": reason, "events": events})

    def merged(self, batches: int, events: int) -> None:
        self.m.inc("shipper_batches_merged_total", batches)

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

    def journal_reread(self, key: str, newest: str, position: str | None) -> None:
        log.warning("journal reader missed an entry, restarted", extra={"input": key, "newest": newest, "position": position})
        self.m.inc("shipper_journal_reader_restarts_total", 1, input=key)

    def info(self, msg: str, **fields: Any) -> None:
        log.info(msg, extra=fields)


# ================================================================ HTTP

REFUSED_TOLD_MAX = 4096       # files not read (trust rules) logged per process at most, each once


async def serve_metrics(listen: str, metrics: Metrics, health: Callable[[], tuple[bool, str]],
                        status: Callable[[], dict[str, Any]] | None = None, *,
                        status_on_any_address: bool = False) -> Any:
    """Start the /metrics, /health (and /status, JSON) server on HOST:PORT or [IPv6]:PORT (an empty
    host is 127.0.0.1: loopback unless asked otherwise). /status names paths and hosts: served only
    on a loopback address unless `status_on_any_address` (metrics.status: true). Returns the
    endpoint (call .cleanup())."""
    from shipper.endpoint import Endpoint, Route, is_loopback, json_route, split_listen
    host, port = split_listen(listen)

    def metrics_route(accept: str | None) -> tuple[int, bytes, str]:
        body, content_type = metrics.exposition(accept)
        return 200, body, content_type

    def health_doc() -> tuple[int, Any]:
        ok, reason = health()
        return (200 if ok else 503), {"status": "ok" if ok else "unhealthy", "reason": reason}

    routes: dict[str, Route] = {"/metrics": metrics_route, "/health": json_route(health_doc)}
    if status is not None and (status_on_any_address or is_loopback(host)):
        status_fn = status
        routes["/status"] = json_route(lambda: (200, status_fn()))
    elif status is not None:
        log.info("/status not served on a non-loopback address (metrics.status: true serves it)",
                 extra={"listen": listen})
    endpoint = Endpoint(routes, clock=metrics.clock)
    await endpoint.start(host, port)
    return endpoint
