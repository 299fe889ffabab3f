"""Discovery on real directories: globs with **, excludes, symlinks followed once, rotated names,
and the inotify watcher (a directory that appears later under ** is watched)."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from shipper.config import InputConfig
from shipper.tail import discovery, identity, watch
from tests.support.wait import async_wait_until


def touch(p: Path, data: bytes = b"x\n") -> Path:
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_bytes(data)
    return p


def test_recursive_glob_excludes_and_symlinks_once(tmp_path: Path) -> None:
    a = touch(tmp_path / "a" / "one.log")
    touch(tmp_path / "a" / "b" / "c" / "two.log")
    touch(tmp_path / "a" / "skip.gz")
    touch(tmp_path / "a" / "b" / "three.txt")
    os.symlink(a, tmp_path / "a" / "b" / "link.log")           # the same file twice: followed once
    os.symlink(tmp_path / "nowhere", tmp_path / "a" / "dangling.log")
    (tmp_path / "a" / "dir.log").mkdir()                        # a directory is not a file
    inp = InputConfig(paths=(str(tmp_path / "**" / "*"),), exclude=("*.gz", "*.txt"))
    found = discovery.scan([inp])
    names = sorted(Path(p).name for p in found)
    assert names in (["one.log", "two.log"], ["link.log", "two.log"])
    keys = [(st.st_dev, st.st_ino) for _p, _i, st in discovery.scan_stat([inp])]
    assert len(keys) == len(set(keys))


def test_first_input_wins(tmp_path: Path) -> None:
    touch(tmp_path / "x.log")
    inputs = [InputConfig(paths=(str(tmp_path / "*.log"),)), InputConfig(paths=(str(tmp_path / "x.*"),))]
    assert discovery.scan(inputs) == {str(tmp_path / "x.log"): 0}


def test_rotated_names() -> None:
    for name in ("app.log.1", "app.log.12", "app.log.1.gz", "app.log-20260101", "app.log-20260101.gz",
                 "app.log-2026-01-01", "app.log.2026-01-01", "app.log-20260101-1767225600"):
        assert identity.is_rotated_name("app.log", name), name
        assert identity.rotation_root("/d/" + name) == "/d/app.log", name
    for name in ("app.log", "app.log.bak", "app.logx", "other.log.1", "app.log.gz"):
        assert not identity.is_rotated_name("app.log", name), name


async def test_a_directory_created_later_under_double_star_is_watched(tmp_path: Path) -> None:
    root = tmp_path / "logs"
    root.mkdir()
    wake = asyncio.Event()
    w = watch.make_watcher(asyncio.get_running_loop(), wake)
    inp = InputConfig(paths=(str(root / "**" / "*.log"),))
    await asyncio.to_thread(w.watch, [inp])
    try:
        deep = root / "new" / "deeper"
        deep.mkdir(parents=True)
        await async_wait_until(lambda: w.scan_wanted, "a created directory to ask for a rescan", timeout_s=5)
        w.scan_wanted = False
        wake.clear()
        # the rescan it asked for watches the new directories first, off the loop (never the loop itself)
        await asyncio.to_thread(w.watch, [inp])
        touch(deep / "app.log")
        await async_wait_until(lambda: w.scan_wanted and wake.is_set(),
                               "a file created in the new directory to be noticed", timeout_s=5)
        assert str(deep / "app.log") in discovery.scan([inp])
        w.take_modified()
        with open(deep / "app.log", "ab") as f:
            f.write(b"more\n")
        await async_wait_until(lambda: str(deep / "app.log") in w.take_modified(),
                               "a modified file to be reported by path", timeout_s=5)
    finally:
        await asyncio.to_thread(w.stop)


async def test_base_directory_that_appears_later(tmp_path: Path) -> None:
    wake = asyncio.Event()
    w = watch.make_watcher(asyncio.get_running_loop(), wake)
    inp = InputConfig(paths=(str(tmp_path / "later" / "*.log"),))
    await asyncio.to_thread(w.watch, [inp])       # watches tmp_path (the existing parent), recursively
    try:
        touch(tmp_path / "later" / "a.log")
        await async_wait_until(lambda: w.scan_wanted, "the new directory and file to be noticed", timeout_s=5)
        await asyncio.to_thread(w.watch, [inp])   # idempotent; now the base directory itself exists
        w.scan_wanted = False
        touch(tmp_path / "later" / "b.log")
        await async_wait_until(lambda: w.scan_wanted, "a file in the later base directory", timeout_s=5)
    finally:
        await asyncio.to_thread(w.stop)


async def test_watchdog_fallback_reports_the_same_events(tmp_path: Path) -> None:
    """Where inotify cannot be used, WatchdogWatcher does the same: created -> rescan, written -> path."""
    wake = asyncio.Event()
    w = watch.WatchdogWatcher(asyncio.get_running_loop(), wake)
    inp = InputConfig(paths=(str(tmp_path / "*.log"),))
    await asyncio.to_thread(w.watch, [inp])
    try:
        touch(tmp_path / "a.log")
        await async_wait_until(lambda: w.scan_wanted and wake.is_set(), "a created file to ask for a rescan",
                               timeout_s=5)
        with open(tmp_path / "a.log", "ab") as f:
            f.write(b"more\n")
        await async_wait_until(lambda: str(tmp_path / "a.log") in w.take_modified(),
                               "a modified file to be reported by path", timeout_s=5)
    finally:
        await asyncio.to_thread(w.stop)


async def test_the_loop_reads_inotify_itself(tmp_path: Path) -> None:
    """On Linux the Watcher is the inotify one (no watchdog threads); a renamed-in file asks for a rescan."""
    wake = asyncio.Event()
    w = watch.make_watcher(asyncio.get_running_loop(), wake)
    assert type(w) is watch.InotifyWatcher
    (tmp_path / "x.tmp").write_bytes(b"")
    await asyncio.to_thread(w.watch, [InputConfig(paths=(str(tmp_path / "*.log"),))])
    try:
        os.rename(tmp_path / "x.tmp", tmp_path / "x.log")
        await async_wait_until(lambda: w.scan_wanted and wake.is_set(), "a moved-in file to ask for a rescan",
                               timeout_s=5)
    finally:
        w.stop()


async def test_a_paused_watcher_delivers_what_happened_meanwhile_on_resume(tmp_path: Path) -> None:
    """While the reader paces itself the loop does not read inotify; the events wait in the kernel."""
    wake = asyncio.Event()
    loop = asyncio.get_running_loop()
    w = watch.make_watcher(loop, wake)
    assert type(w) is watch.InotifyWatcher
    (tmp_path / "a.log").write_bytes(b"")
    await asyncio.to_thread(w.watch, [InputConfig(paths=(str(tmp_path / "*.log"),))])
    try:
        w.pause()
        with open(tmp_path / "a.log", "ab") as f:
            for _ in range(20):
                f.write(b"line\n")
                f.flush()
        assert not loop.remove_reader(w._fd)        # not watched by the loop while paused
        assert not wake.is_set()
        w.resume()
        await async_wait_until(lambda: str(tmp_path / "a.log") in w.take_modified(),
                               "the writes made while paused to be reported on resume", timeout_s=5)
        assert wake.is_set()
    finally:
        await asyncio.to_thread(w.stop)
