"""The rotation helpers leave exactly the file layout the real logrotate leaves."""

from __future__ import annotations

import gzip
import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.support.rotate import (
    LogrotateError,
    logrotate_conf,
    rotate,
    rotate_compress,
    rotate_copytruncate,
    rotate_delaycompress,
    rotate_rename,
    run_logrotate,
)
from tests.support.writer import pino_line, write_lines

pytestmark = pytest.mark.skipif(not os.path.exists("/usr/sbin/logrotate"), reason="logrotate is not installed")


def layout(d: Path) -> dict[str, tuple[bytes, int]]:
    """name -> (content, decompressed for .gz; permission bits) of every file in `d`."""
    out = {}
    for p in sorted(d.iterdir()):
        data = p.read_bytes()
        if p.name.endswith(".gz"):
            data = gzip.decompress(data)
        out[p.name] = (data, stat.S_IMODE(p.stat().st_mode))
    return out


def lines(first: int, n: int) -> list[int]:
    return list(range(first, first + n))


CASES: dict[str, tuple[dict[str, Any], Callable[[Path, int], None]]] = {
    "create": (dict(mode="create"), lambda p, k: rotate_rename(p, keep=k)),
    "copytruncate": (dict(mode="copytruncate"), lambda p, k: rotate_copytruncate(p, keep=k)),
    "compress": (dict(mode="create", compress=True), lambda p, k: rotate_compress(p, keep=k)),
    "delaycompress": (dict(mode="create", compress=True, delaycompress=True), lambda p, k: rotate_delaycompress(p, keep=k)),
    "copytruncate+compress": (
        dict(mode="copytruncate", compress=True), lambda p, k: rotate(p, mode="copytruncate", keep=k, compress=True)
    ),
    "copytruncate+delaycompress": (
        dict(mode="copytruncate", compress=True, delaycompress=True),
        lambda p, k: rotate(p, mode="copytruncate", keep=k, compress=True, delaycompress=True),
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_helpers_match_real_logrotate(tmp_path: Path, case: str) -> None:
    options, helper = CASES[case]
    keep = 3
    ours, theirs = tmp_path / "ours", tmp_path / "theirs"
    for d in (ours, theirs):
        d.mkdir()
        (d / "app.log").touch()
        os.chmod(d / "app.log", 0o640)
    conf = logrotate_conf(theirs / "app.log", rotate=keep, **options)
    seq = 0
    for _round in range(keep + 2):  # enough rounds to shift past `keep` and delete the oldest
        for d in (ours, theirs):
            write_lines(d / "app.log", lines(seq, 5), line_fn=lambda s: pino_line(s, time=1_700_000_000_000 + s))
        seq += 5
        helper(ours / "app.log", keep)
        run_logrotate(conf, tmp_path / "logrotate.state")
        assert layout(ours) == layout(theirs), f"after rotation {_round + 1}"
    names = sorted(layout(ours))
    assert names[0] == "app.log" and len(names) == keep + 1  # the oldest rotation was deleted
    assert (ours / "app.log").stat().st_size == 0


def test_rename_keeps_inode_in_rotated_copy_and_mode_on_new_file(tmp_path: Path) -> None:
    log = tmp_path / "app.log"
    write_lines(log, range(3))
    os.chmod(log, 0o600)
    inode = log.stat().st_ino
    rotate_rename(log)
    assert (tmp_path / "app.log.1").stat().st_ino == inode
    assert log.stat().st_size == 0 and log.stat().st_ino != inode
    assert stat.S_IMODE(log.stat().st_mode) == 0o600


def test_copytruncate_copies_before_truncating(tmp_path: Path) -> None:
    log = tmp_path / "app.log"
    write_lines(log, range(3))
    inode = log.stat().st_ino
    before = log.read_bytes()
    seen: list[bytes] = []
    rotate_copytruncate(log, after_copy=lambda: seen.append((tmp_path / "app.log.1").read_bytes()))
    assert seen == [before]  # the copy was complete before the truncate
    assert log.stat().st_ino == inode and log.stat().st_size == 0
    assert (tmp_path / "app.log.1").read_bytes() == before


def test_delaycompress_layout_over_three_rotations(tmp_path: Path) -> None:
    log = tmp_path / "app.log"
    contents = []
    for i in range(3):
        write_lines(log, [i])
        contents.append(log.read_bytes())
        rotate_delaycompress(log)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["app.log", "app.log.1", "app.log.2.gz", "app.log.3.gz"]
    assert (tmp_path / "app.log.1").read_bytes() == contents[2]
    assert gzip.decompress((tmp_path / "app.log.2.gz").read_bytes()) == contents[1]
    assert gzip.decompress((tmp_path / "app.log.3.gz").read_bytes()) == contents[0]


def test_logrotate_in_a_world_writable_dir_needs_su(tmp_path: Path) -> None:
    d = tmp_path / "shared"
    d.mkdir()
    os.chmod(d, 0o777)
    write_lines(d / "app.log", range(2))
    run_logrotate(logrotate_conf(d / "app.log"), tmp_path / "state")  # `su` in the conf makes it work
    assert (d / "app.log.1").exists()
    bare = f"{d / 'app.log'} {{\n    rotate 2\n    create\n}}\n"
    with pytest.raises(LogrotateError, match="insecure permissions"):
        run_logrotate(bare, tmp_path / "state")


def test_run_logrotate_raises_when_config_is_ignored(tmp_path: Path) -> None:
    log = tmp_path / "app.log"
    write_lines(log, range(2))
    conf = tmp_path / "lr.conf"
    conf.write_text("this is not { a valid logrotate config\n")
    with pytest.raises(LogrotateError):
        run_logrotate(conf, tmp_path / "state")
