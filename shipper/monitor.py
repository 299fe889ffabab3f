"""A running pipeline, watched: rates and ETAs from recent samples (`RateTracker`, time passed in),
the gauges, /health's verdict, the status document (`shipper status`, /status, status.json) and the
periodic progress log line (`Monitor`), all from the pipeline's typed status (`PipelineStatus`).
"""

from __future__ import annotations

import logging
import os
from collections import deque
from collections.abc import Iterable
from typing import Any

from shipper import __version__
from shipper.logs import redact
from shipper.metrics import Metrics, TelemetryEvents
from shipper.model import PipelineStatus

log = logging.getLogger("shipper")

PROGRESS_EVERY_S = 10.0          # a "catching up" log line at most this often
BACKLOG_MIN_BYTES = 1024 * 1024  # below this much lag and queue there is no backlog worth a log line
RATE_WINDOW_S = 30.0             # rates and ETAs come from the samples of the last 30 s
MIN_RATE_SPAN_S = 1.0            # samples closer together than this give no rate (too noisy)


class RateTracker:
    """Per-second rates of monotonic totals over the last `window_s` seconds of samples.

    A key missing from a sample (a file that went away) is forgotten; a total that goes down (a
    counter that restarted) gives no rate until the window holds two samples after the drop.
    """

    def __init__(self, window_s: float = RATE_WINDOW_S) -> None:
        self.window_s = window_s
        self._samples: deque[tuple[int, float, dict[str, float]]] = deque()   # (number, time, totals)
        self._n = 0
        # key -> (number, time, total) of the first sample of the key's current run: the key is in
        # every sample since and its total never went down. A rate is then O(1) per key, not a walk
        # back through the window's samples: the status tick asks one for every open file (at
        # 1,000 files that walk was most of an idle daemon's CPU). Samples are told apart by
        # number, not time: two may share a time.
        self._since: dict[str, tuple[int, float, float]] = {}

    def observe(self, now: float, totals: dict[str, float]) -> None:
        last = self._samples[-1][2] if self._samples else {}
        n = self._n = self._n + 1
        since = self._since
        runs: dict[str, tuple[int, float, float]] = {}
        for key, v in totals.items():
            prev = last.get(key)
            start = since.get(key) if prev is not None and v >= prev else None
            runs[key] = (n, now, v) if start is None else start
        self._since = runs
        self._samples.append((n, now, dict(totals)))
        # keep one sample at or before the window's start, so a rate always spans the window
        while len(self._samples) > 2 and self._samples[1][1] <= now - self.window_s:
            self._samples.popleft()

    def observe_same(self, now: float) -> None:
        """`observe(now, totals)` with the newest sample's totals, in O(1): no total moved, so every
        key's run goes on and the sample shares the newest one's (never changed) dict."""
        if not self._samples:
            raise ValueError("observe_same needs an earlier sample")
        n = self._n = self._n + 1
        self._samples.append((n, now, self._samples[-1][2]))
        while len(self._samples) > 2 and self._samples[1][1] <= now - self.window_s:
            self._samples.popleft()

    def newest(self) -> dict[str, float] | None:
        """The newest sample's totals (not to be changed), None before the first."""
        return self._samples[-1][2] if self._samples else None

    def rate(self, key: str) -> float | None:
        """Per second over the window; None with fewer than two samples holding the key."""
        if len(self._samples) < 2:
            return None
        n1, t1, last = self._samples[-1]
        v1 = last.get(key)
        if v1 is None:
            return None
        n0, t0, v0 = self._since[key]
        if n0 == n1:                         # the run starts at the newest sample
            return None
        first_n, first_t, first = self._samples[0]
        if n0 < first_n:                     # it began before the oldest sample kept: from there
            t0, v0 = first_t, first[key]
        if t1 - t0 < MIN_RATE_SPAN_S:
            return None
        return (v1 - v0) / (t1 - t0)


def eta_s(remaining: float, rate_per_s: float | None) -> float | None:
    """Seconds to get through `remaining` at `rate_per_s`; 0 when nothing remains, None when no progress."""
    if remaining <= 0:
        return 0.0
    if not rate_per_s or rate_per_s <= 0:
        return None
    return remaining / rate_per_s


def _round(v: float | None, nd: int = 1) -> float | None:
    return None if v is None else round(v, nd)


def is_backlog(lag_bytes: int, queue_bytes: int) -> bool:
    """Enough left to ship that an operator wants progress lines rather than silence."""
    return lag_bytes >= BACKLOG_MIN_BYTES or queue_bytes >= BACKLOG_MIN_BYTES


# ================================================================ the running pipeline, watched

class Monitor:
    """Samples a running pipeline (every couple of seconds): gauges, rates, ETAs, /health's verdict,
    the status document (`shipper status`, /status, status.json) and the periodic progress line.

    `p` is the pipeline's typed status (`model.PipelineStatus`, from `Pipeline.snapshot()`), or
    None while there is no pipeline. Times are passed in (monotonic).
    """

    def __init__(self, metrics: Metrics, events: TelemetryEvents, health_down_after_s: float = 60.0,
                 mode: str = "daemon") -> None:
        self.m = metrics
        self.events = events
        self.health_down_after_s = health_down_after_s
        self.mode = mode
        self.rates = RateTracker()
        self.clock = metrics.clock
        self.started = self.clock.time()
        self._next_progress = 0.0
        self._backlog = False
        # the last tick's rows (`p.files`, the same tuple while the pipeline keeps them) and the files
        # made of them, kept while every rate in them is 0: an idle daemon's tick then makes no row
        self._rows: tuple[Any, ...] | None = None
        self._files: list[dict[str, Any]] | None = None
        self._sums: tuple[list[dict[str, Any]], int, float] | None = None     # (files, lag, bytes/s)

    # ---------------------------------------------------------------- sampling

    def files(self, p: PipelineStatus | None, extra_files: Iterable[dict[str, Any]] = ()) -> list[dict[str, Any]]:
        """file_status() plus each file's recent shipping rate (bytes/s) and ETA."""
        files = [f.to_dict() for f in p.files] if p is not None else []
        files.extend(extra_files)
        files.sort(key=lambda f: str(f.get("path")))
        for f in files:
            r = self.rates.rate("f:" + str(f.get("incarnation")))
            f["rate_bytes_per_s"] = _round(r)
            lag = f.get("lag_bytes")
            f["eta_s"] = _round(eta_s(lag, r)) if isinstance(lag, int) else None
        return files

    def sample(self, p: PipelineStatus, now: float, extra_files: Iterable[dict[str, Any]] = ()) -> list[dict[str, Any]]:
        """Record totals for the rates and refresh the gauges; returns the files with their rates."""
        m = self.m
        extra = list(extra_files)
        read, shipped = m.get("shipper_events_read_total"), m.get("shipper_events_shipped_total")
        last = self.rates.newest()
        if (not extra and p.files is self._rows and self._files is not None and last is not None
                and last["in"] == read and last["out"] == shipped):
            # the same rows as the last tick, whose rates were all 0: nothing moved, so they stay 0
            self.rates.observe_same(now)
            files = self._files
        else:
            raw = [f.to_dict() for f in p.files] + extra
            totals: dict[str, float] = {"in": read, "out": shipped}
            for f in raw:
                totals["f:" + str(f.get("incarnation"))] = f["offset"]
            self.rates.observe(now, totals)
            files = self.files(None, raw)
            m.clear_gauge("shipper_file_lag_bytes")
            for f in files:
                if isinstance(f.get("lag_bytes"), int) and f.get("inode") is not None:
                    m.set("shipper_file_lag_bytes", f["lag_bytes"], path=f["path"])
            m.set("shipper_files_open", sum(1 for f in files if f.get("inode") is not None))
            settled = not extra and all(f["rate_bytes_per_s"] == 0.0 for f in files)
            self._rows, self._files = (p.files, files) if settled else (None, None)
        m.set("shipper_bytes_at_risk", p.bytes_at_risk)
        m.set("shipper_queue_events", p.queue_events)
        m.set("shipper_queue_bytes", p.queue_bytes)
        m.set("shipper_memory_events", p.memory_events)
        m.set("shipper_memory_bytes", p.memory_bytes)
        m.set("shipper_dead_letter_events", p.dead_letters)
        for j in p.journald:
            m.set("shipper_journal_lag_entries", -1 if j.lag_entries is None else j.lag_entries, input=j.key)
            m.set("shipper_journal_lag_seconds", -1 if j.lag_seconds is None else round(j.lag_seconds, 3), input=j.key)
        down = self.down_for_s(p, now)
        m.set("shipper_output_down_seconds", round(down, 1) if down is not None else 0)
        eta = self._total_eta(files, p.queue_events)
        m.set("shipper_backlog_eta_seconds", round(eta, 1) if eta is not None else -1)
        return files

    def _file_sums(self, files: list[dict[str, Any]]) -> tuple[int, float]:
        """(lag bytes, shipped bytes/s) of these files; kept for the last list (a tick asks thrice)."""
        s = self._sums
        if s is not None and s[0] is files:
            return s[1], s[2]
        lag = sum(f["lag_bytes"] for f in files if isinstance(f.get("lag_bytes"), int))
        rate = sum(f["rate_bytes_per_s"] or 0.0 for f in files)
        self._sums = (files, lag, rate)
        return lag, rate

    def _total_eta(self, files: list[dict[str, Any]], queue_events: int = 0) -> float | None:
        """The larger of two estimates: file lag over the shipped-offset rate (offsets advance in
        steps, when every batch of a commit is acked) and the queue over the events-out rate."""
        lag, rate = self._file_sums(files)
        by_bytes = eta_s(lag, rate)
        by_events = eta_s(queue_events, self.rates.rate("out")) if queue_events else None
        known = [e for e in (by_bytes, by_events) if e is not None]
        if lag <= 0 and not queue_events:
            return 0.0
        return max(known) if known else None

    def down_for_s(self, p: PipelineStatus | None, now: float) -> float | None:
        """How long the output has been down in this episode; None while it is up."""
        since = self.events.output_down_since
        if p is None or p.output_up or since is None:
            return None
        return max(0.0, now - since)

    # ---------------------------------------------------------------- verdicts and documents

    def health(self, p: PipelineStatus | None, now: float) -> tuple[bool, str]:
        """/health: unhealthy while starting, and once the output has been down past the threshold."""
        if p is None:
            return False, "starting"
        down = self.down_for_s(p, now)
        if down is not None and down > self.health_down_after_s:
            return False, f"output down for {int(down)}s: {redact(p.last_error or 'no answer')}"
        return True, "ok"

    def status_doc(self, p: PipelineStatus | None, now: float, extra_files: Iterable[dict[str, Any]] = (),
                   files: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        """The document `shipper status --json` prints (SPEC's minimum shape, extended). `files`:
        what `sample` returned for this `p` (and `extra_files`) in the same tick, not made again."""
        if files is None:
            files = self.files(p, extra_files)
        lag, rate = self._file_sums(files)
        down = self.down_for_s(p, now)
        wall_down = self.events.output_down_since_wall if down is not None else None
        return {
            "daemon": "running", "running": True, "mode": self.mode, "pid": os.getpid(), "version": __version__,
            "updated": self.clock.time(), "started": self.started,
            "files": files,
            "journald": [j.to_dict() for j in p.journald] if p else [],
            "queue": {"events": p.queue_events if p else 0, "bytes": p.queue_bytes if p else 0,
                      # issue 46: what is sent from memory and not yet acknowledged (nor in the queue)
                      "in_memory": {"events": p.memory_events if p else 0, "bytes": p.memory_bytes if p else 0},
                      "spool": p.spool if p else None},
            "dead_letter": p.dead_letters if p else 0,
            "output": {"up": bool(p.output_up) if p else False,
                       "last_error": redact(p.last_error) if p and p.last_error else None,
                       "down_since": wall_down, "down_for_s": _round(down),
                       "hosts": list(p.hosts) if p else []},
            "rates": {"events_in_per_s": _round(self.rates.rate("in")),
                      "events_out_per_s": _round(self.rates.rate("out")),
                      "bytes_out_per_s": _round(rate)},
            "lag_bytes": lag, "eta_s": _round(self._total_eta(files, p.queue_events if p else 0)),
            "read_total": int(self.m.get("shipper_events_read_total")),
            "shipped_total": int(self.m.get("shipper_events_shipped_total")),
            "bytes_at_risk": p.bytes_at_risk if p else 0,
            "inputs": self.dropped_by_input(),
        }

    def dropped_by_input(self) -> list[dict[str, Any]]:
        """Per input (its label), the events its filters dropped since the start, by reason: the
        inputs that have a filter (drop_when, sample, throttle, include_lines, exclude_lines)."""
        by: dict[str, dict[str, int]] = {}
        for labels, v in self.m.series("shipper_events_dropped_total"):
            by.setdefault(labels.get("input", ""), {})[labels.get("reason", "")] = int(v)
        return [{"input": k, "dropped": d, "dropped_total": sum(d.values())} for k, d in sorted(by.items())]

    def progress(self, p: PipelineStatus, now: float, files: list[dict[str, Any]], always: bool = False) -> None:
        """Log "catching up" (rate, lag, ETA) every PROGRESS_EVERY_S while a backlog lasts, and
        "caught up" once when it is gone. With `always` (pipe), log while there is anything to do."""
        lag, rate = self._file_sums(files)
        backlog = is_backlog(lag, p.queue_bytes) or (always and (p.queue_events > 0 or lag > 0 or not files))
        if backlog and now >= self._next_progress:
            self._next_progress = now + PROGRESS_EVERY_S
            self._backlog = True
            eta = self._total_eta(files, p.queue_events)
            log.info("catching up", extra={
                "lag_bytes": lag, "queue_events": p.queue_events, "queue_bytes": p.queue_bytes,
                "events_in_per_s": _round(self.rates.rate("in")), "events_out_per_s": _round(self.rates.rate("out")),
                "bytes_out_per_s": _round(rate),
                "eta_s": _round(eta), "output_up": bool(p.output_up)})
        elif not backlog and self._backlog:
            self._backlog = False
            self._next_progress = 0.0
            log.info("caught up", extra={"shipped_total": int(self.m.get("shipper_events_shipped_total"))})
