"""The state dir's room for acks (issue 19): when new batches stop, when they start again, and
the reserve file given back on a full disk. statvfs is injected; the files are real."""

from __future__ import annotations

import os
from pathlib import Path

from shipper.spool.headroom import RESERVE_FILE, Headroom, reserve_size, should_write

MiB = 1 << 20


def test_the_margin_is_a_sixteenth_of_the_filesystem_within_bounds() -> None:
    assert reserve_size(3 * MiB) == 3 * MiB // 16
    assert reserve_size(100 * 1024 * MiB) == 32 * MiB
    assert reserve_size(100_000) == 64 * 1024


def test_writing_stops_before_the_margin_and_starts_again_only_after_a_drain_or_much_room() -> None:
    r = 100
    assert should_write(1000, 900, r, False)
    assert not should_write(1000, 901, r, False)
    # stopped: twice the margin, and the queue drained or three quarters of the disk free
    assert not should_write(1000, 700, r, True, total_bytes=10_000)
    assert should_write(1000, 700, r, True, total_bytes=10_000, queue_empty=True)
    assert not should_write(1000, 850, r, True, total_bytes=10_000, queue_empty=True)
    assert should_write(7500, 700, r, True, total_bytes=10_000)


class FakeFs:
    def __init__(self, total: int, free: int) -> None:
        self.total, self.free = total, free

    def statvfs(self, _path: str) -> os.statvfs_result:
        blocks = 4096
        return os.statvfs_result((blocks, blocks, self.total // blocks, self.free // blocks, self.free // blocks,
                                  0, 0, 0, 0, 255))


def test_the_reserve_is_made_released_on_a_full_disk_and_made_again(tmp_path: Path) -> None:
    fs = FakeFs(16 * MiB, 8 * MiB)
    h = Headroom(str(tmp_path), statvfs=fs.statvfs)
    reserve = tmp_path / RESERVE_FILE
    assert h.has_reserve and reserve.stat().st_size == h.reserve_bytes == MiB
    assert h.may_write(6 * MiB) and not h.full
    fs.free = 2 * MiB
    assert not h.may_write(2 * MiB) and h.full           # paused: the margin stays free
    h.hit_full()                                         # a write failed anyway: the reserve goes
    assert not reserve.exists() and not h.has_reserve and h.full
    fs.free = 3 * MiB
    assert not h.may_write(MiB)                          # room, but the queue is not drained yet
    assert h.may_write(MiB, queue_empty=True) and not h.full
    assert h.has_reserve and reserve.stat().st_size == MiB


def test_status_says_the_state_dir_is_full_and_counts_quarantined_records() -> None:
    from shipper.commands.status import render
    doc = {"running": True, "pid": 1, "output": {"up": True}, "queue": {"events": 5, "bytes": 10},
           "state_dir": {"full": True, "free_bytes": 2048, "quarantined": 1}}
    text = render(doc, "/var/lib/shipper", 0.0)
    assert "state_dir FULL (2.0 KiB free): reading paused" in text
    assert "1 quarantined record(s) (see: shipper state check)" in text
    assert "state:" not in render({**doc, "state_dir": {"full": False, "quarantined": 0}}, "/x", 0.0)
