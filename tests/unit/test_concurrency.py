"""The adaptive in-flight limit: slow start, additive increase, halving on pushback or slowdown."""

from __future__ import annotations

from shipper.ship.concurrency import STALL_MIN_S, STALL_RTT_FACTOR, AdaptiveLimit, probe_in


def _round(lim: AdaptiveLimit, now: float, rtt: float, pushback: bool = False, waiting: bool = True) -> None:
    """Start as many requests as the limit allows, then finish them all."""
    n = 0
    while lim.can_start():
        lim.started()
        n += 1
    for _ in range(n):
        lim.finished(now, rtt, pushback, waiting)


def test_starts_at_one_and_grows_while_requests_wait() -> None:
    lim = AdaptiveLimit(max_limit=8)
    assert lim.current == 1
    seen = []
    for i in range(6):
        _round(lim, now=float(i), rtt=0.1)
        seen.append(lim.current)
    assert seen[0] == 2 and seen[1] == 4 and seen[2] == 8      # slow start doubles per round trip
    assert max(seen) == 8                                       # never past max_in_flight


def test_does_not_grow_without_demand() -> None:
    lim = AdaptiveLimit(max_limit=8)
    for i in range(10):
        lim.started()
        lim.finished(float(i), 0.1, False, waiting=False)
    assert lim.current == 1


def test_pushback_halves_once_per_round_trip_then_grows_additively() -> None:
    lim = AdaptiveLimit(max_limit=16)
    for i in range(4):
        _round(lim, now=float(i), rtt=0.5)
    assert lim.current == 16
    for _ in range(5):                     # a burst of 429s at the same moment: one halving
        lim.started()
        lim.finished(10.0, 0.5, True)
    assert lim.current == 8
    lim.started()
    lim.finished(11.0, 0.5, True)          # a round trip later: halves again
    assert lim.current == 4
    before = lim.limit
    _round(lim, now=12.0, rtt=0.5)         # after trouble, about +1 per round trip, not doubling
    assert before < lim.limit <= before + 1.01


def test_a_rising_round_trip_shrinks_the_limit_but_jitter_does_not() -> None:
    lim = AdaptiveLimit(max_limit=8)
    for i in range(4):
        _round(lim, now=float(i), rtt=2.0)
    assert lim.current == 8
    _round(lim, now=5.0, rtt=2.3)          # 15% jitter on a 2 s round trip: still fine
    assert lim.current == 8
    lim.started()
    lim.finished(9.0, 6.0, False)          # three times slower: the destination is struggling
    assert lim.current == 4


def test_never_below_one() -> None:
    lim = AdaptiveLimit(max_limit=4)
    for i in range(10):
        lim.started()
        lim.finished(float(i * 10), 0.1, True)
    assert lim.current == 1 and lim.can_start()


# ---------------------------------------------------------------- one probe beside stalled requests

def test_probe_goes_at_once_when_every_request_in_flight_began_before_the_last_transport_failure() -> None:
    assert probe_in([10.0, 11.0], probing=False, last_failure=12.0, now=12.5, stall_after_s=5.0) == 0.0


def test_probe_waits_until_a_request_sent_after_the_failure_is_stalled_too() -> None:
    # one began before the failure, one after it (at 13): stalled at 13 + 5
    assert probe_in([10.0, 13.0], probing=False, last_failure=12.0, now=14.0, stall_after_s=5.0) == 4.0
    assert probe_in([10.0, 13.0], probing=False, last_failure=12.0, now=19.0, stall_after_s=5.0) == 0.0


def test_probe_by_age_within_the_window_of_a_failure() -> None:
    assert probe_in([10.0], probing=False, last_failure=9.0, now=10.5, stall_after_s=1.0, window_s=30.0) == 0.5
    assert probe_in([10.0], probing=False, last_failure=9.0, now=11.0, stall_after_s=1.0, window_s=30.0) == 0.0


def test_no_probe_without_a_recent_failure() -> None:
    # a slow destination that answers is the adaptive limit's business: no probe by age alone
    never = float("-inf")
    assert probe_in([10.0], probing=False, last_failure=never, now=100.0, stall_after_s=1.0, window_s=30.0) is None
    assert probe_in([50.0], probing=False, last_failure=9.0, now=60.0, stall_after_s=1.0, window_s=30.0) is None


def test_no_second_probe_while_one_is_out_and_none_with_nothing_in_flight() -> None:
    assert probe_in([10.0, 11.0], probing=True, last_failure=12.0, now=100.0, stall_after_s=1.0) is None
    assert probe_in([], probing=False, last_failure=12.0, now=100.0, stall_after_s=1.0) is None


def test_stalled_means_a_second_at_least_or_four_mean_round_trips() -> None:
    lim = AdaptiveLimit(max_limit=4)
    assert lim.stall_after_s() == STALL_MIN_S == 1.0       # no round trip measured yet
    lim.started()
    lim.finished(0.0, 0.01, False)
    assert lim.stall_after_s() == 1.0
    lim.rtt_mean_s = 2.0
    assert lim.stall_after_s() == STALL_RTT_FACTOR * 2.0 == 8.0


def test_a_probe_never_takes_the_requests_in_flight_past_max_limit() -> None:
    lim = AdaptiveLimit(max_limit=2)
    lim.started()
    assert lim.probe_in([1.0], probing=False, last_failure=2.0, now=3.0) == 0.0   # 2 of 2 then
    lim.started()
    assert lim.probe_in([1.0, 1.5], probing=False, last_failure=2.0, now=3.0) is None
