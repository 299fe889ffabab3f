"""A model test of reading the journal (issue 41): JournaldSource (its journalctl child, the pump,
read rounds) on real journal files that systemd-journal-remote appends to in runs.

Hypothesis draws runs of entries of one unit among other units' ones: pino lines, text, text of
several lines, binary, entries of every size up to past `max_line_bytes`, from two PIDs, with and
without multiline grouping. After each run the property is checked on what the run wrote, the last
entry of the run included (nothing is written after it until it has arrived): every entry of the
unit is in the draft within BOUND_S of real time after journal-remote returned (multiline: after
its group's timeout), once; an entry over `max_line_bytes` cut and flagged, the next one in time.
Some runs end with their unit's entry caught mid-write (`Journal.append_caught`): journalctl looks
while the entry is counted in the file but not yet listed under its unit, and never prints it on
its own; it arrives within CAUGHT_BOUND_S all the same (the source sees the files settle short of it).
Real time, not the fake clock: the journalctl child answers in real time, and what is measured is
that nothing waits for a later entry or a poll.
"""

from __future__ import annotations

import asyncio
import dataclasses
import re
import time
from collections.abc import Callable
from pathlib import Path

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shipper.clock import SystemClock
from shipper.config import Config, InputConfig, JournaldConfig, MultilineConfig
from shipper.events import Events
from shipper.model import Checkpoint, Draft
from shipper.sources.base import Room
from shipper.sources.journald import quiet
from shipper.sources.journald.source import JournaldSource
from tests.support.journal import Journal, journal_remote

pytestmark = pytest.mark.skipif(journal_remote() is None, reason="systemd-journal-remote is not installed")

MAX_LINE = 64 * 1024
ML_TIMEOUT_S = 0.2
# journal-remote has returned: journalctl sees the file change (inotify), prints, the pump reads and
# wakes the reader. Milliseconds; an entry held for the next one waited for the next run.
BOUND_S = 1.0
# journalctl holds the entry back: the source sees the headers change (at most POLL_S), waits until
# they settled (QUIET_S, looked at every ACTIVE_POLL_S), looks at the head and restarts journalctl
CAUGHT_BOUND_S = quiet.POLL_S + quiet.QUIET_S + 2 * quiet.ACTIVE_POLL_S + BOUND_S
ROOM = Room(max_events=2000, max_bytes=32 * 1024 * 1024, full_events=1800)
TOKEN = re.compile(rb"([KC])(\d+)\1")


class Writer:
    """The draft writer as a source sees it."""

    def __init__(self) -> None:
        self.draft = Draft()

    def stage(self, cp: Checkpoint) -> None:
        self.draft.checkpoints[cp.incarnation] = dataclasses.replace(cp)

    async def forget(self, pick: Callable[[set[str]], list[str]]) -> list[str]:
        return []

    def must_spool(self, incarnation: str) -> None:
        raise AssertionError("a journal is not a file that goes away")

    def must_store(self, cp: Checkpoint) -> None:
        raise AssertionError("a journal's _ids come from its cursors, not from an incarnation")


Entry = tuple[str, str, int, int]      # (kind, unit, pid, size)

entries = st.tuples(
    st.sampled_from(["pino", "text", "lines", "binary", "cont"]),
    st.sampled_from(["app.service", "app.service", "db.service"]),
    st.sampled_from([100, 200]),
    st.one_of(st.integers(0, 200), st.integers(200, 20_000), st.integers(20_000, MAX_LINE + 30_000)),
)
# a run, and whether its last entry (when it is the unit's) is caught mid-write
runs = st.lists(st.tuples(st.lists(entries, min_size=1, max_size=12), st.booleans()), min_size=1, max_size=5)


def message(kind: str, n: int, size: int, multiline: bool) -> str | bytes:
    """An entry's MESSAGE carrying its token (K: starts an event, C: continues one under multiline)."""
    pad = "x" * size
    if kind == "pino":
        return orjson.dumps({"level": 30, "time": 1_790_000_000_000 + n, "seq": n, "msg": f"K{n}K {pad}"}).decode()
    if kind == "lines":
        return f"K{n}K Error: failed\n    at run (/srv/app.js:1:1)\n{pad}"
    if kind == "binary":
        return f"K{n}K bin ".encode() + b"\xff\xfe" + pad.encode()
    if kind == "cont" and multiline:
        return f"    C{n}C at frame {pad}"
    return f"K{n}K {pad}"


async def check_script(tmp: Path, script: list[tuple[list[Entry], bool]], multiline: bool) -> None:
    j = Journal(tmp / "journal")
    ml = MultilineConfig(start="^K", max_lines=500, timeout_s=ML_TIMEOUT_S) if multiline else None
    the_input = InputConfig(paths=(), journald=JournaldConfig(directory=str(j.directory), units=("app.service",)),
                            max_line_bytes=MAX_LINE, multiline=ml)
    w = Writer()
    src = JournaldSource(Config(inputs=(the_input,)), 0, None, w, Events(), SystemClock(), "model")
    wake = asyncio.Event()
    seen: dict[bytes, list[float]] = {}                 # token -> when each document holding it was taken
    cut: dict[bytes, bool] = {}                         # token -> its document was flagged truncated
    n_parts = 0

    def take_round() -> None:
        nonlocal n_parts
        src.read_round(ROOM, time.time(), time.monotonic())
        src.flush_due(time.monotonic())
        now = time.monotonic()
        for part in w.draft.parts[n_parts:]:
            doc = part.split(b"\n", 1)[1]
            truncated = "truncated" in (orjson.loads(doc).get("log", {}).get("flags") or [])
            for tok in {m.group(0) for m in TOKEN.finditer(doc)}:     # pino's msg is message too
                seen.setdefault(tok, []).append(now)
                cut[tok] = truncated
        n_parts = len(w.draft.parts)

    await src.start(wake)
    n = 0
    flagged: dict[bytes, bool] = {}
    try:
        for run, caught in script:
            batch, mine = [], []
            for kind, unit, pid, size in run:
                n += 1
                msg = message(kind, n, size, multiline)
                batch.append(j.entry(msg, unit=unit, pid=pid))
                tok = TOKEN.search(msg.encode() if isinstance(msg, str) else msg)
                if unit == "app.service" and tok is not None:
                    mine.append(tok.group(0))
                    raw = msg.encode() if isinstance(msg, str) else msg
                    flagged[tok.group(0)] = len(raw) > MAX_LINE
            follower = src.reader.pid
            caught = caught and run[-1][1] == "app.service" and follower is not None
            if caught and follower is not None:
                # in a thread: the loop goes on draining journalctl's pipe (an output over the pipe's
                # 64 KiB would otherwise hold journalctl in write(), never back in ppoll)
                await asyncio.to_thread(j.append_caught, follower, *batch)
            else:
                j.append(*batch)
            written = time.monotonic()
            # a continuation cut off its event by the cut of an over-long one is in no document
            due = [t for t in mine if not (t.startswith(b"C") and multiline and _after_cut(t, flagged, mine))]
            bound = (CAUGHT_BOUND_S if caught else BOUND_S) + (ML_TIMEOUT_S if multiline else 0.0)
            deadline = written + bound + 5.0
            while any(t not in seen for t in due) and time.monotonic() < deadline:
                timeout = bound
                dl = src.next_deadline()
                if dl is not None:
                    timeout = min(timeout, max(0.005, dl - time.monotonic()))
                try:
                    await asyncio.wait_for(wake.wait(), timeout)
                except TimeoutError:
                    pass
                wake.clear()
                take_round()
            late = {t: round(seen[t][0] - written, 3) for t in due if t in seen and seen[t][0] - written > bound}
            missing = [t for t in due if t not in seen]
            assert not missing and not late, (f"entries of the run not taken within {bound}s of journal-remote "
                                              f"returning: missing {missing[:5]}, late {late}")
    finally:
        await src.stop()
    twice = {t: len(v) for t, v in seen.items() if len(v) > 1}
    assert not twice, f"entries taken twice: {twice}"
    if not multiline:                   # an entry over max_line_bytes is cut and flagged, the others whole
        wrong = {t: (flagged[t], cut[t]) for t in flagged if t in cut and flagged[t] != cut[t]}
        assert not wrong, f"(over max_line_bytes, flagged truncated) disagree: {wrong}"


def _after_cut(tok: bytes, flagged: dict[bytes, bool], mine: list[bytes]) -> bool:
    """Under multiline, a continuation that follows an over-long event may be beyond its cut."""
    i = mine.index(tok)
    return any(flagged.get(t, False) for t in mine[:i] if t.startswith(b"K"))


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                 HealthCheck.too_slow, HealthCheck.data_too_large])
@given(script=runs, multiline=st.booleans())
def test_the_last_entry_of_every_run_is_taken_without_waiting_for_the_next(
        tmp_path_factory: pytest.TempPathFactory, script: list[tuple[list[Entry], bool]], multiline: bool) -> None:
    asyncio.run(check_script(tmp_path_factory.mktemp("jmodel"), script, multiline))


def test_the_issue_s_runs(tmp_path: Path) -> None:
    """The issue's shape, small: pino entries of the unit, text ones of several lines, other units'
    entries between them, in runs; the last entry of each run is its unit's."""
    runs_: list[tuple[list[Entry], bool]] = []
    for r in range(6):
        run: list[Entry] = []
        for i in range(40):
            run.append(("lines" if i == 17 and r % 2 else "pino", "app.service", 100, 100))
            run.append(("text", "db.service", 300, 50))
        run.append(("pino", "app.service", 100, 120))
        runs_.append((run, r == 5))             # the last run's last entry caught mid-write
    asyncio.run(check_script(tmp_path, runs_, multiline=False))
    asyncio.run(check_script(tmp_path / "ml", runs_, multiline=True))


