"""Unit tests for shipper.parse.multiline: Java and Python traces, caps, timeouts, offsets."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as hs

from shipper.model import FLAG_MULTILINE_CAPPED, FLAG_TRUNCATED, Line
from shipper.parse.multiline import MultilineAggregator

JAVA_START = r"^\d{4}-\d{2}-\d{2}[ T]\d{2}:\d{2}:\d{2}"
PY_START = r"^\d{4}-\d{2}-\d{2} "

JAVA = b"""2026-11-30 12:00:00.001 ERROR [main] c.e.OrderService - order 991 failed
com.example.PaymentException: card declined
\tat com.example.PaymentClient.charge(PaymentClient.java:88)
\tat com.example.OrderService.place(OrderService.java:41)
Caused by: java.net.SocketTimeoutException: Read timed out
\tat java.base/java.net.SocketInputStream.socketRead0(Native Method)
\t... 12 more
2026-11-30 12:00:01.500 INFO  [main] c.e.OrderService - retrying order 991
"""

PY = b"""2026-11-30 12:00:00,120 INFO worker: job 7 started
2026-11-30 12:00:00,388 ERROR worker: job 7 crashed
Traceback (most recent call last):
  File "/srv/app/worker.py", line 41, in run
    result = handler(payload)

  File "/srv/app/handlers.py", line 12, in handler
    raise ValueError(f"bad payload: {payload!r}")
ValueError: bad payload: {'id': 7}
2026-11-30 12:00:01,002 INFO worker: job 8 started
"""


def lines_of(blob: bytes, base: int = 0) -> list[Line]:
    out: list[Line] = []
    pos = base
    for raw in blob.split(b"\n")[:-1]:
        out.append((pos, pos + len(raw) + 1, raw, 0))
        pos += len(raw) + 1
    return out


def feed_all(agg: MultilineAggregator, lines: list[Line], now: float = 100.0) -> list[Line]:
    out: list[Line] = []
    for line in lines:
        out += agg.feed(line, now)
    return out


def test_java_exception_with_caused_by_and_more() -> None:
    agg = MultilineAggregator(JAVA_START)
    lines = lines_of(JAVA)
    events = feed_all(agg, lines)
    assert len(events) == 1
    start, end, data, flags = events[0]
    assert (start, end, flags) == (0, lines[6][1], 0)
    assert data == b"\n".join(line[2] for line in lines[:7])
    assert data.endswith(b"\t... 12 more") and b"\nCaused by: " in data
    assert agg.pending_start == lines[7][0]
    rest = agg.flush()
    assert rest == [(lines[7][0], lines[7][1], lines[7][2], 0)]
    assert agg.pending_start is None and agg.flush() == []


def test_python_traceback_keeps_blank_line_inside() -> None:
    agg = MultilineAggregator(PY_START)
    lines = lines_of(PY, base=1000)
    events = feed_all(agg, lines) + agg.flush()
    assert [e[2].split(b"\n")[0] for e in events] == [lines[0][2], lines[1][2], lines[9][2]]
    trace = events[1]
    assert trace[0] == lines[1][0] and trace[1] == lines[8][1]
    assert b"handler(payload)\n\n  File" in trace[2]          # the blank line is kept
    assert trace[2].endswith(b"ValueError: bad payload: {'id': 7}")
    # every byte of the file is covered by exactly one event's range
    assert [e[0] for e in events[1:]] == [e[1] for e in events[:-1]]


def test_trailing_blank_lines_are_trimmed_but_covered() -> None:
    agg = MultilineAggregator(PY_START)
    lines = lines_of(b"2026-11-30 12:00:00 a\n  b\n\n   \n2026-11-30 12:00:01 c\n")
    events = feed_all(agg, lines)
    assert events == [(0, lines[3][1], b"2026-11-30 12:00:00 a\n  b", 0)]


def test_blank_line_with_nothing_pending_is_no_event() -> None:
    agg = MultilineAggregator(PY_START)
    assert agg.feed((0, 1, b"", 0), 1.0) == []
    assert agg.feed((1, 3, b"\r", 0), 1.0) == []
    assert agg.pending_start is None
    assert agg.flush() == []


def test_continuation_with_nothing_pending_starts_an_event() -> None:
    agg = MultilineAggregator(PY_START)
    lines = lines_of(b"  at the middle of a trace\n  more\n2026-11-30 12:00:00 next\n")
    events = feed_all(agg, lines)
    assert events == [(0, lines[1][1], b"  at the middle of a trace\n  more", 0)]


def test_timeout_counts_from_the_last_line() -> None:
    agg = MultilineAggregator(PY_START, timeout_s=1.0)
    assert agg.next_deadline is None
    agg.feed((0, 20, b"2026-11-30 12:00:00 x", 0), now=10.0)
    agg.feed((20, 30, b"  detail 1", 0), now=10.6)
    assert agg.next_deadline == 11.6
    assert agg.flush_due(11.5) == []              # 1.5 s after the first line, 0.9 s after the last
    assert agg.pending_start == 0
    assert agg.flush_due(11.6) == [(0, 30, b"2026-11-30 12:00:00 x\n  detail 1", 0)]
    assert agg.pending_start is None and agg.next_deadline is None
    assert agg.flush_due(99.0) == []


def test_late_continuation_after_timeout_starts_a_new_event() -> None:
    # feed() applies an overdue timeout first, as if flush_due had run on time
    agg = MultilineAggregator(PY_START, timeout_s=1.0)
    agg.feed((0, 20, b"2026-11-30 12:00:00 x", 0), now=10.0)
    out = agg.feed((20, 30, b"  late line", 0), now=12.0)
    assert out == [(0, 20, b"2026-11-30 12:00:00 x", 0)]
    assert agg.pending_start == 20


def test_max_lines_caps_and_never_drops() -> None:
    agg = MultilineAggregator(PY_START, max_lines=3)
    blob = b"2026-11-30 12:00:00 head\n" + b"".join(b"  line %d\n" % i for i in range(5))
    lines = lines_of(blob)
    events = feed_all(agg, lines) + agg.flush()
    assert [(e[2], e[3]) for e in events] == [
        (b"2026-11-30 12:00:00 head\n  line 0\n  line 1", FLAG_MULTILINE_CAPPED),
        (b"  line 2\n  line 3\n  line 4", FLAG_MULTILINE_CAPPED),
    ]
    assert events[0][1] == events[1][0]           # contiguous: no byte lost
    assert events[1][1] == lines[-1][1]


def test_max_bytes_caps_too() -> None:
    agg = MultilineAggregator(PY_START, max_bytes=30)
    lines = lines_of(b"2026-11-30 12:00:00 head\n  0123456789\n  tail\n")
    events = feed_all(agg, lines) + agg.flush()
    assert [e[2] for e in events] == [b"2026-11-30 12:00:00 head", b"  0123456789\n  tail"]
    assert all(e[3] & FLAG_MULTILINE_CAPPED for e in events)


def test_line_flags_carry_into_the_event() -> None:
    agg = MultilineAggregator(PY_START)
    agg.feed((0, 10, b"2026-11-30 12:00:00 a", 0), 1.0)
    agg.feed((10, 5000, b"  cut" * 10, FLAG_TRUNCATED), 1.0)
    (event,) = agg.flush()
    assert event[3] == FLAG_TRUNCATED


def test_non_ascii_lines_and_pattern() -> None:
    agg = MultilineAggregator(r"^\w+: ")                 # \w must match Unicode letters
    lines = lines_of("Überweisung: fehlgeschlagen\n  Grund: Konto gesperrt\nnächste: ok\n".encode())
    events = feed_all(agg, lines) + agg.flush()
    assert [e[2].decode() for e in events] == [
        "Überweisung: fehlgeschlagen\n  Grund: Konto gesperrt", "nächste: ok"]
    agg = MultilineAggregator(r"^Ошибка")                 # a pattern that is not ASCII
    lines = lines_of("Ошибка 1\n  stack\nОшибка 2\n".encode())
    assert [e[2] for e in feed_all(agg, lines) + agg.flush()] == [
        "Ошибка 1\n  stack".encode(), "Ошибка 2".encode()]


def test_invalid_utf8_does_not_raise() -> None:
    agg = MultilineAggregator(r"^\d")
    lines = lines_of(b"1 \xff\xfe start\n \xc3 cont\n2 next\n")
    events = feed_all(agg, lines)
    assert events == [(0, lines[1][1], b"1 \xff\xfe start\n \xc3 cont", 0)]


# ---------------------------------------------------------------- cuts: a re-read groups as the first read did

def test_a_group_cut_by_its_timeout_is_cut_again_on_a_reread() -> None:
    """The first read cut G by its timeout; the late continuation L became its own event. A re-read
    from before G (kill -9 before the checkpoint passed it) reads them together: with the cut
    replayed, G keeps its text and L its own event, and G goes at once (no second wait)."""
    g_and_l = [(0, 20, b"2026-11-30 12:00:00 x", 0), (20, 30, b"  detail", 0), (30, 40, b"  late", 0)]
    first = MultilineAggregator(PY_START, timeout_s=1.0)
    first.hold(g_and_l[:2], 10.0)
    assert first.release_due(11.0) == ([(0, 30, b"2026-11-30 12:00:00 x\n  detail", 0)], [])
    assert first.take_cuts() == [30] and first.take_cuts() == []
    first.hold(g_and_l[2:], 15.0)
    assert first.release_due(16.0)[0] == [(30, 40, b"  late", 0)]
    assert first.take_cuts() == [40]

    again = MultilineAggregator(PY_START, timeout_s=1.0)
    again.replay([30, 40])
    evs, _ = again.hold(g_and_l, 50.0)
    assert evs == [(0, 30, b"2026-11-30 12:00:00 x\n  detail", 0), (30, 40, b"  late", 0)]
    assert again.pending_start is None and again.take_cuts() == []
    without = MultilineAggregator(PY_START, timeout_s=1.0)
    assert without.hold(g_and_l, 50.0)[0] == [] and without.pending_start == 0   # the hole: one event


def test_a_cut_by_a_late_line_is_recorded_too() -> None:
    agg = MultilineAggregator(PY_START, timeout_s=1.0)
    agg.feed((0, 20, b"2026-11-30 12:00:00 x", 0), now=10.0)
    agg.feed((20, 30, b"  late line", 0), now=12.0)          # overdue: completed as if on time
    assert agg.take_cuts() == [20]
    agg.feed((30, 50, b"2026-11-30 12:00:05 y", 0), now=12.1)  # a start line cuts by the bytes
    assert agg.take_cuts() == []
    assert agg.flush() and agg.take_cuts() == [50]           # the file's end, a stop: by time


_KINDS = {"start": b"2026-11-30 12:00:00 s", "cont": b"  c", "blank": b""}
_step = hs.one_of(
    hs.tuples(hs.just("line"), hs.sampled_from(sorted(_KINDS)), hs.floats(0.0, 2.5)),
    hs.tuples(hs.just("due"), hs.just(""), hs.floats(0.0, 2.5)))


@settings(max_examples=300, deadline=None)
@given(script=hs.lists(_step, max_size=40), max_lines=hs.integers(1, 4))
def test_a_reread_from_any_checkpoint_gives_the_same_events(script: list[tuple[str, str, float]],
                                                            max_lines: int) -> None:
    """A first read at any pace (lines and flush_due calls at times the script says), then a re-read
    from each checkpoint it could have written (the committed offset after each step), all lines
    at one instant with the cuts above that checkpoint replayed: the same events from there on.
    Without the replay a group cut by time and its late continuation come back as one event."""
    first = MultilineAggregator(PY_START, max_lines=max_lines, timeout_s=1.0)
    now, pos = 0.0, 0
    lines: list[Line] = []
    events: list[Line] = []
    checkpoints = [0]
    for what, kind, dt in script:
        now += dt
        if what == "line":
            data = _KINDS[kind] + b"%d" % len(lines) if kind != "blank" else b""
            line = (pos, pos + len(data) + 1, data, 0)
            pos = line[1]
            lines.append(line)
            events += first.feed(line, now)
        else:
            events += first.flush_due(now)
        ps = first.pending_start
        checkpoints.append(pos if ps is None else ps)
    events += first.flush()
    cuts = first.take_cuts()
    for cp in checkpoints:
        again = MultilineAggregator(PY_START, max_lines=max_lines, timeout_s=1.0)
        again.replay([c for c in cuts if c > cp])
        got = [ev for ln in lines if ln[0] >= cp for ev in again.feed(ln, 1000.0)] + again.flush()
        # offsets (the _ids) and texts; not the flags: the event after a cap is flagged capped
        # only when read after it (a re-read from between them sends a 409 of it, never indexed)
        assert [ev[:3] for ev in got] == [ev[:3] for ev in events if ev[0] >= cp], f"re-read from {cp}"
