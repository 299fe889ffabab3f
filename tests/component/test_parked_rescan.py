"""The rescan and parked files while inotify names every write (`WatchedWrites.known_for_scan`).

A parked file (closed, read to its end) in a directory the rescan finds unchanged is not stat'ed
again: inotify names a write to it, and the tick reopens it. The Scanner's scans that reuse
nothing (one in FULL_EVERY) stat it still, so a write no event names (here: through a hard link
in a directory nobody watches) is found within a minute at the default scan_interval; a named
write is found by the rescan itself even when no tick ran; after lost events every parked file is
stat'ed; a file once written behind inotify's back is stat'ed at every scan.

Real files, the real inotify watcher on the running loop, the rig's pipeline under the fake clock;
the Scanner runs on a wall clock 10 s ahead and the directories are stamped with mtimes of their
own (tests/component/test_scan.py), so listings are reused as on a host where scans are seconds
apart. The lstat calls of the scan thread are counted by a spy on discovery's `os.lstat`.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from shipper.tail import watch
from shipper.tail.scan import FULL_EVERY, Scanner
from tests.component.test_quiet_files import _line
from tests.component.test_scan import _ahead, _touch_dir
from tests.support.pipeline_rig import Rig

FILES = ("a.log", "b.log", "c.log")


@pytest.fixture
def lstats(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The basenames of the .log files the scan lstat'ed since the test last cleared it."""
    seen: list[str] = []
    real = os.lstat

    def spy(path: Any, *a: Any, **kw: Any) -> os.stat_result:
        if str(path).endswith(".log"):
            seen.append(os.path.basename(str(path)))
        return real(path, *a, **kw)

    monkeypatch.setattr(os, "lstat", spy)
    return seen


@pytest.fixture
async def parked(tmp_path: Path) -> AsyncIterator[Callable[[], Rig]]:
    """A rig watching logs/*.log whose three files are parked (close_inactive) and have been seen
    by one rescan since, so the next rescan may reuse their stat."""
    rigs: list[Rig] = []
    logs = tmp_path / "logs"
    logs.mkdir()
    for n, name in enumerate(FILES):
        (logs / name).write_bytes(_line(n))
    for d in (tmp_path, logs):
        _touch_dir(str(d))

    async def make() -> Rig:
        rig = Rig(tmp_path, [str(logs / "*.log")], input_close_inactive_s=30.0)
        rigs.append(rig)
        rig.p.files._scanner = Scanner(_ahead())
        await rig.p.files.start(asyncio.Event())
        assert rig.p.files.watching
        await rig.step()                      # the first rescan: every file opened and read
        assert len(rig.docs) == len(FILES)
        rig.clock.advance(31.0)
        await rig.step(scan=False)            # inactive: all three parked
        files = rig.p.files.files
        assert files.open == {} and len(files.parked) == len(FILES)
        await rig.p.rescan()                  # their stat noted for the next one
        return rig

    yield make  # type: ignore[misc]
    for rig in rigs:
        await rig.p.files.stop()
        await rig.close()


def _not_full(rig: Rig) -> None:
    """The next rescan is not one of the Scanner's that reuse nothing."""
    sc = rig.p.files._scanner
    if (sc.scans + 1) % FULL_EVERY == 0:
        sc.scans += 1


async def test_a_rescan_does_not_stat_parked_files_in_unchanged_directories(
        parked: Callable[[], Any], lstats: list[str]) -> None:
    rig = await parked()
    _not_full(rig)
    lstats.clear()
    await rig.p.rescan()
    assert rig.p.files._scanner.reused >= 1
    assert lstats == [], f"parked files stat'ed though inotify names every write: {lstats}"
    assert len(rig.p.files.files.parked) == len(FILES)


async def test_a_write_no_event_names_is_found_by_the_scan_that_reuses_nothing(
        parked: Callable[[], Any], lstats: list[str], tmp_path: Path) -> None:
    rig = await parked()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    os.link(tmp_path / "logs" / "b.log", elsewhere / "b.link")
    with open(elsewhere / "b.link", "ab") as f:        # no watched directory sees this write
        f.write(_line(10))
    _not_full(rig)
    await rig.step()
    assert rig.count("m10") == 0, "a reused stat cannot show the write: nothing reopened it"
    sc = rig.p.files._scanner
    sc.scans = FULL_EVERY - 1 + FULL_EVERY * (sc.scans // FULL_EVERY + 1)   # the next scan reuses nothing
    lstats.clear()
    await rig.step()
    assert sorted(lstats) == sorted(FILES), lstats
    assert rig.count("m10") == 1 and len(rig.docs) == len(FILES) + 1 and not rig.dup_ids


async def test_a_named_write_is_found_by_the_rescan_itself(
        parked: Callable[[], Any], lstats: list[str], tmp_path: Path) -> None:
    rig = await parked()
    with open(tmp_path / "logs" / "c.log", "ab") as f:   # through the watched path: an event names it
        f.write(_line(11))
    _not_full(rig)
    lstats.clear()
    await rig.step()          # no tick: the rescan reads inotify's queue itself
    assert lstats == ["c.log"], lstats
    assert rig.count("m11") == 1 and len(rig.docs) == len(FILES) + 1 and not rig.dup_ids


async def test_after_lost_events_every_parked_file_is_stated(parked: Callable[[], Any], lstats: list[str]) -> None:
    rig = await parked()
    w = rig.p.files.writes.watcher
    assert w is not None
    w.dropped += 1            # what an overflowed queue or a failed read counts
    _not_full(rig)
    lstats.clear()
    await rig.p.rescan()
    assert sorted(lstats) == sorted(FILES), lstats
    _not_full(rig)
    lstats.clear()
    await rig.p.rescan()      # no loss since: reused again
    assert lstats == []


async def test_names_dropped_as_too_many_make_the_next_rescan_stat_every_parked_file(
        parked: Callable[[], Any], lstats: list[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    rig = await parked()
    with open(tmp_path / "logs" / "a.log", "ab") as f:
        f.write(_line(12))
    w = rig.p.files.writes.watcher
    assert w is not None
    w.poll()                           # named, and kept by the watcher
    drops = w.dropped
    limit = watch.MAX_PENDING_PATHS
    monkeypatch.setattr(watch, "MAX_PENDING_PATHS", 0)
    rig.p.files.writes.take_named()          # more names than the source may keep: they are let go
    monkeypatch.setattr(watch, "MAX_PENDING_PATHS", limit)
    assert w.dropped == drops and not rig.p.files.writes.named
    _not_full(rig)
    lstats.clear()
    await rig.p.rescan()
    assert sorted(lstats) == sorted(FILES), lstats
    await rig.step(scan=False)
    assert rig.count("m12") == 1 and len(rig.docs) == len(FILES) + 1 and not rig.dup_ids


async def test_a_file_once_written_behind_inotifys_back_is_stated_at_every_scan(
        parked: Callable[[], Any], lstats: list[str]) -> None:
    rig = await parked()
    files = rig.p.files.files
    key = next(k for k, p in files.parked.items() if p.path.endswith("a.log"))
    files.unreported.add(key)          # what a full look that found an unnamed write leaves
    _not_full(rig)
    lstats.clear()
    await rig.p.rescan()
    assert lstats == ["a.log"], lstats


async def test_without_inotify_every_rescan_stats_every_parked_file(
        parked: Callable[[], Any], lstats: list[str]) -> None:
    rig = await parked()
    rig.p.files.pause_watch()
    try:
        w = rig.p.files.writes.watcher
        assert w is not None
        w.incomplete = "logs: inotify watch limit reached"     # a write may go unnamed
        _not_full(rig)
        lstats.clear()
        await rig.p.rescan()
        assert sorted(lstats) == sorted(FILES), lstats
    finally:
        rig.p.files.resume_watch()
