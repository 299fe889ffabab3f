"""Pure: the adaptive limit on bulk requests in flight (AIMD on round-trip time and pushback, like
Vector's adaptive request concurrency with TCP's slow start). Time is passed in; the sender acts on it."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

RTT_ALPHA = 0.3              # weight of a new sample in the running averages
RTT_DEVIATION_SCALE = 2.5    # "slower than usual" = above mean + scale * mean deviation,
RTT_MIN_RISE_RATIO = 0.3     # and at least 30% above the mean (the usual jitter of a loaded node),
RTT_MIN_RISE_S = 0.05        # and by more than this (scheduling noise at loopback speeds)
STALL_RTT_FACTOR = 4.0       # a request out this many mean round trips is stalled,
STALL_MIN_S = 1.0            # and never before this


def probe_in(starts: Iterable[float], probing: bool, last_failure: float, now: float,
             stall_after_s: float, window_s: float = float("inf")) -> float | None:
    """Seconds until one request may start above the limit (0.0: now), or None: not by time alone.

    `starts` are the start times of the requests in flight. One is stalled when it began before
    the last transport failure (`last_failure`: sent into the fault, it may never answer) or has
    been out `stall_after_s`. When all are stalled one probe may go beside them; none while a
    probe is out (`probing`), so at most one request is ever above the limit (and never above
    max_limit: see `AdaptiveLimit.probe_in`). Only within `window_s` (the request timeout) of a
    transport failure: after that, whatever the fault left hanging has timed out, and a destination
    that merely answers slowly is the adaptive limit's business (a probe would only add load).
    """
    if probing or now - last_failure > window_s:
        return None
    latest: float | None = None
    for start in starts:
        t = 0.0 if start < last_failure else start + stall_after_s - now
        latest = t if latest is None else max(latest, t)
    return None if latest is None else max(0.0, latest)


@dataclass(slots=True)
class AdaptiveLimit:
    """How many bulk requests may be in flight now, between `min_limit` and `max_limit`.

    The caller asks `can_start()`, calls `started()` when it sends and `finished()` with what came
    back. Decreases happen at most once per round trip, so one burst of failures halves once.

    Until the first sign of trouble the limit grows by one per answer while requests are waiting
    (doubling per round trip), after that by about one per round trip; it halves on pushback
    (429, 503, timeouts, refused connections) or when the round trip rises well above its
    running average. `probe_in` lets one request go above the limit when every request in flight
    is stalled (sent before the last transport failure, or out far longer than a round trip), so
    a request that never answers (a dead peer that never resets, a load balancer that accepts
    and hangs) does not hold the only slot until its timeout once the destination is back.
    """

    max_limit: int
    min_limit: int = 1
    limit: float = 1.0
    decrease_ratio: float = 0.5
    in_flight: int = 0
    rtt_mean_s: float | None = None
    rtt_dev_s: float = 0.0
    last_decrease: float = float("-inf")
    slow_start: bool = True

    def __post_init__(self) -> None:
        self.max_limit = max(self.min_limit, self.max_limit)
        self.limit = min(float(self.max_limit), max(float(self.min_limit), self.limit))

    @property
    def current(self) -> int:
        return int(self.limit)

    def stall_after_s(self) -> float:
        """How long a request may be out before it counts as stalled (see `probe_in`)."""
        return max(STALL_MIN_S, STALL_RTT_FACTOR * (self.rtt_mean_s or 0.0))

    def probe_in(self, starts: Iterable[float], probing: bool, last_failure: float, now: float,
                 window_s: float = float("inf")) -> float | None:
        """`probe_in` for these requests in flight; None when max_limit are in flight (the ceiling holds)."""
        if self.in_flight >= self.max_limit:
            return None
        return probe_in(starts, probing, last_failure, now, self.stall_after_s(), window_s)

    def can_start(self) -> bool:
        return self.in_flight < self.current

    def started(self) -> None:
        self.in_flight += 1

    def finished(self, now: float, rtt_s: float, pushback: bool, waiting: bool = False) -> None:
        """One request ended after rtt_s; `pushback` when the destination asked us to slow down;
        `waiting` when other requests are queued for a slot (the limit is what holds them back)."""
        saturated = waiting      # the limit, not the lack of work, is what holds requests back
        self.in_flight = max(0, self.in_flight - 1)
        mean = self.rtt_mean_s
        slower = mean is not None and rtt_s - mean > max(RTT_DEVIATION_SCALE * self.rtt_dev_s,
                                                         RTT_MIN_RISE_RATIO * mean, RTT_MIN_RISE_S)
        if pushback or slower:
            if now - self.last_decrease >= (mean or 0.0):
                self.limit = max(float(self.min_limit), self.limit * self.decrease_ratio)
                self.last_decrease = now
            self.slow_start = False
        elif saturated:
            # slow start: +1 per answer; then additive increase: about +1 per round trip
            step = 1.0 if self.slow_start else 1.0 / max(1.0, self.limit)
            self.limit = min(float(self.max_limit), self.limit + step)
        if not pushback:
            if mean is None:
                self.rtt_mean_s = rtt_s
            else:
                self.rtt_dev_s += RTT_ALPHA * (abs(rtt_s - mean) - self.rtt_dev_s)
                self.rtt_mean_s = mean + RTT_ALPHA * (rtt_s - mean)
