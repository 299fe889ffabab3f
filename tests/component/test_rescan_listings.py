"""The rescan with its directory listings reused (`shipper/tail/scan.py`) through FileSource.

The rig's pipeline, real files; the scanner runs on a wall clock 10 s ahead and every directory a
test changes is stamped with an mtime of its own (see tests/component/test_scan.py), so listings
are reused as on a host where scans are seconds apart. What must not change: every line once,
rotations followed, and the rescan's check of open files answered from the scan.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from shipper.tail.scan import Scanner
from tests.component.test_scan import _ahead, _touch_dir
from tests.support.pipeline_rig import Rig


def _line(n: int) -> bytes:
    return b'{"level":30,"time":1764000000000,"msg":"m%d"}\n' % n


def _rig(tmp_path: Path, **kw: Any) -> Rig:
    rig = Rig(tmp_path, [str(tmp_path / "logs/**/*.log")], **kw)
    rig.p.files._scanner = Scanner(_ahead())
    return rig


def _one_file(tmp_path: Path) -> Path:
    """logs/app.log with one line, its directories stamped; returns logs/."""
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "app.log").write_bytes(_line(0))
    for d in (tmp_path, logs):
        _touch_dir(str(d))
    return logs


async def test_a_rescan_of_unchanged_directories_lists_and_stats_nothing_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    logs = tmp_path / "logs"
    (logs / "a").mkdir(parents=True)
    for n in range(5):
        (logs / "a" / f"f{n}.log").write_bytes(_line(n))
    for d in (tmp_path, logs, logs / "a"):
        _touch_dir(str(d))
    rig = _rig(tmp_path)
    try:
        await rig.step()
        assert len(rig.docs) == 5
        stats: list[str] = []
        real = os.stat

        def counting(path: Any, *a: Any, **kw: Any) -> os.stat_result:
            stats.append(str(path))
            return real(path, *a, **kw)

        monkeypatch.setattr(os, "stat", counting)
        scanner = rig.p.files._scanner
        await rig.p.rescan()
        assert scanner.reused == 2, "logs/ and logs/a/ unchanged: their listings are reused"
        assert not [p for p in stats if p.endswith(".log")], f"the check stat'ed paths the scan had: {stats}"

        with open(logs / "a" / "f1.log", "ab") as f:       # content only: no directory changes
            f.write(_line(10))
        await rig.step()
        assert rig.count("m10") == 1 and len(rig.docs) == 6
    finally:
        await rig.close()


async def test_rename_rotation_in_a_directory_seen_unchanged_before_is_followed(tmp_path: Path) -> None:
    logs = _one_file(tmp_path)
    rig = _rig(tmp_path)
    try:
        await rig.step()
        await rig.step()
        assert rig.p.files._scanner.reused >= 1
        with open(logs / "app.log", "ab") as f:
            f.write(_line(1))
        os.rename(logs / "app.log", logs / "app.log.1")        # logrotate's create
        (logs / "app.log").write_bytes(_line(2))
        _touch_dir(str(logs))
        await rig.step()
        await rig.settle()
        assert [rig.count(f"m{n}") for n in range(3)] == [1, 1, 1] and not rig.dup_ids
        paths = {os.path.basename(f.harvester.path) for f in rig.p.files.files.open.values()}
        assert "app.log" in paths
    finally:
        await rig.close()


async def test_a_file_parked_by_the_rescans_own_check_stays_parked(tmp_path: Path) -> None:
    # its entry in the scan is the stat of an earlier scan (older size): the check that parked it
    # a moment ago knows better, and it is not opened again for nothing
    logs = _one_file(tmp_path)
    rig = _rig(tmp_path, input_close_inactive_s=30.0)
    try:
        await rig.step()
        with open(logs / "app.log", "ab") as f:
            f.write(_line(1))
        await rig.step(scan=False)
        assert rig.count("m1") == 1
        rig.clock.advance(31.0)
        await rig.p.rescan()
        files = rig.p.files.files
        assert files.open == {} and len(files.parked) == 1 and files.waiting == {}, \
            "parked by the check, then queued to open again from the scan's stale size"
        with open(logs / "app.log", "ab") as f:
            f.write(_line(2))
        await rig.step()
        assert rig.count("m2") == 1 and len(rig.docs) == 3 and not rig.dup_ids
    finally:
        await rig.close()
