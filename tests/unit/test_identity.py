"""File incarnations on real files: fingerprints over the first bytes, matching an open fd and a
rotated sibling (plain or gzip), fresh incarnation ids. Identity keeps no fds of its own."""

from __future__ import annotations

import gzip
import os
import re
from pathlib import Path

import pytest

from shipper.tail import identity
from shipper.tail.identity import FP_MAX_BYTES
from tests.support.rotate import rotate_compress, rotate_copytruncate, rotate_delaycompress, rotate_rename
from tests.support.writer import pino_line, write_lines


def open_fd(path: Path) -> int:
    return os.open(path, os.O_RDONLY)


def fp_of(path: Path) -> tuple[int, str]:
    fd = open_fd(path)
    try:
        return identity.fingerprint_fd(fd, os.fstat(fd).st_size)
    finally:
        os.close(fd)


def test_incarnations_are_fresh_12_hex_ids() -> None:
    ids = {identity.new_incarnation() for _ in range(2000)}
    assert len(ids) == 2000
    assert all(re.fullmatch(r"[0-9a-f]{12}", i) for i in ids)


def test_fingerprint_of_a_small_file_covers_what_there_is_and_grows(tmp_path: Path) -> None:
    p = tmp_path / "a.log"
    p.write_bytes(b"")
    assert fp_of(p) == (0, identity.digest(b""))
    p.write_bytes(b"hello\n")
    n, fp = fp_of(p)
    assert n == 6 and fp == identity.digest(b"hello\n")
    write_lines(p, range(20))
    n2, fp2 = fp_of(p)
    assert n2 == FP_MAX_BYTES and fp2 != fp
    write_lines(p, range(20, 40))          # beyond the first KiB: the fingerprint no longer changes
    assert fp_of(p) == (n2, fp2)


def test_open_fd_matches_while_appended_not_after_truncate_and_rewrite(tmp_path: Path) -> None:
    p = tmp_path / "a.log"
    write_lines(p, range(3))
    fd = open_fd(p)
    try:
        n, fp = identity.fingerprint_fd(fd, os.fstat(fd).st_size)
        write_lines(p, range(3, 10))
        assert identity.matches(fd, n, fp)
        os.truncate(p, 0)
        assert not identity.matches(fd, n, fp)              # shorter than the fingerprint
        write_lines(p, range(100, 110))                       # same length again, other bytes
        assert os.fstat(fd).st_size >= n and not identity.matches(fd, n, fp)
        assert identity.matches(fd, 0, "anything")           # an empty fingerprint says nothing
    finally:
        os.close(fd)


def test_files_with_the_same_first_bytes_share_a_fingerprint(tmp_path: Path) -> None:
    """Two files with the same first bytes have the same fingerprint: identity alone cannot tell
    them apart, which is why the harvester also compares the size with its position."""
    a, b = tmp_path / "a.log", tmp_path / "b.log"
    a.write_bytes(pino_line(1, time=0))
    b.write_bytes(pino_line(1, time=0) + pino_line(2, time=0))
    assert fp_of(a)[1] == identity.digest(a.read_bytes())
    n, fp = fp_of(a)
    fd = open_fd(b)
    try:
        assert identity.matches(fd, n, fp)
    finally:
        os.close(fd)


@pytest.mark.parametrize("rotate, sibling", [
    (rotate_rename, "app.log.1"),
    (rotate_copytruncate, "app.log.1"),
    (rotate_compress, "app.log.1.gz"),
])
def test_a_rotated_sibling_is_recognised_by_content(tmp_path: Path, rotate, sibling: str) -> None:
    p = tmp_path / "app.log"
    write_lines(p, range(30))
    n, fp = fp_of(p)
    rotate(p)
    assert identity.path_matches(str(tmp_path / sibling), n, fp)
    assert not identity.path_matches(str(p), n, fp)       # the new (or truncated) file is another one
    write_lines(p, range(1000, 1030))
    assert not identity.path_matches(str(p), n, fp)


def test_delaycompress_keeps_recognising_the_older_gz(tmp_path: Path) -> None:
    p = tmp_path / "app.log"
    write_lines(p, range(30))
    n, fp = fp_of(p)
    rotate_delaycompress(p)                          # app.log -> app.log.1
    write_lines(p, range(100, 130))
    rotate_delaycompress(p)                          # app.log.1 -> app.log.2.gz, app.log -> app.log.1
    assert identity.path_matches(str(tmp_path / "app.log.2.gz"), n, fp)
    assert not identity.path_matches(str(tmp_path / "app.log.1"), n, fp)


def test_head_of_path_handles_gzip_missing_and_broken_files(tmp_path: Path) -> None:
    plain = tmp_path / "x.log"
    plain.write_bytes(b"abcdef" * 500)
    assert identity.head_of_path(str(plain), 10) == b"abcdefabcd"
    assert len(identity.head_of_path(str(plain))) == FP_MAX_BYTES
    gz = tmp_path / "x.log.1.gz"
    gz.write_bytes(gzip.compress(b"abcdef" * 500))
    assert identity.head_of_path(str(gz), 10) == b"abcdefabcd"
    assert identity.head_of_path(str(tmp_path / "nope.log")) == b""
    half = tmp_path / "half.gz"                      # a .gz that logrotate is still writing
    half.write_bytes(gzip.compress(os.urandom(5000))[:40])
    assert identity.head_of_path(str(half)) == b""
    junk = tmp_path / "junk.gz"                      # not gzip at all
    junk.write_bytes(b"\x1f\x8b\x08\x00garbage-garbage-garbage")
    assert identity.head_of_path(str(junk)) == b""
    assert not identity.path_matches(str(junk), 4, identity.digest(b"\x1f\x8b\x08\x00"))
    assert not identity.path_matches(str(plain), 0, identity.digest(b""))


def test_read_head_and_fingerprint_do_not_move_or_keep_the_fd(tmp_path: Path) -> None:
    p = tmp_path / "a.log"
    p.write_bytes(b"0123456789\n" * 200)
    fd = open_fd(p)
    try:
        os.lseek(fd, 50, os.SEEK_SET)
        assert identity.read_head(fd, 5) == b"01234"
        identity.fingerprint_fd(fd, 2200)
        assert os.lseek(fd, 0, os.SEEK_CUR) == 50        # pread: the fd's position is untouched
    finally:
        os.close(fd)
    before = set(os.listdir("/proc/self/fd"))
    for _ in range(20):
        identity.head_of_path(str(p))
        identity.path_matches(str(p), 5, identity.digest(b"01234"))
    assert set(os.listdir("/proc/self/fd")) == before


def test_a_gzip_still_being_written_is_in_progress_and_a_finished_one_is_not(tmp_path: Path) -> None:
    """logrotate's `compress`: gzip writes app.log.1.gz over time. Until its first block is out the
    file has no first bytes to tell whose copy it is (a look then took it for a file no one saw and
    shipped it again under a new incarnation); such a sibling is `in_progress`, looked at again."""
    import gzip as gz
    content = b"".join(b'{"level":30,"seq":%d,"msg":"request completed"}\n' % i for i in range(400))
    whole = gz.compress(content)
    cases = {"empty.gz": b"", "header.gz": whole[:10], "start.gz": whole[:40], "half.gz": whole[: len(whole) // 2],
             "done.gz": whole, "done-empty.gz": gz.compress(b""), "plain.gz": b"not gzip at all, a plain file"}
    seen = {}
    for name, data in cases.items():
        (tmp_path / name).write_bytes(data)
        sib = identity.look_at(str(tmp_path / name))
        assert sib is not None
        seen[name] = sib.in_progress
    # half written, its first bytes are out already: they tell whose copy it is, nothing to wait for
    assert seen == {"empty.gz": True, "header.gz": True, "start.gz": True, "half.gz": False,
                    "done.gz": False, "done-empty.gz": False, "plain.gz": False}
    for name in ("half.gz", "done.gz"):
        sib = identity.look_at(str(tmp_path / name))
        assert sib is not None and sib.head == content[:FP_MAX_BYTES]
