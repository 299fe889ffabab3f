"""Unit tests for shipper.parse.timeparse: the layouts SPEC names, year inference, zones."""

from __future__ import annotations

import calendar
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shipper.parse.timeparse import format_timestamp, parse_timestamp

NOW = calendar.timegm((2026, 11, 30, 12, 0, 0))  # Mon 2026-11-30 12:00:00 UTC


def utc(*parts: int) -> float:
    return float(calendar.timegm(parts + (0,) * (6 - len(parts))))


@pytest.mark.parametrize("text, expected", [
    ("2026-11-30T12:00:00Z", utc(2026, 11, 30, 12)),
    ("2026-11-30T12:00:00.123Z", utc(2026, 11, 30, 12) + 0.123),
    ("2026-11-30T13:30:00+01:30", utc(2026, 11, 30, 12)),
    ("2026-11-30T07:00:00-0500", utc(2026, 11, 30, 12)),
    ("2026-11-30T14:00:00+02", utc(2026, 11, 30, 12)),
    ("2026-11-30 12:00:00.5+00:00", utc(2026, 11, 30, 12) + 0.5),
    ("2026-11-30t12:00:00z", utc(2026, 11, 30, 12)),
    ("2026-11-30T12:00:00.123456789Z", utc(2026, 11, 30, 12) + 0.123456789),
    ("2026-11-30 12:00:00,250", utc(2026, 11, 30, 12) + 0.25),       # Python logging asctime
    ("2026-11-30T12:00", utc(2026, 11, 30, 12)),
    ("2026-11-30", utc(2026, 11, 30)),
    ("10/Oct/2026:13:55:36 -0700", utc(2026, 10, 10, 20, 55, 36)),   # common log format
    ("10/Oct/2026:13:55:36 +0000", utc(2026, 10, 10, 13, 55, 36)),
    ("10/Oct/2026:13:55:36", utc(2026, 10, 10, 13, 55, 36)),          # no zone: tz
    ("Oct 11 22:14:15", utc(2026, 10, 11, 22, 14, 15)),               # RFC 3164
    ("Oct  1 02:03:04", utc(2026, 10, 1, 2, 3, 4)),
    ("Oct 1 02:03:04", utc(2026, 10, 1, 2, 3, 4)),
    ("Nov 30 11:59:59.250", utc(2026, 11, 30, 11, 59, 59) + 0.25),
    ("  2026-11-30T12:00:00Z \n", utc(2026, 11, 30, 12)),
    ("1796040000", utc(2026, 11, 30, 12)),                            # epoch seconds
    ("1796040000.25", utc(2026, 11, 30, 12) + 0.25),
    ("1796040000250", utc(2026, 11, 30, 12) + 0.25),                  # epoch ms
])
def test_layouts(text: str, expected: float) -> None:
    assert parse_timestamp(text, NOW, "UTC") == pytest.approx(expected, abs=1e-6)


@pytest.mark.parametrize("text", [
    "", "   ", "garbage", "2026-13-01T00:00:00Z", "2026-02-30T00:00:00Z", "2026-11-30T25:00:00Z",
    "2026-11-30T12:61:00Z", "32/Oct/2026:13:55:36 -0700", "10/Foo/2026:13:55:36 -0700",
    "Foo 11 22:14:15", "Oct 32 22:14:15", "Oct 11 22:14", "2026-11-30T12:00:00+25:00",
    "12345", "Tue, 30 Nov 2026 12:00:00 GMT", "2026-11-30T12:00:00Z trailing",
])
def test_unparseable_is_none(text: str) -> None:
    assert parse_timestamp(text, NOW, "UTC") is None


def test_rfc3164_year_rollover_on_new_year() -> None:
    jan1 = utc(2027, 1, 1, 0, 0, 5)
    assert parse_timestamp("Dec 31 23:59:59", jan1, "UTC") == utc(2026, 12, 31, 23, 59, 59)
    assert parse_timestamp("Jan  1 00:00:01", jan1, "UTC") == utc(2027, 1, 1, 0, 0, 1)


def test_rfc3164_up_to_a_day_ahead_stays_in_this_year() -> None:
    # clock skew between writer and reader: under a day ahead is "now", over a day is last year
    assert parse_timestamp("Dec  1 10:00:00", NOW, "UTC") == utc(2026, 12, 1, 10)
    assert parse_timestamp("Dec  2 10:00:00", NOW, "UTC") == utc(2025, 12, 2, 10)


def test_rfc3164_year_is_the_year_in_the_input_zone() -> None:
    # 2026-12-31T23:30Z is already 2027-01-01 00:30 in Berlin
    now = utc(2026, 12, 31, 23, 30)
    assert parse_timestamp("Jan  1 00:29:00", now, "Europe/Berlin") == utc(2026, 12, 31, 23, 29)


def test_rfc3164_feb_29_walks_back_to_a_leap_year() -> None:
    assert parse_timestamp("Feb 29 12:00:00", NOW, "UTC") == utc(2024, 2, 29, 12)


def test_zone_less_times_use_the_input_timezone() -> None:
    berlin_winter = parse_timestamp("2026-11-30 13:00:00", NOW, "Europe/Berlin")
    assert berlin_winter == utc(2026, 11, 30, 12)
    berlin_summer = parse_timestamp("Jul 15 14:00:00", NOW, "Europe/Berlin")
    assert berlin_summer == utc(2026, 7, 15, 12)
    ny = parse_timestamp("10/Oct/2026:08:00:00", NOW, "America/New_York")
    assert ny == utc(2026, 10, 10, 12)
    # an explicit zone wins over the input's timezone
    assert parse_timestamp("2026-11-30T12:00:00Z", NOW, "Asia/Tokyo") == utc(2026, 11, 30, 12)


def test_local_means_the_host_zone() -> None:
    expected = time.mktime((2026, 11, 30, 12, 0, 0, 0, 0, -1))
    assert parse_timestamp("2026-11-30 12:00:00", NOW, "local") == expected
    assert parse_timestamp("2026-11-30 12:00:00", NOW) == expected


def test_unknown_zone_name_falls_back_to_utc_without_raising() -> None:
    assert parse_timestamp("2026-11-30 12:00:00", NOW, "Mars/Olympus") == utc(2026, 11, 30, 12)


def test_format_timestamp() -> None:
    assert format_timestamp(utc(2026, 11, 30, 12)) == "2026-11-30T12:00:00.000Z"
    assert format_timestamp(utc(2026, 11, 30, 12) + 0.123) == "2026-11-30T12:00:00.123Z"
    assert format_timestamp(1796040000123 / 1000) == "2026-11-30T12:00:00.123Z"  # pino ms
    assert format_timestamp(utc(2026, 11, 30, 12) + 0.9999) == "2026-11-30T12:00:00.999Z"
    assert format_timestamp(0) == "1970-01-01T00:00:00.000Z"
    assert format_timestamp(-0.5) == "1969-12-31T23:59:59.500Z"
    # the cached prefix is per second: neighbours must not leak into each other
    assert format_timestamp(utc(2026, 11, 30, 12) + 1.001) == "2026-11-30T12:00:01.001Z"


def test_format_rejects_non_finite() -> None:
    with pytest.raises(ValueError):
        format_timestamp(float("nan"))
    with pytest.raises(ValueError):
        format_timestamp(float("inf"))


def test_round_trip_through_format() -> None:
    for text in ("2026-11-30T12:00:00.123Z", "2024-02-29T23:59:59.999Z", "1999-12-31T00:00:00.000Z"):
        ts = parse_timestamp(text, NOW, "UTC")
        assert ts is not None
        assert format_timestamp(ts) == text


@given(st.text(max_size=60), st.floats(min_value=0, max_value=4e9))
@settings(max_examples=300, deadline=None)
def test_parse_never_raises(text: str, now: float) -> None:
    result = parse_timestamp(text, now, "Europe/Berlin")
    assert result is None or isinstance(result, float)
