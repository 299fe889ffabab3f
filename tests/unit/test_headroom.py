"""The state dir's room for acks (issue 19): when new batches stop, when they start again, and
the reserve file given back on a full disk. statvfs is injected; the files are real."""

from __future__ import annotations

import os
from pathlib import Path

from shipper.spool.headroom import (
    RESERVE_FILE,
    REUSE_MARGINS,
    REUSE_S,
    Headroom,
    reserve_size,
    room_is_clear,
    should_write,
)
from tests.support.fake_clock import FakeClock

MiB = 1 << 20


def test_the_margin_is_a_sixteenth_of_the_filesystem_within_bounds() -> None:
    assert reserve_size(3 * MiB) == 3 * MiB // 16
    assert reserve_size(100_000) == 64 * 1024
    # SPEC (Delivery): the state dir holds at most queue.max_bytes of queue plus 8 MiB of everything
    # else (checkpoints, reserves, status): the reserve is one share of those 8 MiB, and an eighth
    # of the queue's bound at most
    assert reserve_size(100 * 1024 * MiB) == 2 * MiB
    assert reserve_size(100 * 1024 * MiB, queue_max_bytes=1024 * MiB) == 2 * MiB
    assert reserve_size(100 * 1024 * MiB, queue_max_bytes=MiB) == 128 * 1024
    assert reserve_size(100 * 1024 * MiB, queue_max_bytes=64 * 1024) == 64 * 1024
    assert reserve_size(3 * MiB, queue_max_bytes=1024 * MiB) == 3 * MiB // 16


def test_writing_stops_before_the_margin_and_starts_again_only_after_a_drain_or_much_room() -> None:
    r = 100
    assert should_write(1000, 900, r, False)
    assert not should_write(1000, 901, r, False)
    # stopped: twice the margin, and the queue drained or three quarters of the disk free
    assert not should_write(1000, 700, r, True, total_bytes=10_000)
    assert should_write(1000, 700, r, True, total_bytes=10_000, queue_empty=True)
    assert not should_write(1000, 850, r, True, total_bytes=10_000, queue_empty=True)
    assert should_write(7500, 700, r, True, total_bytes=10_000)


def test_a_recent_look_is_trusted_only_far_from_the_edge() -> None:
    r = 100
    far = REUSE_MARGINS * r
    assert room_is_clear(far + 50, 0, 50, r, 0.0)
    assert not room_is_clear(far + 50, 1, 50, r, 0.0)        # what was let through since counts
    assert not room_is_clear(far + 50, 0, 51, r, 0.0)
    assert room_is_clear(10 * far, 0, 50, r, REUSE_S * 0.99)
    assert not room_is_clear(10 * far, 0, 50, r, REUSE_S)     # too old
    assert not room_is_clear(10 * far, 0, 50, r, None)        # no look that said yes
    assert not room_is_clear(10 * far, 0, 50, r, -1.0)        # a clock that went back


class FakeFs:
    def __init__(self, total: int, free: int) -> None:
        self.total, self.free = total, free
        self.looks = 0

    def statvfs(self, _path: str) -> os.statvfs_result:
        self.looks += 1
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


def test_the_reserve_follows_queue_max_bytes_when_it_changes(tmp_path: Path) -> None:
    """SIGHUP with another queue.max_bytes: the margin and the file follow at once, down and up
    (SPEC, Delivery: the state dir holds at most queue.max_bytes of queue plus 8 MiB of the rest)."""
    fs = FakeFs(1024 * MiB, 512 * MiB)
    h = Headroom(str(tmp_path), statvfs=fs.statvfs, queue_max_bytes=1024 * MiB)
    reserve = tmp_path / RESERVE_FILE
    assert h.reserve_bytes == reserve.stat().st_size == 2 * MiB
    h.resize(MiB)
    assert h.has_reserve and h.reserve_bytes == reserve.stat().st_size == 128 * 1024
    assert reserve.stat().st_blocks * 512 <= 128 * 1024          # the blocks given back, not a hole
    assert h.status()["reserve_bytes"] == 128 * 1024
    h.resize(8 * MiB)
    assert h.has_reserve and h.reserve_bytes == reserve.stat().st_size == MiB
    # a start with a lower bound than the last run's cuts the file it finds
    again = Headroom(str(tmp_path), statvfs=fs.statvfs, queue_max_bytes=512 * 1024)
    assert again.has_reserve and again.reserve_bytes == reserve.stat().st_size == 64 * 1024


def test_a_reserve_that_cannot_grow_keeps_what_it_had(tmp_path: Path) -> None:
    fs = FakeFs(1024 * MiB, 512 * MiB)
    h = Headroom(str(tmp_path), statvfs=fs.statvfs, queue_max_bytes=MiB)
    reserve = tmp_path / RESERVE_FILE
    fs.free = 3 * MiB                       # less than twice the larger margin
    h.resize(1024 * MiB)
    assert h.reserve_bytes == 2 * MiB and h.has_reserve and reserve.stat().st_size == 128 * 1024
    h.hit_full()                            # still something to give back
    assert not reserve.exists() and h.full
    h.resize(MiB)                           # released for a full disk: made again only when room returns
    assert not reserve.exists() and not h.has_reserve


def test_a_steady_trickle_looks_once_a_second_and_every_batch_near_the_edge(tmp_path: Path) -> None:
    fs = FakeFs(1024 * MiB, 512 * MiB)
    clock = FakeClock(start=0.0)
    h = Headroom(str(tmp_path), statvfs=fs.statvfs, clock=clock, max_reserve_bytes=32 * MiB)
    assert h.reserve_bytes == 32 * MiB
    assert not h.clear_for(MiB)                       # nothing to trust before a look said yes
    looks = fs.looks
    assert h.may_write(MiB) and fs.looks == looks + 1
    for i in range(1, 21):                            # 20 batches within the second: no look
        clock.now = i * 0.04
        assert h.clear_for(MiB, held=4 * MiB)
    assert fs.looks == looks + 1
    clock.now = 1.0                                      # 1.0 s after the look: measure again
    assert not h.clear_for(MiB)
    assert h.may_write(MiB) and fs.looks == looks + 2
    # another writer took the disk meanwhile: the next look sees it and pauses reading
    fs.free = 32 * MiB
    clock.now = 2.0
    assert not h.clear_for(MiB) and not h.may_write(MiB) and h.full
    assert not h.clear_for(MiB)                       # while full, every batch looks
    # near the edge (under four margins beyond what was let through), every batch looks too
    fs.free = 140 * MiB
    assert h.may_write(MiB, queue_empty=True) and not h.full
    assert h.clear_for(MiB, held=0)                   # 140 - 1 - 1 >= 128
    assert not h.clear_for(11 * MiB, held=0)          # 140 - 2 - 11 < 128
    # a write that met a full disk anyway: nothing is trusted until the next look
    assert h.may_write(MiB)
    h.hit_full()
    assert not h.clear_for(1)


def test_status_says_the_state_dir_is_full_and_counts_quarantined_records() -> None:
    from shipper.commands.status import render
    doc = {"running": True, "pid": 1, "output": {"up": True}, "queue": {"events": 5, "bytes": 10},
           "state_dir": {"full": True, "free_bytes": 2048, "quarantined": 1}}
    text = render(doc, "/var/lib/shipper", 0.0)
    assert "state_dir FULL (2.0 KiB free): reading paused" in text
    assert "1 quarantined record(s) (see: shipper state check)" in text
    assert "state:" not in render({**doc, "state_dir": {"full": False, "quarantined": 0}}, "/x", 0.0)
