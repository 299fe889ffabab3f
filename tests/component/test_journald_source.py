"""JournaldSource against real journal files: entries into the draft with their cursor as the
checkpoint, the room bounding a read round, multiline groups keeping the position before them,
stop, start_at end, resuming from a stored checkpoint, the status row; and build_pipeline giving
files only the file inputs."""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest

from shipper.clock import SystemClock
from shipper.config import Config, InputConfig, JournaldConfig, MultilineConfig
from shipper.events import Events
from shipper.model import Checkpoint, Draft, is_journal_checkpoint
from shipper.sources.base import Room
from shipper.sources.journald.cursor import journal_key, parse_cursor
from shipper.sources.journald.source import JournaldSource
from tests.support.journal import Journal, journal_remote

pytestmark = pytest.mark.skipif(journal_remote() is None, reason="systemd-journal-remote is not installed")

ROOM = Room(max_events=2000, max_bytes=8 * 1024 * 1024, full_events=1800)
TIMEOUT_S = 10.0


class Writer:
    """The draft writer as a source sees it: a draft, and `stage`; `take` is a commit."""

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

    def take(self) -> Draft:
        d, self.draft = self.draft, Draft()
        return d


def make(j: Journal, checkpoint: Checkpoint | None = None, **inp: Any) -> tuple[JournaldSource, Writer]:
    the_input = InputConfig(paths=(), journald=JournaldConfig(directory=str(j.directory),
                                                              units=inp.pop("units", ())), **inp)
    cfg = Config(inputs=(the_input,))
    w = Writer()
    return JournaldSource(cfg, 0, checkpoint, w, Events(), SystemClock(), "shipper-host"), w


async def read_until(src: JournaldSource, w: Writer, wake: asyncio.Event, events: int,
                     room: Room = ROOM) -> None:
    """Read rounds (each after a wake-up) until the draft holds `events` documents."""
    deadline = time.monotonic() + TIMEOUT_S
    while w.draft.events < events:
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {events} events in the draft (have {w.draft.events})")
        try:
            await asyncio.wait_for(wake.wait(), 0.5)
        except TimeoutError:
            pass
        wake.clear()
        src.read_round(room, time.time(), time.monotonic())


def cursors(j: Journal) -> list[str]:
    return [e["__CURSOR"] for e in j.read()]


def ids(draft: Draft) -> list[str]:
    return [orjson.loads(p.split(b"\n", 1)[0])["create"]["_id"] for p in draft.parts]


async def test_entries_go_into_the_draft_with_their_cursor_as_the_checkpoint(tmp_path: Path) -> None:
    j = Journal(tmp_path / "j")
    j.append(*[f"m{i}" for i in range(30)])
    src, w = make(j)
    wake = asyncio.Event()
    await src.start(wake)
    try:
        await read_until(src, w, wake, 30)
        cs = cursors(j)
        key = journal_key(str(j.directory), ())
        cp = w.draft.checkpoints[key]
        last = parse_cursor(cs[-1])
        assert last is not None
        assert (cp.incarnation, cp.path, cp.cursor, cp.offset) == (key, f"journald:{j.directory}", cs[-1], last.seqnum)
        assert (cp.dev, cp.inode, cp.fp_len, cp.fp) == (0, 0, 0, "") and is_journal_checkpoint(cp)
        assert w.draft.covers == {key: [0, 30]}
        assert ids(w.draft) == [f"j-{last.seqnum_id}-{i}" for i in range(1, 31)]
        assert src.read_total == 30 and src.status({}, []) == []
        # a checkpoint goes through the spool as a dict: the cursor with it
        assert Checkpoint.from_dict(cp.to_dict()) == cp
        assert "cursor" not in Checkpoint("abc", "/f", 1, 2, 0, "", 0).to_dict()
    finally:
        await src.stop()


async def test_the_room_bounds_a_read_round(tmp_path: Path) -> None:
    j = Journal(tmp_path / "j")
    j.append(*[f"m{i}" for i in range(50)])
    src, w = make(j)
    wake = asyncio.Event()
    await src.start(wake)
    small = Room(max_events=10, max_bytes=8 * 1024 * 1024, full_events=9)
    try:
        await asyncio.wait_for(wake.wait(), TIMEOUT_S)
        while src.buffered < 50:                           # every entry read from the child
            wake.clear()
            await asyncio.wait_for(wake.wait(), TIMEOUT_S)
        p = src.read_round(small, time.time(), time.monotonic())
        assert (w.draft.events, p.read, p.backlog) == (10, True, True)
        first = w.take()
        p = src.read_round(small, time.time(), time.monotonic())
        assert w.draft.events == 10 and p.backlog
        # the second draft's range starts where the first one's ended
        key = src.key
        assert first.covers[key][1] == w.draft.covers[key][0]
    finally:
        await src.stop()


async def test_a_full_buffer_stops_reading_the_child_until_entries_are_taken(tmp_path: Path) -> None:
    j = Journal(tmp_path / "j")
    j.append(*[f"m{i}" for i in range(2000)])
    src, w = make(j)
    src.max_buffer_entries = 100
    wake = asyncio.Event()
    await src.start(wake)
    try:
        deadline = time.monotonic() + TIMEOUT_S
        while not src.is_reading_paused:
            assert time.monotonic() < deadline, "timed out waiting for the reader to pause"
            await asyncio.sleep(0.01)
        # at most one read of the child's output beyond the bound (a 256 KiB chunk of short entries)
        assert 100 <= src.buffered <= 100 + 1500 and src.read_total == 0
        await read_until(src, w, wake, 2000)                   # taking makes room: it reads on
        assert ids(w.draft)[-1].endswith("-2000") and w.draft.events == 2000
    finally:
        await src.stop()


async def test_a_held_multiline_group_keeps_the_position_before_it(tmp_path: Path) -> None:
    j = Journal(tmp_path / "j")
    j.append("start A", "  continued", "start B", "  B goes on")
    src, w = make(j, multiline=MultilineConfig(start=r"^\S", timeout_s=30.0))
    wake = asyncio.Event()
    await src.start(wake)
    try:
        await read_until(src, w, wake, 1)
        cs = cursors(j)
        assert w.draft.events == 1 and b'"message":"start A\\n  continued"' in w.draft.parts[0]
        assert w.draft.checkpoints[src.key].cursor == cs[1]       # B is held: not beyond it
        d = w.take()
        await src.stop()                                          # held groups are not completed at stop
        assert w.draft.events == 0 and src.key not in w.draft.checkpoints
        assert d.covers[src.key] == [0, 2]
    finally:
        await src.stop()


async def test_a_quiet_group_goes_at_its_timeout_while_other_pids_keep_writing(tmp_path: Path) -> None:
    """The timeout counts from the group's own last entry as shipper read it: another PID's entries
    arriving every 0.1 s (a busy host's journal, `units: []`) neither hold it nor push it back."""
    j = Journal(tmp_path / "j")
    timeout_s = 0.5
    src, w = make(j, multiline=MultilineConfig(start=r"^\S", timeout_s=timeout_s))
    wake = asyncio.Event()
    await src.start(wake)
    stop = threading.Event()

    def other_pid() -> None:
        n = 0
        while not stop.wait(0.1):
            j.append(j.entry(f"tick {n}", pid=2))
            n += 1

    writer = threading.Thread(target=other_pid, name="other pid")
    writer.start()
    try:
        j.append(j.entry("Error: boom", pid=1), j.entry("    at app.js:1", pid=1))
        written = time.monotonic()
        group = b'"message":"Error: boom\\n    at app.js:1"'
        while not any(group in p for p in w.draft.parts):
            assert time.monotonic() - written < timeout_s + 2.0, "the quiet group was held while PID 2 wrote"
            dl = src.next_deadline()
            wait_s = 0.05 if dl is None else min(0.05, max(0.0, dl - time.monotonic()))
            try:
                await asyncio.wait_for(wake.wait(), wait_s)
            except TimeoutError:
                pass
            wake.clear()
            now = time.monotonic()
            src.read_round(ROOM, time.time(), now)
            src.flush_due(now)
        assert not stop.is_set() and writer.is_alive()             # it went while PID 2 still wrote
    finally:
        stop.set()
        writer.join()
        await src.stop()


async def test_stop_takes_what_the_child_printed(tmp_path: Path) -> None:
    j = Journal(tmp_path / "j")
    j.append(*[f"m{i}" for i in range(20)])
    src, w = make(j)
    wake = asyncio.Event()
    await src.start(wake)
    await asyncio.wait_for(wake.wait(), TIMEOUT_S)
    while src.buffered < 20:
        wake.clear()
        await asyncio.wait_for(wake.wait(), TIMEOUT_S)
    await src.stop()
    assert w.draft.events == 20 and w.draft.checkpoints[src.key].cursor == cursors(j)[-1]
    assert src.reader.pid is None


async def test_start_at_end_stages_the_newest_entry_as_the_position(tmp_path: Path) -> None:
    j = Journal(tmp_path / "j")
    j.append(*[f"old{i}" for i in range(5)])
    src, w = make(j, start_at="end")
    wake = asyncio.Event()
    await src.start(wake)
    try:
        assert w.draft.checkpoints[src.key].cursor == cursors(j)[-1] and w.draft.events == 0
        w.take()
        j.append("new1", "new2")
        await read_until(src, w, wake, 2)
        assert w.draft.events == 2 and all(b'"message":"new' in p for p in w.draft.parts)
    finally:
        await src.stop()


async def test_a_stored_checkpoint_resumes_after_its_entry(tmp_path: Path) -> None:
    j = Journal(tmp_path / "j")
    j.append(*[f"m{i}" for i in range(40)])
    cs = cursors(j)
    c = parse_cursor(cs[9])
    assert c is not None
    stored = Checkpoint(journal_key(str(j.directory), ()), f"journald:{j.directory}", 0, 0, 0, "", c.seqnum,
                        cursor=cs[9])
    src, w = make(j, stored)
    wake = asyncio.Event()
    await src.start(wake)
    try:
        await read_until(src, w, wake, 30)
        assert ids(w.draft)[0] == f"j-{c.seqnum_id}-11" and w.draft.events == 30
        assert w.draft.covers[src.key] == [10, 40]
    finally:
        await src.stop()


async def test_the_status_row_counts_the_lag_from_what_is_acknowledged(tmp_path: Path) -> None:
    j = Journal(tmp_path / "j")
    j.append(*[f"m{i}" for i in range(30)])
    src, w = make(j, units=("app.service",))
    wake = asyncio.Event()
    await src.start(wake)
    try:
        await read_until(src, w, wake, 30)
        cs = cursors(j)
        deadline = time.monotonic() + TIMEOUT_S
        while src.journal_status({}, []).lag_entries is None and time.monotonic() < deadline:
            await asyncio.sleep(0.02)                           # the first look at the journal's head
        row = src.journal_status({}, [])
        assert (row.cursor, row.lag_entries, row.units) == (cs[-1], 30, ("app.service",))   # read, not queued
        d = w.take()
        row = src.journal_status({src.key: 0}, [d])                # queued, not acknowledged
        assert row.lag_entries == 30 and row.shipped_cursor is None
        row = src.journal_status({}, [])                           # acknowledged
        assert (row.lag_entries, row.shipped_cursor, row.lag_seconds) == (0, cs[-1], 0.0)
        assert row.to_dict()["directory"] == str(j.directory)
    finally:
        await src.stop()


async def test_build_pipeline_gives_files_only_the_file_inputs(tmp_path: Path) -> None:
    from shipper.service import build_pipeline, open_state
    from shipper.sources.files import FileSource
    j = Journal(tmp_path / "j")
    j.append("x")
    logs = tmp_path / "logs"
    logs.mkdir()
    file_input = InputConfig(paths=(str(logs / "*.log"),))
    journal_input = InputConfig(paths=(), journald=JournaldConfig(directory=str(j.directory)))
    cfg = Config(state_dir=str(tmp_path / "state"), inputs=(journal_input, file_input))
    spool = await open_state(cfg.state_dir, SystemClock())
    key = journal_key(str(j.directory), ())
    stored = Checkpoint(key, f"journald:{j.directory}", 0, 0, 0, "", 1, cursor=cursors(j)[0])
    file_cp = Checkpoint("0123456789ab", str(logs / "a.log"), 1, 2, 0, "", 5)
    await spool.commit([], {}, [stored, file_cp], False)
    try:
        p, files = await build_pipeline(cfg, spool, Events(), SystemClock(), "h")
        (f, jsrc) = p.sources
        assert f is files and isinstance(f, FileSource) and isinstance(jsrc, JournaldSource)
        assert isinstance(files, FileSource)
        assert files.cfg.inputs == (file_input,)
        assert [cp.incarnation for cp in files.catalog] == ["0123456789ab"]
        assert jsrc.cp.cursor == stored.cursor
        # a journal checkpoint the writer stores is not indexed as a file's
        for hook in p.writer.checkpoints_written:
            hook([stored])
        assert files.catalog.get(key) is None
    finally:
        await spool.close()
