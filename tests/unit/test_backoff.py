"""Backoff: exponential ceiling, full jitter between initial and the ceiling, Retry-After, the cap."""

from __future__ import annotations

import random

import pytest

from shipper.ship.backoff import Backoff


def test_ceiling_doubles_from_initial_and_is_capped() -> None:
    b = Backoff(0.5, 10.0)
    assert [b.ceiling(n) for n in range(1, 8)] == [0.5, 1.0, 2.0, 4.0, 8.0, 10.0, 10.0]
    assert b.ceiling(0) == 0.0
    assert b.ceiling(10_000) == 10.0            # no overflow on a long outage


def test_delay_is_full_jitter_between_initial_and_the_ceiling() -> None:
    b = Backoff(1.0, 60.0)
    rng = random.Random(1)
    for attempt in range(1, 12):
        ds = [b.delay(attempt, rng) for _ in range(300)]
        top = b.ceiling(attempt)
        assert all(1.0 <= d <= top for d in ds)
        if top >= 4:
            # spread over the whole range, not bunched at either end
            assert min(ds) < 1.0 + 0.2 * (top - 1.0) and max(ds) > top - 0.2 * (top - 1.0)
    assert b.delay(1, rng) == 1.0                # the first retry waits exactly initial_backoff


def test_retry_after_is_a_floor_capped_at_max_backoff() -> None:
    b = Backoff(0.1, 5.0)
    rng = random.Random(2)
    assert b.delay(1, rng, retry_after_s=3.0) == 3.0
    assert b.delay(1, rng, retry_after_s=120.0) == 5.0     # a huge Retry-After never parks us past the cap
    d = b.delay(8, rng, retry_after_s=0.2)                  # a small one does not shorten the backoff
    assert 0.1 <= d <= 5.0
    assert b.delay(1, rng, retry_after_s=0.0) == pytest.approx(0.1)


def test_same_seed_same_delays() -> None:
    b = Backoff(1.0, 30.0)
    assert [b.delay(n, random.Random(9)) for n in range(1, 6)] == [b.delay(n, random.Random(9)) for n in range(1, 6)]
