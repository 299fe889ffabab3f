"""Pure time handling for parsed events: timestamp text -> epoch seconds (ISO 8601 / RFC 3339, the
common log format, RFC 3164), epoch -> `@timestamp`. Never reads the clock (`now` is passed in) and
never raises on bad text (None instead)."""

from __future__ import annotations

import math
import re
import time
from datetime import UTC, datetime
from functools import lru_cache
from zoneinfo import ZoneInfo

__all__ = ["parse_timestamp", "format_timestamp"]

_MONTHS = {m: i for i, m in enumerate(
    ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"), start=1)}
_DAYS_IN_MONTH = (0, 31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)
_DAY_S = 86400
_POW10 = tuple(10.0 ** i for i in range(10))
_CACHE_MAX = 4096

# 2026-11-30T12:00:00.123+01:00, 2026-11-30 12:00:00,123 (Python logging), 2026-11-30T12:00Z, 2026-11-30
_ISO_RE = re.compile(
    r"(\d{4})-(\d{2})-(\d{2})"
    r"(?:[Tt ](\d{2}):(\d{2})(?::(\d{2})(?:[.,](\d{1,9})\d*)?)?)?"
    r" ?([Zz]|UTC|GMT|[+-]\d{2}(?::?\d{2})?)?")
_FRACTION_RE = re.compile(r"[.,](\d+)")
# 10/Oct/2026:13:55:36 -0700
_CLF_RE = re.compile(
    r"(\d{1,2})/([A-Za-z]{3})/(\d{4}):(\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,9})\d*)?"
    r"(?: ?([Zz]|[+-]\d{2}:?\d{2}))?")
# Oct 11 22:14:15, Oct  1 02:03:04.123
_RFC3164_RE = re.compile(r"([A-Za-z]{3}) {1,2}(\d{1,2}) (\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,9})\d*)?")
# 1764504000 / 1764504000.123 (seconds) or 1764504000123 (milliseconds): nginx $msec, exporters
_EPOCH_RE = re.compile(r"(\d{9,10})(?:\.(\d{1,9}))?|(\d{12,13})")

_parsed: dict[tuple[str, str], float | None] = {}          # zone-complete texts: no `now` needed
_offsets: dict[tuple[str, int, int, int, int], int] = {}   # (tz, y, m, d, h) -> UTC offset, s
_prefixes: dict[int, str] = {}                             # epoch second -> "YYYY-MM-DDTHH:MM:SS"
_MS_SUFFIX = tuple(f".{i:03d}Z" for i in range(1000))
_rfc3164_candidates: dict[tuple[str, str, int], tuple[float, ...]] = {}
_year_spans: dict[str, tuple[float, float, int]] = {}      # tz -> [start, end) of a year, year


def parse_timestamp(text: str, now: float, tz: str = "local") -> float | None:
    """Epoch seconds for `text`, or None when no known layout matches (never raises).

    `now` (epoch seconds) only matters for RFC 3164, which has no year: the year of `now` in
    `tz`, or the one before when that would put the time more than a day after `now`.
    Times without a zone are in `tz`: "local" (the host's zone), "UTC" or an IANA name.
    Also accepted: bare epoch numbers (10 digits seconds with optional fraction, 13 digits ms).
    """
    if not text or not isinstance(text, str):
        return None
    s = text.strip()
    if not s:
        return None
    c = s[0]
    if "0" <= c <= "9":
        if len(s) > 20 and s[19] in ".," and s[4] == "-":
            # ISO with a fraction: most lines have their own, so cache the whole second
            m = _FRACTION_RE.match(s, 19)
            if m is not None:
                whole = parse_timestamp(s[:19] + s[m.end():], now, tz)
                if whole is None:
                    return None
                frac = m.group(1)[:9]
                return whole + int(frac) / _POW10[len(frac)]
        key = (s, tz)
        hit = _parsed.get(key, _parsed)
        if hit is not _parsed:
            return hit  # type: ignore[return-value]
        try:
            result = _parse_numeric(s, tz)
        except (ValueError, OverflowError, KeyError):
            result = None
        if len(_parsed) >= _CACHE_MAX:
            _parsed.clear()
        _parsed[key] = result
        return result
    try:
        return _parse_rfc3164(s, now, tz)
    except (ValueError, OverflowError, KeyError):
        return None


def format_timestamp(epoch_s: float) -> str:
    """`2026-11-30T12:00:00.123Z`: UTC, milliseconds (truncated, like Elasticsearch does).

    Raises ValueError for NaN or infinity; the per-second prefix is cached.
    """
    try:
        ms_total = math.floor(epoch_s * 1000.0 + 1e-3)  # 1e-3 ms absorbs float error in x.123
    except OverflowError:
        raise ValueError(f"not a finite time: {epoch_s!r}") from None
    sec, ms = divmod(ms_total, 1000)
    prefix = _prefixes.get(sec)
    if prefix is None:
        t = time.gmtime(sec)
        prefix = (f"{t.tm_year:04d}-{t.tm_mon:02d}-{t.tm_mday:02d}"
                  f"T{t.tm_hour:02d}:{t.tm_min:02d}:{t.tm_sec:02d}")
        if len(_prefixes) >= _CACHE_MAX:
            _prefixes.clear()
        _prefixes[sec] = prefix
    return prefix + _MS_SUFFIX[ms]


# ---------------------------------------------------------------- layouts

def _parse_numeric(s: str, tz: str) -> float | None:
    if "/" in s[1:3]:
        m = _CLF_RE.fullmatch(s)
        if m is None:
            return None
        d, mon, y, hh, mi, ss, frac, zone = m.groups()
        return _assemble(int(y), _MONTHS[mon.lower()], int(d), int(hh), int(mi), int(ss),
                         frac, zone, tz)
    m = _ISO_RE.fullmatch(s)
    if m is not None:
        y, mo, d, hh, mi, ss, frac, zone = m.groups()
        return _assemble(int(y), int(mo), int(d), int(hh or 0), int(mi or 0), int(ss or 0),
                         frac, zone, tz)
    m = _EPOCH_RE.fullmatch(s)
    if m is not None:
        if m.group(3) is not None:
            return int(m.group(3)) / 1000.0
        return int(m.group(1)) + (float("0." + m.group(2)) if m.group(2) else 0.0)
    return None


def _parse_rfc3164(s: str, now: float, tz: str) -> float | None:
    # The year of `now` in `tz`, or the one before when that would put the time more than a
    # day after `now` (Dec 31 read on Jan 1). Candidates are cached per (text, tz, year).
    year_now = _year_in_zone(now, tz)
    key = (s, tz, year_now)
    candidates = _rfc3164_candidates.get(key)
    if candidates is None:
        candidates = _rfc3164_years(s, year_now, tz)
        if len(_rfc3164_candidates) >= _CACHE_MAX:
            _rfc3164_candidates.clear()
        _rfc3164_candidates[key] = candidates
    for ts in candidates:
        if ts <= now + _DAY_S:
            return ts
    return None


def _rfc3164_years(s: str, year_now: int, tz: str) -> tuple[float, ...]:
    """The time in `year_now` and in the year before; Feb 29 walks back to leap years."""
    m = _RFC3164_RE.fullmatch(s)
    if m is None:
        return ()
    mon, d, hh, mi, ss, frac = m.groups()
    month = _MONTHS.get(mon.lower())
    if month is None:
        return ()
    day, hour, minute, second = int(d), int(hh), int(mi), int(ss)
    out: list[float] = []
    for year in range(year_now, year_now - 9, -1):
        ts = _assemble(year, month, day, hour, minute, second, frac, None, tz)
        if ts is None:
            if month == 2 and day == 29:
                continue
            return ()
        out.append(ts)
        if len(out) == 2:
            break
    return tuple(out)


def _assemble(y: int, mo: int, d: int, hh: int, mi: int, ss: int,
              frac: str | None, zone: str | None, tz: str) -> float | None:
    if not (1 <= mo <= 12 and 1 <= d and hh <= 23 and mi <= 59 and ss <= 60 and y >= 1):
        return None
    if d > _DAYS_IN_MONTH[mo] and not (mo == 2 and d == 29 and _is_leap(y)):
        return None
    naive = _days_from_civil(y, mo, d) * _DAY_S + hh * 3600 + mi * 60 + ss
    if zone is None:
        naive -= _zone_offset_s(tz, y, mo, d, hh)
    elif zone not in ("Z", "z", "UTC", "GMT"):
        sign = -1 if zone[0] == "-" else 1
        digits = zone[1:].replace(":", "")
        off_min = int(digits[:2]) * 60 + (int(digits[2:4]) if len(digits) >= 4 else 0)
        if off_min > 18 * 60:
            return None
        naive -= sign * off_min * 60
    if frac:
        return naive + int(frac) / _POW10[len(frac)]
    return float(naive)


def _is_leap(y: int) -> bool:
    return y % 4 == 0 and (y % 100 != 0 or y % 400 == 0)


def _days_from_civil(y: int, m: int, d: int) -> int:
    """Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's algorithm)."""
    if m <= 2:
        y -= 1
    era = y // 400
    yoe = y - era * 400
    doy = (153 * (m - 3 if m > 2 else m + 9) + 2) // 5 + d - 1
    doe = yoe * 365 + yoe // 4 - yoe // 100 + doy
    return era * 146097 + doe - 719468


# ---------------------------------------------------------------- zones

@lru_cache(maxsize=64)
def _zone(tz: str) -> ZoneInfo | None:
    """The IANA zone, or None for UTC (also the fallback for a name the host does not know)."""
    if tz in ("UTC", "utc", "Z"):
        return None
    try:
        return ZoneInfo(tz)
    except Exception:
        return None


def _zone_offset_s(tz: str, y: int, mo: int, d: int, hh: int) -> int:
    """UTC offset of wall-clock hour (y, mo, d, hh) in `tz`. Cached per hour: zones change
    their offset on whole hours (the ambiguous hour after a DST change reads as the first)."""
    if tz == "UTC":
        return 0
    key = (tz, y, mo, d, hh)
    off = _offsets.get(key)
    if off is not None:
        return off
    if tz == "local":
        wall = _days_from_civil(y, mo, d) * _DAY_S + hh * 3600
        try:
            off = wall - int(time.mktime((y, mo, d, hh, 0, 0, 0, 0, -1)))
        except (OverflowError, ValueError):
            off = 0
    else:
        zone = _zone(tz)
        delta = datetime(y, mo, d, hh, tzinfo=zone).utcoffset() if zone is not None else None
        off = int(delta.total_seconds()) if delta is not None else 0
    if len(_offsets) >= _CACHE_MAX:
        _offsets.clear()
    _offsets[key] = off
    return off


def _year_in_zone(now: float, tz: str) -> int:
    span = _year_spans.get(tz)
    if span is not None and span[0] <= now < span[1]:
        return int(span[2])
    if tz == "local":
        year = time.localtime(now).tm_year
    else:
        zone = _zone(tz)
        year = datetime.fromtimestamp(now, zone if zone is not None else UTC).year
    lo = _assemble(year, 1, 1, 0, 0, 0, None, None, tz)
    hi = _assemble(year + 1, 1, 1, 0, 0, 0, None, None, tz)
    if lo is not None and hi is not None:
        _year_spans[tz] = (lo, hi, year)
    return year
