"""A steady writer on the real clock: while writes keep coming within flush_min_interval, the
reader keeps inotify paused from one read round to the next (no wake-up per write), and the first
round that finds nothing watches again, so a line written after a quiet spell still arrives at
once (an inotify wake-up, not the fallback look). Real files, spool and bulk endpoint.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path

import orjson

from shipper.clock import SystemClock
from shipper.service import build_pipeline
from shipper.sources.files import FileSource
from shipper.spool import AsyncSpool
from shipper.tail.watch import InotifyWatcher
from tests.support.es import ES
from tests.support.fake_clock import RecordingEvents
from tests.support.pipeline_rig import make_config
from tests.support.proxy import FaultProxy


def _line(s: int) -> bytes:
    return orjson.dumps({"level": 30, "time": 1_764_000_000_000 + s, "seq": s, "msg": f"m{s}"}) + b"\n"


async def _until(cond: Callable[[], bool], what: str, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        await asyncio.sleep(0.005)


async def test_a_steady_writer_is_read_with_inotify_paused_and_a_later_line_still_wakes_the_reader(
        tmp_path: Path, es: ES, fault_proxy: FaultProxy) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    log = logs / "app.log"
    log.write_bytes(_line(0))
    cfg = make_config(tmp_path, [str(logs / "*.log")], output_hosts=(fault_proxy.url,), output_index="steady-a",
                      output_index_template="off")
    spool = await AsyncSpool.open(cfg.state_dir)
    p, _files = await build_pipeline(cfg, spool, RecordingEvents(), SystemClock(), host_name="steady")
    await p.start()
    source = next(s for s in p.sources if isinstance(s, FileSource))
    watcher = source.writes.watcher
    assert isinstance(watcher, InotifyWatcher), "inotify is needed for this test"
    try:
        await _until(lambda: p.snapshot().shipped_total >= 1, "the first line shipped")
        held_samples = 0
        with open(log, "ab", buffering=0) as f:
            for s in range(1, 301):                       # ~1,000 one-line writes a second for 0.3 s
                f.write(_line(s))
                await asyncio.sleep(0.001)
                held_samples += bool(p._held and watcher._paused)
        # rounds kept finding lines: the watchers stayed paused across them for most of the run
        assert held_samples > 50, held_samples
        await _until(lambda: p.snapshot().shipped_total >= 301, "301 shipped")
        await _until(lambda: not p._held and not watcher._paused, "watching again after the writes stopped")
        loop = asyncio.get_running_loop()
        selector = loop._selector                      # type: ignore[attr-defined]
        assert selector.get_key(watcher._fd) is not None, "the inotify fd is polled by the loop again"
        with open(log, "ab") as f:
            f.write(_line(301))
        await _until(lambda: p.snapshot().shipped_total >= 302, "the line after the writes stopped")
    finally:
        assert await p.stop(10.0)
        await p.sender.client.close()
        await spool.close()
    await asyncio.to_thread(es.refresh)
    await asyncio.to_thread(es.assert_exactly_once, range(302), index="steady-*")
