"""Writers and waiting helpers: line shape, O_APPEND writing, the background Writer under rotation."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from tests.support.rotate import rotate_copytruncate, rotate_rename
from tests.support.wait import async_wait_until, wait_until
from tests.support.writer import Writer, pino_line, write_lines


def seqs_in(*paths: Path) -> list[int]:
    out = []
    for p in paths:
        for line in p.read_bytes().splitlines():
            line = line.lstrip(b"\0")
            if line:
                out.append(json.loads(line)["seq"])
    return out


def test_pino_line_shape() -> None:
    line = pino_line(12345)
    assert 200 <= len(line) <= 350 and line.endswith(b"\n") and line.count(b"\n") == 1
    doc = json.loads(line)
    assert doc["level"] == 30 and doc["seq"] == 12345 and isinstance(doc["time"], int)
    assert {"pid", "hostname", "msg", "reqId"} <= set(doc)
    assert json.loads(pino_line(1, level=50, msg="boom", time=0)) == {**json.loads(pino_line(1, time=0)), "level": 50, "msg": "boom"}


def test_write_lines_appends(tmp_path: Path) -> None:
    log = tmp_path / "a.log"
    n = write_lines(log, range(3))
    n += write_lines(log, range(3, 5), fsync=True)
    assert log.stat().st_size == n and seqs_in(log) == [0, 1, 2, 3, 4]


def test_writer_follows_rename_rotation(tmp_path: Path) -> None:
    log = tmp_path / "app.log"
    with Writer(log, rate=2000) as w:
        wait_until(lambda: w.count >= 200, "200 lines written")
        rotate_rename(log)
        first = w.count
        wait_until(lambda: w.count >= first + 200 and log.stat().st_size > 0, "lines in the new app.log")
        w.pause()
    written = w.written
    assert written == list(range(len(written)))
    assert sorted(seqs_in(log, tmp_path / "app.log.1")) == written
    assert seqs_in(log)  # the writer reopened by path


def test_writer_max_lines_and_pause(tmp_path: Path) -> None:
    log = tmp_path / "app.log"
    w = Writer(log, rate=5000, max_lines=300, start_seq=1000).start()
    wait_until(lambda: w.is_done, "the writer to finish 300 lines")
    assert w.stop() == list(range(1000, 1300)) and seqs_in(log) == w.written


def test_writer_kept_open_without_o_append_leaves_nul_hole_after_copytruncate(tmp_path: Path) -> None:
    log = tmp_path / "app.log"
    with Writer(log, rate=2000, keep_open=True, o_append=False) as w:
        wait_until(lambda: w.count >= 50, "50 lines")
        w.pause()
        size = log.stat().st_size
        rotate_copytruncate(log)
        w.resume()
        wait_until(lambda: log.stat().st_size > size, "writes past the old offset")
    assert log.read_bytes().startswith(b"\0" * 10)
    assert sorted(seqs_in(log, tmp_path / "app.log.1")) == w.written


def test_writer_error_surfaces_on_stop(tmp_path: Path) -> None:
    w = Writer(tmp_path / "no" / "such" / "dir.log").start()
    wait_until(lambda: w.is_done, "the writer thread to die")
    with pytest.raises(AssertionError, match="FileNotFoundError"):
        w.stop()


def test_wait_until_returns_value_and_names_what_timed_out() -> None:
    assert wait_until(lambda: 42, "the answer") == 42
    with pytest.raises(AssertionError, match=r"timed out after 0.05s waiting for nothing \(state=7\)"):
        wait_until(lambda: False, lambda: "nothing (state=7)", timeout_s=0.05)


async def test_async_wait_until() -> None:
    box: list[int] = []

    async def later() -> None:
        box.append(1)

    task = asyncio.get_running_loop().create_task(later())
    assert await async_wait_until(lambda: box, "the task to run") == [1]
    await task
    with pytest.raises(AssertionError, match="waiting for never"):
        await async_wait_until(lambda: None, "never", timeout_s=0.05)
