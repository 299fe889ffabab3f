"""The promptness oracle: each line arrives within a bound of when it was written (issue 41).

Beside "each line exactly once" (tests/support/es.py), every e2e test checks that no line waited:
a stall that ends before the test's own deadline must fail as surely as a loss. A `Timeline` per
test holds three records, each taken where the fact happens, never from shipper's own telling:
  written   when each line's write completed, by its key: the writers (writer.py, journal.py,
            container_writer.py) hand every byte they wrote to `note_written`, which keys a line
            by the `seq` it carries (pino's, or escaped inside a runtime's JSON record);
  arrived   for each document Elasticsearch created, when the bulk request that carried it reached
            Elasticsearch and when the answer came back, by `_id`: `RecordingProxy` (proxy.py)
            sits between every e2e daemon and osmem (tests/e2e/conftest.py);
  serving   when a daemon ran (tests/support/daemon.py reports start, SIGSTOP/SIGCONT, kill, stop)
            and the outages SPEC allows a wait for (the destination down or blocked: FaultProxy
            reports `down`/`up` and `blocked`; a test reports others with `outage()`).
The measure is shipper's own delay. Lines are taken in the order they were written (those of one
write in the order they arrived); a line's clock starts when it was written or, if the line
written before it arrived later, at that arrival (a backlog drains at the destination's pace, one
request after another, but never pauses), and stops when the request carrying it reached
Elasticsearch (the destination's own indexing time is the destination's). Only time in which a
daemon ran and no outage held counts: a line written while the daemon was stopped counts from the
start, a line written during an outage from the outage's end. A line half read and parked, an
entry held back until the next one, a file left for the next rescan: each is a pause of the
pipeline with a line waiting, and fails the bound (DEFAULT_BOUND_S unless a test says why).
"""

from __future__ import annotations

import bisect
import contextlib
import re
import threading
import time
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping
from typing import Any

from tests.support.wait import wait_until

# The tests' config (daemon.write_config) rescans every 0.5 s, flushes a partial batch after 0.2 s
# and backs off at most 1 s; a line normally arrives in well under a second. The rest is slack for
# two cores shared with other test runs. A file parked with a line half read stalls for 10-60 s.
DEFAULT_BOUND_S = 5.0

_SEQ = re.compile(rb'\\?"seq\\?"\s*:\s*(-?\d+)')

Doc = dict[str, Any]


def seqs_in(data: bytes) -> list[int]:
    """The `seq` of every line in `data`: pino's `"seq":N`, also JSON-escaped (`\\"seq\\":N`)."""
    return [int(m.group(1)) for m in _SEQ.finditer(data)]


class Timeline:
    """What one test wrote, what arrived, and when a daemon was serving. Thread-safe: writers,
    the recording proxy's thread and the test's own thread all report into it."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self.written: dict[Hashable, float] = {}        # key -> first write that held it
        # _id (or ("seq", N) for a document sent without one) -> when the request that created it
        # reached Elasticsearch, and when its answer came back
        self.sent: dict[Hashable, float] = {}
        self.arrived: dict[Hashable, float] = {}
        self.in_flight = 0                              # bulk requests the recorder has not noted yet
        self._runs: dict[int, list[list[float]]] = {}   # id(process) -> [[start, end]] (end inf: running)
        self._outages: list[list[Any]] = []             # [start, end, what] (end inf: not over)

    def now(self) -> float:
        return self._clock()

    # ------------------------------------------------------------------ reports

    def wrote(self, keys: Iterable[Hashable], at: float | None = None) -> None:
        """The lines with these keys were written completely by `at` (now). A key written again
        keeps its first time: the bound is never measured from a later copy."""
        t = self.now() if at is None else at
        with self._lock:
            for k in keys:
                self.written.setdefault(k, t)

    def wrote_bytes(self, data: bytes, at: float | None = None) -> None:
        self.wrote(seqs_in(data), at)

    def bulk_sent(self) -> float:
        """A bulk request is on its way to Elasticsearch: the recorder calls `acked(...,
        announced=True)` when it is answered (or failed); until then `assert_prompt` waits for it.
        Returns now."""
        with self._lock:
            self.in_flight += 1
        return self.now()

    def acked(self, ids: Iterable[Hashable], sent_at: float, at: float | None = None, *, announced: bool = False) -> None:
        """Elasticsearch created these `_id`s in a request that reached it at `sent_at` and was
        answered at `at` (now). A document keeps its first creation (later ones are 409s)."""
        t = self.now() if at is None else at
        with self._lock:
            if announced:
                self.in_flight -= 1
            for i in ids:
                if i not in self.arrived:
                    self.sent[i] = sent_at
                    self.arrived[i] = t

    def serving(self, who: object, at: float | None = None) -> None:
        """`who` (a daemon) runs from `at` on: it started, or a SIGCONT woke it."""
        t = self.now() if at is None else at
        with self._lock:
            runs = self._runs.setdefault(id(who), [])
            if not runs or runs[-1][1] != float("inf"):
                runs.append([t, float("inf")])

    def not_serving(self, who: object, at: float | None = None) -> None:
        """`who` stops serving at `at`: a stop signal, kill -9, SIGSTOP, an exit."""
        t = self.now() if at is None else at
        with self._lock:
            runs = self._runs.get(id(who))
            if runs and runs[-1][1] == float("inf"):
                runs[-1][1] = max(t, runs[-1][0])

    def outage_begins(self, what: str, at: float | None = None) -> None:
        t = self.now() if at is None else at
        with self._lock:
            if not any(o[2] == what and o[1] == float("inf") for o in self._outages):
                self._outages.append([t, float("inf"), what])

    def outage_ends(self, what: str, at: float | None = None) -> None:
        t = self.now() if at is None else at
        with self._lock:
            for o in self._outages:
                if o[2] == what and o[1] == float("inf"):
                    o[1] = max(t, o[0])

    @contextlib.contextmanager
    def outage(self, what: str) -> Iterator[None]:
        """An outage SPEC allows a wait for (a full disk, a credential being fixed): lines wait
        while it lasts, and their bound counts from its end."""
        self.outage_begins(what)
        try:
            yield
        finally:
            self.outage_ends(what)

    def not_yet_due(self, keys: Iterable[Hashable], bound_s: float) -> list[Hashable]:
        """Of these keys (lines not in Elasticsearch yet), those written less than `bound_s` of
        counted time ago (`latency`): they may still arrive within their bound, so their absence
        is no loss yet. A key no writer reported is due."""
        now = self.now()
        counted = self._counted()
        with self._lock:
            at = [(k, self.written.get(k)) for k in keys]
        return [k for k, w in at if w is not None and self.latency(w, now, counted) < bound_s]

    # ------------------------------------------------------------------ the measure

    def _counted(self) -> list[tuple[float, float]]:
        """Disjoint, sorted intervals in which latency counts: some daemon serving (always, when no
        daemon ever reported), minus every outage."""
        with self._lock:
            runs = [(a, b) for rs in self._runs.values() for a, b in rs]
            outages = [(o[0], o[1]) for o in self._outages]
        serving = _union(runs) if runs else [(float("-inf"), float("inf"))]
        return _minus(serving, _union(outages))

    def latency(self, start: float, end: float, counted: list[tuple[float, float]] | None = None) -> float:
        """Seconds within [start, end] that count (see `_counted`); 0 when end <= start."""
        spans = self._counted() if counted is None else counted
        total = 0.0
        i = max(bisect.bisect_right([a for a, _ in spans], start) - 1, 0)
        for a, b in spans[i:]:
            if a >= end:
                break
            total += max(0.0, min(b, end) - max(a, start))
        return total

    def _arrival(self, d: Doc) -> Hashable | None:
        """The key the recorder noted `d`'s creation under (its `_id`; ("seq", N) when it was sent
        without one), or None."""
        doc_id: Hashable = d["_id"]
        with self._lock:
            if doc_id in self.arrived:
                return doc_id
            key = ("seq", d["_source"].get("seq"))
            return key if key in self.arrived else None

    def assert_prompt(
        self,
        docs: Iterable[Doc],
        key_fn: Callable[[Doc], Hashable] | None = None,
        *,
        bound_s: float = DEFAULT_BOUND_S,
        written: Mapping[Hashable, float] | Callable[[Doc], float] | None = None,
        examples: int = 8,
    ) -> None:
        """Each of `docs` (hits with `_id`, `_source`) was handed to Elasticsearch within `bound_s`
        (see the module doc for the clock).

        A document's write time is `written` (a mapping by key or a function of the hit) or what
        the writers reported under its key (`key_fn`, default the pino `seq`); its arrival what the
        recording proxy saw. Fails naming the slowest documents, and any document whose write or
        arrival nobody reported (a writer or a path to Elasticsearch the oracle cannot see).
        """
        from tests.support.es import seq_key

        key_fn = key_fn or seq_key
        docs = list(docs)
        # Elasticsearch shows a document (a refresh, a count) before its bulk answer has reached
        # the recording proxy's thread: give the answers in flight a moment to be noted
        wait_until(lambda: self.in_flight == 0 or all(self._arrival(d) is not None for d in docs),
                   lambda: f"the recording proxy's {self.in_flight} bulk answers in flight", timeout_s=30)
        rows: list[tuple[float, float, float, Hashable, str]] = []
        unwritten: list[Hashable] = []
        unseen: list[str] = []
        for d in docs:
            key = key_fn(d)
            if callable(written):
                w: float | None = written(d)
            elif written is not None:
                w = written.get(key)
            else:
                w = self.written.get(key)
            seen = self._arrival(d)
            if w is None:
                unwritten.append(key)
            elif seen is None:
                unseen.append(d["_id"])
            else:
                rows.append((w, self.arrived[seen], self.sent[seen], key, d["_id"]))
        rows.sort(key=lambda r: (r[0], r[1]))
        counted = self._counted()
        slow: list[tuple[float, Hashable, str, float]] = []
        before = float("-inf")           # when the line written before this one arrived
        for w, a, sent, key, doc_id in rows:
            start = max(w, before)
            lat = self.latency(start, sent, counted)
            if lat > bound_s:
                slow.append((lat, key, doc_id, a - w))
            before = a
        problems = []
        if slow:
            slow.sort(key=lambda x: -x[0])
            shown = ", ".join(f"{k!r} ({i}) {lat:.1f}s (arrived {total:.1f}s after its write)"
                              for lat, k, i, total in slow[:examples])
            problems.append(f"{len(slow)} waited longer than {bound_s:g}s in shipper, slowest: {shown}")
        if unwritten:
            problems.append(f"{len(unwritten)} have no write time (no writer reported them), "
                            f"e.g. {sorted(unwritten, key=repr)[:examples]}")
        if unseen:
            problems.append(f"{len(unseen)} were never seen created through the recording proxy, e.g. {unseen[:examples]}")
        if problems:
            raise AssertionError(f"promptness violated ({len(rows) + len(unwritten) + len(unseen)} documents checked): "
                                 + "; ".join(problems))


def _union(spans: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[tuple[float, float]] = []
    for a, b in sorted(spans):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def _minus(spans: list[tuple[float, float]], holes: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[tuple[float, float]] = []
    for a, b in spans:
        start = a
        for h0, h1 in holes:
            if h1 <= start or h0 >= b:
                continue
            if h0 > start:
                out.append((start, h0))
            start = max(start, h1)
        if start < b:
            out.append((start, b))
    return out


# ---------------------------------------------------------------- the test's current timeline

_current: Timeline | None = None


def current() -> Timeline | None:
    return _current


@contextlib.contextmanager
def active(timeline: Timeline) -> Iterator[Timeline]:
    """Writers, daemons and proxies made or used inside report into `timeline`."""
    global _current
    before, _current = _current, timeline
    try:
        yield timeline
    finally:
        _current = before


def note_written(data: bytes) -> None:
    """Writers call this after `data` is completely written (no-op outside a timeline)."""
    tl = _current
    if tl is not None:
        tl.wrote_bytes(data)


def note_serving(who: object, serving: bool) -> None:
    tl = _current
    if tl is not None:
        (tl.serving if serving else tl.not_serving)(who)


def note_outage(what: str, begins: bool) -> None:
    tl = _current
    if tl is not None:
        (tl.outage_begins if begins else tl.outage_ends)(what)
