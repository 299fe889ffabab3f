"""The reading side on real files, in-process with a fake clock: identity traps, every logrotate
mode (through the helpers that do what logrotate does), catch-up after a restart, max_open_files,
checkpoint cleanup. Each test checks every written line exactly once in the committed documents.
"""

from __future__ import annotations

import asyncio
import gzip
import os
from pathlib import Path

import pytest

from shipper.tail.fileset import Candidate
from tests.support.pipeline_rig import Rig, RigFactory
from tests.support.rotate import (
    gzip_file,
    rotate,
    rotate_compress,
    rotate_copytruncate,
    rotate_delaycompress,
    rotate_rename,
)
from tests.support.wait import async_wait_until


def write(path: Path, *msgs: str) -> None:
    with open(path, "ab") as f:
        f.write(b"".join(m.encode() + b"\n" for m in msgs))


def lines(prefix: str, n: int) -> list[str]:
    return [f"{prefix}-{i:04d} some text to make the line longer than a few bytes" for i in range(n)]


def assert_once(rig: Rig, expected: list[str]) -> None:
    msgs = rig.messages()
    assert not rig.dup_ids, f"an _id was produced twice: {rig.dup_ids[:5]}"
    missing = [m for m in expected if m not in msgs]
    assert not missing, f"{len(missing)} lines never shipped, e.g. {missing[:3]}"
    dups = sorted({m for m in msgs if msgs.count(m) > 1})
    assert not dups, f"shipped more than once: {dups[:3]}"
    extra = set(msgs) - set(expected)
    assert not extra, f"shipped but never written: {sorted(extra)[:3]}"


# ---------------------------------------------------------------- identity traps

async def test_small_file_is_shipped_at_once_and_keeps_its_identity_as_it_grows(make_rig: RigFactory, tmp_path: Path) -> None:
    rig = make_rig()
    app = tmp_path / "logs" / "app.log"
    write(app, "tiny")
    await rig.step()
    assert rig.messages() == ["tiny"]
    (first_id,) = rig.docs
    inc = first_id.rsplit("-", 1)[0]
    more = lines("grow", 40)                         # well past the 1 KiB fingerprint
    write(app, *more)
    await rig.step()
    await rig.restart()
    write(app, "after restart")
    await rig.step()
    assert_once(rig, ["tiny", *more, "after restart"])
    assert {i.rsplit("-", 1)[0] for i in rig.docs} == {inc}, "one file, one incarnation"


async def test_two_files_with_the_same_first_line_are_two_files(make_rig: RigFactory, tmp_path: Path) -> None:
    rig = make_rig()
    a, b = tmp_path / "logs" / "a.log", tmp_path / "logs" / "b.log"
    write(a, "same first line")
    write(b, "same first line")
    await rig.step()
    write(a, "only in a")
    write(b, "only in b")
    await rig.step()
    await rig.restart()
    await rig.step()
    assert rig.count("same first line") == 2
    assert rig.count("only in a") == 1 and rig.count("only in b") == 1
    assert len({i.rsplit("-", 1)[0] for i in rig.docs}) == 2


async def test_nul_hole_after_copytruncate_is_told_by_content_not_size(make_rig: RigFactory, tmp_path: Path) -> None:
    """A writer without O_APPEND keeps its offset after copytruncate: the file comes back larger than
    our position, starting with NULs. The first lines after the hole are still new lines."""
    rig = make_rig()
    app = tmp_path / "logs" / "app.log"
    fd = os.open(app, os.O_WRONLY | os.O_CREAT, 0o644)       # no O_APPEND
    try:
        before = lines("before", 30)
        os.write(fd, b"".join(m.encode() + b"\n" for m in before))
        await rig.step()
        unread = lines("unread", 5)
        os.write(fd, b"".join(m.encode() + b"\n" for m in unread))
        rotate_copytruncate(app)
        after = lines("after", 3)
        os.write(fd, b"".join(m.encode() + b"\n" for m in after))   # at the old offset: a NUL hole before it
    finally:
        os.close(fd)
    assert os.path.getsize(app) > len(b"".join(m.encode() + b"\n" for m in before))
    with open(app, "rb") as f:
        assert f.read(1) == b"\0"
    await rig.settle()
    assert_once(rig, before + unread + after)
    assert not any("\0" in m or m == "" for m in rig.messages())
    assert rig.events.of("file_truncated"), "the truncation was noticed"


async def test_file_rewritten_in_place_larger_than_the_old_offset_is_new(make_rig: RigFactory, tmp_path: Path) -> None:
    """Recreated at midnight with the same inode, already larger than the old offset when first
    seen: the fingerprint says it is another file, so it is read from 0 (live, and across a restart)."""
    rig = make_rig()
    app = tmp_path / "logs" / "app.log"
    old = lines("yesterday", 10)
    write(app, *old)
    await rig.step()
    ino = app.stat().st_ino
    new = lines("today", 30)
    with open(app, "wb") as f:                               # O_TRUNC: same inode, new content
        f.write(b"".join(m.encode() + b"\n" for m in new))
    assert app.stat().st_ino == ino
    await rig.settle()
    assert_once(rig, old + new)
    # and while stopped
    await rig.restart()
    newer = lines("tomorrow", 40)
    with open(app, "wb") as f:
        f.write(b"".join(m.encode() + b"\n" for m in newer))
    await rig.settle()
    assert_once(rig, old + new + newer)


async def test_inode_reuse_by_a_new_file(make_rig: RigFactory, tmp_path: Path) -> None:
    rig = make_rig()
    app = tmp_path / "logs" / "app.log"
    first = lines("first", 10)
    write(app, *first)
    await rig.step()
    await rig.restart()
    ino = app.stat().st_ino
    app.unlink()
    second = lines("second", 25)
    write(app, *second)
    if app.stat().st_ino != ino:
        pytest.skip("this filesystem did not reuse the inode")
    await rig.settle()
    assert_once(rig, first + second)


# ---------------------------------------------------------------- rotation modes while running

async def test_rename_rotation_reads_the_old_file_to_its_end(make_rig: RigFactory, tmp_path: Path) -> None:
    rig = make_rig()
    app = tmp_path / "logs" / "app.log"
    a = lines("a", 20)
    write(app, *a)
    await rig.step()
    b = lines("b", 5)
    write(app, *b)                       # unread when the rename happens
    rotate_rename(app)
    await rig.p.check_sources()
    assert rig.p.bytes_at_risk() == sum(len(m) + 1 for m in b), "unread bytes no path names any more"
    late = lines("late", 3)
    write(tmp_path / "logs" / "app.log.1", *late)   # the app has not reopened yet
    c = lines("c", 4)
    write(app, *c)
    await rig.step()
    assert rig.p.bytes_at_risk() == 0
    await rig.settle()
    assert_once(rig, a + b + late + c)


async def test_copytruncate_reads_the_unread_range_from_the_copy(make_rig: RigFactory, tmp_path: Path) -> None:
    rig = make_rig()
    app = tmp_path / "logs" / "app.log"
    a = lines("a", 20)
    write(app, *a)
    await rig.step()
    unread = lines("unread", 50)
    write(app, *unread)
    rotate_copytruncate(app)
    b = lines("b", 5)
    write(app, *b)
    await rig.settle()
    assert_once(rig, a + unread + b)
    (opened,) = rig.events.of("rotated_copy_opened")
    assert opened[1] == str(app) + ".1"
    # the unread lines keep the old incarnation's ids
    inc_a = next(i for i, d in rig.docs.items() if d["message"] == a[0]).rsplit("-", 1)[0]
    inc_u = next(i for i, d in rig.docs.items() if d["message"] == unread[0]).rsplit("-", 1)[0]
    assert inc_a == inc_u


async def test_copytruncate_and_new_writes_before_the_first_read_are_two_incarnations(
        make_rig: RigFactory, tmp_path: Path) -> None:
    """Opened (fingerprinted) but not read yet, then truncated and written again: the new bytes
    sit where the fingerprinted ones were (issue 14's CI caught it, under load, in the e2e
    copytruncate test). Reading them under the old identity lost the copy's lines (the copy,
    found by the fingerprint, looked read) and shipped the new ones twice."""
    rig = make_rig()
    app = tmp_path / "logs" / "app.log"
    x = lines("x", 30)
    write(app, *x)
    await rig.p.rescan()
    await rig.p.open_waiting()            # fingerprinted at open; not a byte read yet
    assert rig.p.sources, "the file is open"
    rotate_copytruncate(app)
    y = lines("y", 40)
    write(app, *y)
    rig.p.read_round()                    # the daemon's order: a read round before the next check
    await rig.settle()
    assert_once(rig, x + y)
    inc_x = next(i for i, d in rig.docs.items() if d["message"] == x[0]).rsplit("-", 1)[0]
    inc_y = next(i for i, d in rig.docs.items() if d["message"] == y[0]).rsplit("-", 1)[0]
    assert inc_x != inc_y


async def test_copytruncate_compress_reads_the_unread_range_from_the_gz(make_rig: RigFactory, tmp_path: Path) -> None:
    rig = make_rig()
    app = tmp_path / "logs" / "app.log"
    a = lines("a", 20)
    write(app, *a)
    await rig.step()
    unread = lines("unread", 30)
    write(app, *unread)
    rotate(app, mode="copytruncate", compress=True)
    assert not (tmp_path / "logs" / "app.log.1").exists()
    b = lines("b", 5)
    write(app, *b)
    await rig.settle()
    assert_once(rig, a + unread + b)
    assert rig.events.of("rotated_copy_opened")[0][1].endswith(".1.gz")


async def test_copytruncate_without_a_copy_reports_the_loss(make_rig: RigFactory, tmp_path: Path) -> None:
    rig = make_rig()
    app = tmp_path / "logs" / "app.log"
    write(app, *lines("a", 20))
    await rig.step()
    write(app, *lines("lost", 10))
    await rig.p.rescan()
    await rig.p.check_sources()                # the harvester sees the size before the truncate
    os.truncate(app, 0)
    write(app, "b")
    await rig.settle()
    assert rig.count("b") == 1
    (lost,) = rig.events.of("bytes_lost")
    assert lost[2] > 0


async def test_compress_while_running(make_rig: RigFactory, tmp_path: Path) -> None:
    rig = make_rig()
    app = tmp_path / "logs" / "app.log"
    expected: list[str] = []
    for r in range(3):
        batch = lines(f"r{r}", 15)
        write(app, *batch)
        expected += batch
        await rig.step()
        tail = lines(f"t{r}", 5)
        write(app, *tail)                # unread at rotation: read through the still-open fd
        expected += tail
        rotate_compress(app)
    await rig.settle()
    assert_once(rig, expected)


async def test_delaycompress_with_a_glob_that_matches_the_rotated_names(make_rig: RigFactory, tmp_path: Path) -> None:
    """app.log* matches app.log.1 and app.log.2.gz: identity is the content, not the name."""
    rig = make_rig([str(tmp_path / "logs" / "app.log*")])
    app = tmp_path / "logs" / "app.log"
    expected: list[str] = []
    for r in range(4):
        batch = lines(f"r{r}", 15)
        write(app, *batch)
        expected += batch
        await rig.step()
        rotate_delaycompress(app)
        await rig.step()
    assert (tmp_path / "logs" / "app.log.3.gz").exists()
    await rig.settle()
    assert_once(rig, expected)


async def test_compressed_copy_seen_while_the_compressor_writes_it(make_rig: RigFactory, tmp_path: Path) -> None:
    """compress without delaycompress, glob matching the rotated names: logrotate renames app.log to
    app.log.1, creates app.log.1.gz empty, fills it, then unlinks app.log.1. A scan in between sees an
    empty (then partial) .gz: it is not a new file, and once whole it is a copy of what we read."""
    rig = make_rig([str(tmp_path / "logs" / "app.log*")])
    app = tmp_path / "logs" / "app.log"
    a = lines("a", 30)
    write(app, *a)
    await rig.step()
    tail = lines("tail", 40)
    write(app, *tail)
    one, gz = tmp_path / "logs" / "app.log.1", tmp_path / "logs" / "app.log.1.gz"
    os.rename(app, one)
    write(app, "new file")
    gz.touch()                                   # the compressor's output, not written yet
    await rig.p.rescan()                         # seen (and opened) now, read only after it is filled
    data = gzip.compress(one.read_bytes())
    with open(gz, "wb") as f:
        f.write(data[:12])                       # a gzip header and nothing decompressible yet
    await rig.p.rescan()
    with open(gz, "wb") as f:
        f.write(data)
    one.unlink()
    await rig.settle()
    assert_once(rig, a + tail + ["new file"])
    assert len({i.rsplit("-", 1)[0] for i in rig.docs}) == 2, "two files, two incarnations"


async def test_plain_copy_seen_while_copytruncate_writes_it(make_rig: RigFactory, tmp_path: Path) -> None:
    """copytruncate, glob matching the rotated names: a scan sees app.log.1 while logrotate is still
    copying into it (empty, then shorter than the fingerprint). It is the copy, not a new file."""
    rig = make_rig([str(tmp_path / "logs" / "app.log*")])
    app = tmp_path / "logs" / "app.log"
    a = ["a short first line"]
    write(app, *a)
    await rig.step()
    more = lines("more", 30)
    write(app, *more)
    one = tmp_path / "logs" / "app.log.1"
    content = app.read_bytes()
    one.touch()
    await rig.p.rescan()                         # seen (and opened) now, read only after it grew
    with open(one, "wb") as f:
        f.write(content[:10])                    # part of the first line copied so far
    await rig.p.rescan()
    with open(one, "wb") as f:
        f.write(content)
    os.truncate(app, 0)
    write(app, "after")
    await rig.settle()
    assert_once(rig, a + more + ["after"])


async def test_deleted_while_open_is_read_to_its_end(make_rig: RigFactory, tmp_path: Path) -> None:
    rig = make_rig()
    app = tmp_path / "logs" / "app.log"
    a = lines("a", 10)
    write(app, *a)
    await rig.step()
    fd = os.open(app, os.O_WRONLY | os.O_APPEND)
    try:
        app.unlink()
        os.write(fd, b"written after unlink\nno newline at the end")
    finally:
        os.close(fd)
    await rig.settle()
    assert_once(rig, a + ["written after unlink", "no newline at the end"])
    assert not rig.p.sources


# ---------------------------------------------------------------- catch-up after downtime

async def test_restart_after_two_rotations_one_compressed(make_rig: RigFactory, tmp_path: Path) -> None:
    rig = make_rig()
    app = tmp_path / "logs" / "app.log"
    a = lines("a", 20)
    write(app, *a)
    await rig.step()
    await rig.restart()                  # stopped from here: nothing is read until the next step
    a2 = lines("a2", 10)                 # the rest of the incarnation we had checkpointed
    write(app, *a2)
    rotate_delaycompress(app)
    b = lines("b", 12)                   # a file we never saw, now app.log.1
    write(app, *b)
    rotate_delaycompress(app)            # a -> app.log.2.gz, b -> app.log.1
    c = lines("c", 7)
    write(app, *c)
    assert (tmp_path / "logs" / "app.log.2.gz").exists()
    await rig.settle()
    assert_once(rig, a + a2 + b + c)
    # the rest of a keeps a's incarnation
    inc = {d["message"]: i.rsplit("-", 1)[0] for i, d in rig.docs.items()}
    assert inc[a[0]] == inc[a2[0]]
    assert all(d["log"]["file"]["path"] == str(app) for d in rig.docs.values())


async def test_compressed_copy_read_from_far_in_is_sought_off_the_loop(make_rig: RigFactory, tmp_path: Path) -> None:
    """Catch-up from a .gz at a deep offset: the decompression up to the offset (seconds for a large
    file) happens in a thread when the copy is opened, so the first read on the loop is bounded."""
    rig = make_rig()
    app = tmp_path / "logs" / "app.log"
    a = lines("a", 3000)                          # ~200 KB shipped before the stop
    write(app, *a)
    await rig.step()
    await rig.restart()
    rest = lines("rest", 10)
    write(app, *rest)
    rotate_compress(app)
    await rig.p.rescan()                          # finds the incarnation in app.log.1.gz and opens it
    (src,) = [s for s in rig.p.sources.values() if s.harvester.compressed]
    h = src.harvester
    assert h.position == src.checkpoint.offset > 150_000
    assert not h.needs_seek, "the decompressor was brought to the offset when the copy was opened"
    await rig.settle()
    assert_once(rig, a + rest)


async def test_restart_while_logrotate_compresses_a_file_never_seen(make_rig: RigFactory, tmp_path: Path) -> None:
    """Started while logrotate is compressing a file written during the downtime: its plain name is
    shipped (as a file written while nobody looked), the empty .gz beside it is not a new file, and
    once the .gz is whole it is a copy of what was shipped."""
    rig = make_rig()
    logs = tmp_path / "logs"
    app = logs / "app.log"
    a = lines("a", 20)
    write(app, *a)
    await rig.step()
    await rig.restart()
    os.rename(app, logs / "app.log-20261129")
    gzip_file(logs / "app.log-20261129", logs / "app.log-20261129.gz")
    b = lines("b", 25)                                 # written while stopped
    write(app, *b)
    plain, gz = logs / "app.log-20261130", logs / "app.log-20261130.gz"
    os.rename(app, plain)
    gz.touch()                                         # the compressor's output, not written yet
    c = lines("c", 5)
    write(app, *c)
    await rig.p.rescan()
    gz.write_bytes(gzip.compress(plain.read_bytes()))
    plain.unlink()
    await rig.settle()
    assert_once(rig, a + b + c)


async def test_restart_after_copytruncate(make_rig: RigFactory, tmp_path: Path) -> None:
    rig = make_rig()
    app = tmp_path / "logs" / "app.log"
    a = lines("a", 20)
    write(app, *a)
    await rig.step()
    await rig.restart()
    unread = lines("unread", 10)
    write(app, *unread)
    rotate_copytruncate(app)
    b = lines("b", 3)
    write(app, *b)
    await rig.settle()
    assert_once(rig, a + unread + b)


async def test_parked_file_renamed_after_it_grew_is_found_among_siblings(make_rig: RigFactory, tmp_path: Path) -> None:
    rig = make_rig(input_close_inactive_s=1.0)
    app = tmp_path / "logs" / "app.log"
    a = lines("a", 10)
    write(app, *a)
    await rig.settle(steps=2)
    assert not rig.p.sources, "closed after close_inactive"
    more = lines("more", 4)
    write(app, *more)
    rotate_compress(app)                 # grown, renamed and compressed before we looked again
    await rig.settle()
    assert_once(rig, a + more)


async def test_compressed_sibling_of_a_fully_shipped_file_is_ignored(make_rig: RigFactory, tmp_path: Path) -> None:
    rig = make_rig([str(tmp_path / "logs" / "*")])
    app = tmp_path / "logs" / "app.log"
    a = lines("a", 10)
    write(app, *a)
    await rig.step()
    rotate_compress(app)
    await rig.settle()
    await rig.restart()
    await rig.settle()
    assert_once(rig, a)


# ---------------------------------------------------------------- start_at

async def test_start_at_end_only_for_files_never_seen(make_rig: RigFactory, tmp_path: Path) -> None:
    rig = make_rig(input_start_at="end")
    app = tmp_path / "logs" / "app.log"
    write(app, *lines("history", 10))
    await rig.step()
    assert rig.docs == {}
    a = lines("a", 3)
    write(app, *a)
    await rig.step()
    await rig.restart()
    while_down = lines("down", 4)
    write(app, *while_down)              # seen before: resumes from its checkpoint
    write(tmp_path / "logs" / "unseen.log", "never seen before the restart: start_at end applies")
    await rig.step()
    late = tmp_path / "logs" / "late.log"
    write(late, "created while running")  # found after the first scan: read from its start
    await rig.settle()
    assert_once(rig, a + while_down + ["created while running"])


# ---------------------------------------------------------------- scale: max_open_files

async def test_max_open_files_over_many_active_files(make_rig: RigFactory, tmp_path: Path) -> None:
    rig = make_rig(max_open_files=5)
    logs = tmp_path / "logs"
    files = [logs / f"f{i:02d}.log" for i in range(30)]
    expected: list[str] = []
    peak = 0
    for r in range(3):
        for f in files:
            msg = f"{f.name} round {r}"
            write(f, msg)
            expected.append(msg)
        for _ in range(4):
            await rig.step()
            peak = max(peak, rig.open_fds(logs), len(rig.p.sources))
    await rig.settle()
    peak = max(peak, rig.open_fds(logs))
    assert peak <= 5
    assert_once(rig, expected)


async def test_max_open_files_is_exact_through_copytruncate_at_the_cap(make_rig: RigFactory, tmp_path: Path) -> None:
    """The cap counts every log fd: the files read (all slots but one), the copy a truncation reads
    its unread range from (a slot freed by parking an idle file first, or the copy waits for one),
    and the short looks (the one slot kept for them). Every line still arrives exactly once."""
    rig = make_rig(max_open_files=4)
    logs = tmp_path / "logs"
    files = [logs / f"c{i:02d}.log" for i in range(8)]
    expected: list[str] = []
    peak = 0
    for r in range(3):
        for f in files:
            msg = f"{f.name} round {r} before"
            write(f, msg)
            expected.append(msg)
        await rig.step()
        peak = max(peak, rig.open_fds(logs))
        for f in files[:4]:
            rotate_copytruncate(f)                 # the unread rest lives in f.1 now
            msg = f"{f.name} round {r} after"
            write(f, msg)
            expected.append(msg)
            await rig.step()
            peak = max(peak, rig.open_fds(logs), len(rig.p.sources))
    await rig.settle()
    peak = max(peak, rig.open_fds(logs))
    assert peak <= 4
    assert_once(rig, expected)


# ---------------------------------------------------------------- checkpoint store hygiene

async def test_checkpoints_of_removed_files_are_forgotten_after_the_grace(make_rig: RigFactory, tmp_path: Path) -> None:
    rig = make_rig(clean_removed_after_s=10.0)
    logs = tmp_path / "logs"
    for i in range(5):
        write(logs / f"gone{i}.log", f"gone {i}")
    app = logs / "app.log"
    write(app, "kept")
    await rig.step()
    keep_gz = logs / "gone0.log"
    rotate_compress(keep_gz)              # gone0's content lives on in gone0.log.1.gz
    for i in range(1, 5):
        (logs / f"gone{i}.log").unlink()
    await rig.settle(steps=3, advance_s=2.0)
    assert len(await rig.checkpoints()) >= 6
    assert await rig.p.clean_checkpoints() == 0, "not before the grace period"
    rig.clock.advance_wall(11.0)
    assert await rig.p.clean_checkpoints() == 4
    paths = {cp.path for cp in await rig.checkpoints()}
    assert str(app) in paths and str(keep_gz) in paths
    assert not any(f"gone{i}.log" in p for p in paths for i in range(1, 5))
    await rig.restart()
    await rig.settle()
    assert_once(rig, [f"gone {i}" for i in range(5)] + ["kept"])
    with gzip.open(str(keep_gz) + ".1.gz") as g:
        assert g.read() == b"gone 0\n"


async def test_opening_cancelled_midway_leaks_no_file(make_rig: RigFactory, tmp_path: Path) -> None:
    """Stopping while a batch of files is being opened in a thread: what the thread opened is closed."""
    rig = make_rig()
    logs = tmp_path / "logs"
    for i in range(200):
        write(logs / f"f{i:03d}.log", f"line {i}")
    for path in sorted(logs.iterdir()):
        st = path.stat()
        key = (st.st_dev, st.st_ino)
        rig.p.waiting[key] = Candidate(str(path), 0, key, "glob")
    task = asyncio.create_task(rig.p.open_waiting())
    await asyncio.sleep(0)                   # the thread is opening files now
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await async_wait_until(lambda: rig.open_fds(logs) == 0, "the files the thread opened to be closed")
    assert not rig.p.sources


async def test_status_lag_counts_bytes_written_since_the_last_read(make_rig: RigFactory, tmp_path: Path) -> None:
    """While reading is paused (backpressure, a full disk) status must not show the size of the last
    read: the lag is what the file holds beyond what was shipped."""
    rig = make_rig()
    app = tmp_path / "logs" / "app.log"
    write(app, *lines("a", 10))
    await rig.step()
    (row,) = rig.p.file_status()
    assert row["lag_bytes"] == 0
    before = app.stat().st_size
    write(app, *lines("b", 7))                  # not read: no step
    (row,) = rig.p.file_status()
    assert row["size"] == app.stat().st_size and row["lag_bytes"] == app.stat().st_size - before > 0
    await rig.step()
    assert_once(rig, lines("a", 10) + lines("b", 7))


def test_reads_share_one_buffer_and_nothing_read_refers_to_it(tmp_path: Path) -> None:
    """Every read lands in the same per-thread buffer (issue 14: fresh memory for each read cost
    more than the read): the lines and the carry are copies, so the next read, of this file or of
    another, changes nothing already read, and the copytruncate check still sees the old bytes."""
    from shipper.model import Checkpoint
    from shipper.tail.harvester import Harvester

    a, b = tmp_path / "a.log", tmp_path / "b.log"
    a.write_bytes(b"a-one\na-two\na-th")
    b.write_bytes(b"b-one\nb-two-is-a-longer-line\n")

    def open_harvester(p: Path) -> Harvester:
        fd = os.open(p, os.O_RDONLY)
        st = os.fstat(fd)
        return Harvester(str(p), fd, st, Checkpoint(p.name, str(p), st.st_dev, st.st_ino, 0, "", 0), 1024, 0.0)

    ha, hb = open_harvester(a), open_harvester(b)
    try:
        first = ha.read(64)
        second = hb.read(64)
        assert [ln[2] for ln in first] == [b"a-one", b"a-two"]          # unchanged by b's read
        assert [ln[2] for ln in second] == [b"b-one", b"b-two-is-a-longer-line"]
        assert all(type(ln[2]) is bytes for ln in first + second)
        with open(a, "ab") as f:
            f.write(b"ree\na-four\n")
        assert [(ln[0], ln[2]) for ln in ha.read(64)] == [(12, b"a-three"), (20, b"a-four")]
        assert not ha.suspect
        with open(b, "r+b") as g:                                      # copytruncate, refilled longer
            g.write(b"X" * 40 + b"\n")
        assert hb.read(64) == [] and hb.suspect                        # told by the tail, as before
    finally:
        os.close(ha.fd)
        os.close(hb.fd)
