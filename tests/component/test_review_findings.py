"""Reproductions of the bugs found by the code review, one test each, on real files and a real spool.

Each test failed before its fix: a JSON line nested deeper than orjson serialises stopped the
reader; `shipper status` of a stopped daemon printed URL credentials; a commit cancelled while the
spool thread was busy dropped the lines it had taken; senders left before the final commit.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from pathlib import Path

import orjson
import pytest

from shipper.commands import status as status_cmd
from shipper.config import Config, ElasticsearchConfig, InputConfig, MetricsConfig
from shipper.parse.document import DocBuilder
from tests.support.pipeline_rig import Rig, make_config

DEEP = b'{"a":' + b"[" * 300 + b"]" * 300 + b"}"


@pytest.mark.parametrize("fields", [{}, {"host": "pinned"}])   # spliced path, re-serialised path
async def test_json_nested_deeper_than_orjson_writes_is_shipped_as_text(tmp_path: Path, fields: dict[str, str]) -> None:
    """orjson parses up to 1024 levels but serialises only 255: such a line once raised TypeError
    in the reader (the daemon exited, and again after each restart at the same offset)."""
    log = tmp_path / "app.log"
    log.write_bytes(b'{"msg":"one"}\n' + DEEP + b'\n{"msg":"two"}\n')
    rig = Rig(tmp_path, [str(tmp_path / "*.log")], input_fields=fields)
    try:
        await rig.step()
        docs = sorted(rig.docs.values(), key=lambda d: d["log"]["offset"])
        assert [d["message"] for d in docs] == ["one", DEEP.decode(), "two"]
        assert docs[1]["log"]["flags"] == ["json_parse_failed"]
        assert "flags" not in docs[0]["log"] and "flags" not in docs[2]["log"]
        assert rig.p.sources and all(s.checkpoint.offset == log.stat().st_size for s in rig.p.sources.values())
    finally:
        await rig.close()


def test_docbuilder_build_keeps_order_and_byte_count_with_a_deep_line() -> None:
    b = DocBuilder(InputConfig(paths=("/x",)), "logs", "h")
    out: list[bytes] = [b"earlier"]
    events = [(0, 5, b'{"n":1}', 0), (5, 5 + len(DEEP) + 1, DEEP, 0), (400, 410, b"plain text", 0)]
    n = b.build("inc", "/x", events, 1.0, out)
    assert out[0] == b"earlier" and len(out) == 4
    assert n == sum(map(len, out[1:]))
    ids = [orjson.loads(p.split(b"\n", 1)[0])["create"]["_id"] for p in out[1:]]
    assert ids == ["inc-0", "inc-5", "inc-400"]


def test_status_of_a_stopped_daemon_never_shows_url_credentials(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """No status.json yet (never ran, or removed): the hosts shown came from the config as written."""
    cfg = Config(state_dir=str(tmp_path / "state"), metrics=MetricsConfig(listen=None),
                 output=ElasticsearchConfig(hosts=("https://elastic:s3cr3t-pw@127.0.0.1:9200",)))
    doc = status_cmd.collect(cfg, time.time())
    text = orjson.dumps(doc).decode() + status_cmd.render(doc, cfg.state_dir, 0.0)
    assert "s3cr3t-pw" not in text
    assert "127.0.0.1:9200" in text


async def test_commit_cancelled_while_the_spool_thread_is_busy_keeps_its_lines(tmp_path: Path) -> None:
    """commit() takes the accumulator, then waits for the spool thread (busy with an ack, say). A
    cancellation then (shipper pipe interrupted, the reader cancelled at stop or reload) cancelled
    the queued write: the lines it had taken were in no record, and stdin cannot be read again."""
    log = tmp_path / "app.log"
    log.write_bytes(b"".join(b"line %d\n" % i for i in range(10)))
    rig = Rig(tmp_path, [str(tmp_path / "*.log")])
    p = rig.p
    busy = threading.Event()
    release = threading.Event()

    def occupy() -> None:
        busy.set()
        release.wait(10)

    try:
        await p.rescan()
        await p.open_waiting()
        assert p.read_round()
        assert p.writer.draft.events == 10
        blocker = asyncio.ensure_future(rig.spool._call(occupy))
        await asyncio.to_thread(busy.wait, 10)
        committing = asyncio.ensure_future(p.commit())
        for _ in range(5):
            await asyncio.sleep(0)
        assert p.committing
        committing.cancel()
        await asyncio.gather(committing, return_exceptions=True)
        release.set()
        await blocker
        await p.commit()          # the next commit waits for the one in progress
        await rig.collect()
        assert sorted(rig.messages()) == sorted(f"line {i}" for i in range(10))
    finally:
        release.set()
        await rig.close()


async def test_senders_stay_until_the_final_commit_is_queued(tmp_path: Path, es) -> None:
    """Stopping: a sender that looked while the accumulator was empty returned, so the record
    `stop_reading` commits last (a deleted file's last line without newline) waited out
    shutdown_timeout with nobody to send it."""
    log = tmp_path / "app.log"
    log.write_bytes(b'{"seq":1}\n{"seq":2}')          # the last line has no newline yet
    cfg = make_config(tmp_path, [str(tmp_path / "*.log")], output_hosts=(es.url,), output_max_in_flight=1,
                      output_index="review")
    from shipper.clock import SystemClock
    from shipper.events import Events
    from shipper.service import build_pipeline
    from shipper.spool import AsyncSpool
    spool = await AsyncSpool.open(cfg.state_dir)
    p, _files = await build_pipeline(cfg, spool, Events(), SystemClock(), host_name="rig")
    try:
        await p.start()
        deadline = time.monotonic() + 10
        while p.snapshot().shipped_total < 1:
            assert time.monotonic() < deadline, "the first line was not delivered"
            await asyncio.sleep(0.02)
        os.unlink(log)                # deleted with its last line still without a newline
        assert await p.stop(10.0), "nobody sent the final record"
        es.refresh()
        es.assert_exactly_once([1, 2], index="review")
    finally:
        await p.stop(0.0)
        await p.sender.client.close()
        await spool.close()


async def test_reload_builds_the_new_pipeline_after_the_spool_thread_settled(tmp_path: Path) -> None:
    """SIGHUP cancels the senders; an ack they had handed to the spool thread still runs there. The
    new Pipeline read `spool.pending` / `spool.checkpoints` while that thread changed them (a
    KeyError or 'dictionary changed size' killed the daemon in the rare case; a needless re-send
    otherwise). It must be built once every spool call submitted before it has finished."""
    import time as _time

    from shipper.config import load_config
    from shipper.service import Service
    from tests.support.daemon import write_config

    (tmp_path / "logs").mkdir()
    path = write_config(tmp_path, es_url="http://127.0.0.1:9", paths=str(tmp_path / "logs" / "*.log"),
                        extra_yaml={"metrics": {"listen": None}})
    svc = Service(load_config(str(path)), str(path))
    await svc.startup()
    try:
        aspool = svc.spool
        assert aspool is not None
        records = await aspool._call(aspool._spool.commit, [(b'{"create":{}}\n{}\n', 1)], {}, [], False)
        seq = records[0][0].seq
        closed = threading.Event()

        def slow_ack() -> None:         # an ack handed over by a sender that is then cancelled
            closed.wait(10)
            _time.sleep(0.2)            # the transaction's fsync
            aspool._spool.ack(seq)

        ack = asyncio.ensure_future(aspool._call(slow_ack))
        old = svc.pipeline
        assert old is not None
        real_close = old.sender.client.close

        async def close_then_release() -> None:
            await real_close()
            closed.set()                # the old pipeline is stopped: reload builds the new one now

        old.sender.client.close = close_then_release  # type: ignore[method-assign]
        await svc.reload()
        assert svc.pipeline is not old and svc.pipeline is not None
        assert seq not in svc.pipeline.outbox.pending
        assert svc.pipeline.snapshot().queue_events == 0
        await ack
    finally:
        svc.stop_event.set()
        await svc.shutdown()
