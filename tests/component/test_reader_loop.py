"""The real reader loop (`Pipeline.start`), in-process under the fake clock, through rotation, a
destination outage and backpressure, with a real spool, real files and a real bulk endpoint behind
the fault proxy. Only public surfaces: start/stop/snapshot, the recorded occurrences, and ES.

Waits poll the pipeline's snapshot or ES under a deadline (never a sleep); the fake clock lets
every timer (poll tick, flush_interval, backoff) run out as soon as the loop waits on it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

from shipper.pipeline import Pipeline
from shipper.service import build_pipeline
from shipper.spool import AsyncSpool
from tests.support.es import ES
from tests.support.fake_clock import FakeClock, RecordingEvents
from tests.support.pipeline_rig import make_config
from tests.support.proxy import FaultProxy
from tests.support.rotate import rotate_copytruncate, rotate_rename


def _write(path: Path, seqs: range) -> None:
    with open(path, "ab") as f:
        f.write(b"".join(orjson.dumps({"level": 30, "time": 1_764_000_000_000 + s, "seq": s, "msg": f"m{s}",
                                       "pad": "x" * 200}) + b"\n" for s in seqs))


async def _until(cond: Callable[[], bool], what: Callable[[], str] | str, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what if isinstance(what, str) else what()}")
        await asyncio.sleep(0.01)


async def _count(es: ES) -> int:
    return await asyncio.to_thread(es.count, "loop-*")


async def _start(tmp_path: Path, url: str, **kw: Any) -> tuple[Pipeline, AsyncSpool, FakeClock, RecordingEvents]:
    cfg = make_config(tmp_path, [str(tmp_path / "logs" / "*.log")], output_hosts=(url,), output_index="loop-a",
                      output_index_template="off", **kw)
    spool = await AsyncSpool.open(cfg.state_dir)
    clock, events = FakeClock(), RecordingEvents()
    p, _files = await build_pipeline(cfg, spool, events, clock, host_name="loop")
    await p.start()
    return p, spool, clock, events


async def _stop(p: Pipeline, spool: AsyncSpool, timeout_s: float = 10.0) -> bool:
    ok = await p.stop(timeout_s)
    await p.sender.client.close()
    await spool.close()
    return ok


async def test_the_reader_loop_follows_rotation_through_an_outage_exactly_once(
        tmp_path: Path, es: ES, fault_proxy: FaultProxy) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    log = logs / "app.log"
    _write(log, range(0, 300))
    p, spool, clock, events = await _start(tmp_path, fault_proxy.url)
    try:
        await _until(lambda: p.snapshot().shipped_total >= 300, lambda: f"300 shipped ({p.snapshot()})")
        fault_proxy.down()                    # the destination goes away: reading and queueing go on
        rotate_rename(log)
        _write(log, range(300, 600))
        await _until(lambda: p.snapshot().queue_events >= 300, lambda: f"300 queued ({p.snapshot().queue_events})")
        rotate_copytruncate(log)
        _write(log, range(600, 900))
        await _until(lambda: not p.snapshot().output_up or p.snapshot().queue_events >= 600, "the output seen down")
        fault_proxy.up()
        await _until(lambda: p.snapshot().shipped_total >= 900, lambda: f"900 shipped ({p.snapshot().shipped_total})")
        assert p.snapshot().drained or p.snapshot().queue_events == 0
        assert events.of("file_opened"), "the rotated names were followed by identity"
        assert any(d > 0 for d in clock.slept), "the outage was waited out through the injected clock"
    finally:
        assert await _stop(p, spool)
    await asyncio.to_thread(es.refresh)
    await asyncio.to_thread(es.assert_exactly_once, range(900), index="loop-*")


async def test_backpressure_pauses_reading_and_resumes_when_the_queue_drains(
        tmp_path: Path, es: ES, fault_proxy: FaultProxy) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    log = logs / "app.log"
    fault_proxy.down()
    _write(log, range(0, 3000))               # ~900 KB read: far over a 64 KiB queue
    p, spool, clock, events = await _start(tmp_path, fault_proxy.url, output_bulk_max_events=200)
    p.outbox.max_queue_bytes = 64 * 1024      # (the loader refuses a queue this small; the rule is the same)
    try:
        await _until(lambda: p.snapshot().paused, "reading paused at queue.max_bytes")
        queued = p.snapshot().queue_events
        assert 0 < queued < 3000
        lag = sum(f.lag_bytes for f in p.snapshot().files)
        assert lag > 0, "the files are the buffer: what was not read is lag, not memory"
        assert events.of("backpressure")[0][0] is True
        fault_proxy.up()
        await _until(lambda: p.snapshot().shipped_total >= 3000, lambda: f"3000 shipped ({p.snapshot().shipped_total})")
        # the last reads may fill the small queue again: reading resumes once the acks drain it
        await _until(lambda: not p.snapshot().paused, "reading resumed after the queue drained")
        assert [a[0] for a in events.of("backpressure")][:2] == [True, False]
    finally:
        assert await _stop(p, spool)
    await asyncio.to_thread(es.refresh)
    await asyncio.to_thread(es.assert_exactly_once, range(3000), index="loop-*")


async def test_stop_hands_over_the_last_lines_and_a_restart_reads_on_exactly_once(
        tmp_path: Path, es: ES, fault_proxy: FaultProxy) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    log = logs / "app.log"
    _write(log, range(0, 100))
    p, spool, _clock, _events = await _start(tmp_path, fault_proxy.url)
    await _until(lambda: p.snapshot().shipped_total >= 100, "100 shipped")
    _write(log, range(100, 150))
    assert await _stop(p, spool)              # the last lines go before the stop returns
    _write(log, range(150, 200))
    p, spool, _clock, _events = await _start(tmp_path, fault_proxy.url)
    try:
        await _until(lambda: p.snapshot().shipped_total >= 50, "the lines written while stopped")
    finally:
        assert await _stop(p, spool)
    await asyncio.to_thread(es.refresh)
    await asyncio.to_thread(es.assert_exactly_once, range(200), index="loop-*")
