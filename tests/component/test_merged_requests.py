"""Batches joined into one bulk request (ship/merge.py, delivery.py) against a real loopback
destination (FaultProxy + osmem) and a real spool, under the fake clock: several queued batches
go as one gzip request (one member), each batch is acked on its own in the spool, each dead letter
goes with the batch its document came from, only failed items are sent again; a 413 on a joined
request splits it and caps later joins; a retry takes a slot before a new request."""

from __future__ import annotations

import asyncio
import gzip
import zlib
from pathlib import Path
from typing import Any

import orjson
from aiohttp import web

from shipper.codec import gzip_compress
from shipper.config import Config, ElasticsearchConfig, RetryConfig
from shipper.delivery import Delivery
from shipper.model import Attempt, Checkpoint
from shipper.ship.concurrency import AdaptiveLimit
from shipper.ship.outbox import Outbox
from shipper.ship.sender import Sender
from shipper.ship.slots import RequestSlots
from shipper.spool import AsyncSpool, Spool
from shipper.spool.keeper import Keeper
from shipper.spool.writer import DiskWait
from tests.support.es import ES
from tests.support.fake_clock import FakeClock, RecordingEvents
from tests.support.proxy import FaultProxy


def _pairs(seqs: range | list[int], pad: str = "") -> bytes:
    return b"".join(orjson.dumps({"create": {"_index": "t", "_id": f"id-{n}"}}) + b"\n" +
                    orjson.dumps({"seq": n, "pad": pad}) + b"\n" for n in seqs)


def _sender(url: str, clock: FakeClock, events: RecordingEvents, **es: Any) -> Sender:
    cfg = Config(output=ElasticsearchConfig(hosts=(url,), **es),
                 retry=RetryConfig(initial_backoff_s=0.1, max_backoff_s=30.0))
    return Sender(cfg, events, clock)


def _seqs(es: ES) -> list[int]:
    return sorted(d["_source"]["seq"] for d in es.all_docs("t"))


class _Rig:
    """A spool holding `batches` (each a range of seqs, gzip), an outbox restored from it, and one
    Delivery worker (the `always` keeper: every batch is a queued row) sending to `url`."""

    def __init__(self, tmp_path: Path, url: str, batches: list[range], **es: Any) -> None:
        self.clock = FakeClock(wall=1_000.0)
        self.events = RecordingEvents()
        self.store = Spool(str(tmp_path / "state"))
        for i, seqs in enumerate(batches):
            cp = Checkpoint("inc", "/var/log/app.log", 1, 2, 0, "", (i + 1) * 100)
            self.store.commit([(_pairs(seqs), len(seqs))], {"inc": (i * 100, (i + 1) * 100)}, [cp], True)
        self.spool = AsyncSpool(self.store)
        self.outbox = Outbox(1 << 30, 4, self.events)
        self.outbox.restore(sorted(self.store.pending.values(), key=lambda m: m.seq))
        self.sender = _sender(url, self.clock, self.events, compression="gzip", **es)
        disk = DiskWait(self.events, self.clock)
        keeper = Keeper("always", 1.0, self.outbox, self.spool, disk, self.events, self.clock)
        self.delivery = Delivery(self.outbox, self.sender, self.spool, disk, self.events, self.clock,
                                 lambda: True, keeper, max_events=2000, max_bytes=5 << 20)

    async def run(self) -> None:
        try:
            await asyncio.wait_for(self.delivery.worker(), 30)
            await self.spool.flush_acks()
        finally:
            await self.sender.client.close()
            await self.spool.close()


async def test_queued_batches_go_as_one_gzip_request_and_each_is_acked_with_its_own_dead_letters(
        tmp_path: Path, es: ES, fault_proxy: FaultProxy) -> None:
    fault_proxy.item_failures(lambda item: (
        429 if item.n in (2, 17) else                                            # retried: batches 1 and 3
        (400, "mapper_parsing_exception", "failed to parse") if item.n in (7, 8) else None))   # dead: batch 2
    rig = _Rig(tmp_path, fault_proxy.url, [range(0, 5), range(5, 12), range(12, 20)])
    seqs = sorted(rig.store.pending)
    await rig.run()
    bulks = [h for h in fault_proxy.history if h.method == "POST"]
    assert len(bulks) == 2                     # the three batches at once, then only the two 429s
    assert fault_proxy.items_seen == 20 + 2
    assert _seqs(es) == [n for n in range(20) if n not in (7, 8)]
    # each batch acked on its own: (seq, delivered, dead), in order
    assert rig.events.of("batch_acked") == [(seqs[0], 5, 0), (seqs[1], 5, 2), (seqs[2], 8, 0)]
    assert rig.events.of("merged") == [(3, 20)]
    assert not rig.store.pending
    assert rig.store.dead_letters == 2
    assert rig.store.checkpoints["inc"].offset == 300


async def test_a_joined_gzip_body_is_one_member(tmp_path: Path) -> None:
    """What the destination receives: one gzip member holding every batch, in order."""
    seen: list[bytes] = []
    async def bulk(request: web.Request) -> web.Response:
        seen.append(await request.read())
        n = gzip.decompress(seen[-1]).count(b"\n") // 2
        items = [{"create": {"_index": "t", "_id": f"x{i}", "status": 201}} for i in range(n)]
        return web.json_response({"errors": False, "items": items})

    app = web.Application()
    app.router.add_post("/_bulk", bulk)
    runner = web.AppRunner(app, auto_decompress=False)      # the body as it came on the wire
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        rig = _Rig(tmp_path, f"http://127.0.0.1:{port}", [range(0, 3), range(3, 9), range(9, 10)])
        await rig.run()
    finally:
        await runner.cleanup()
    [body] = seen
    d = zlib.decompressobj(31)
    assert d.decompress(body) == _pairs(range(10))
    assert d.eof and not d.unused_data


async def test_a_413_on_a_joined_request_splits_it_and_caps_later_joins(tmp_path: Path, es: ES,
                                                                        fault_proxy: FaultProxy) -> None:
    batches = [range(i * 10, i * 10 + 10) for i in range(6)]
    fault_proxy.max_body(len(gzip_compress(_pairs(range(30)))) + 50)   # three batches fit, six do not
    rig = _Rig(tmp_path, fault_proxy.url, batches)
    await rig.run()
    assert _seqs(es) == list(range(60))
    assert fault_proxy.by_status[413] == 1
    assert rig.delivery.merge_max_bytes == sum(len(_pairs(b)) for b in batches) // 2
    assert not rig.store.pending and rig.store.dead_letters == 0


async def test_positions_of_dead_letters_survive_item_retries_and_413_halving(es: ES, fault_proxy: FaultProxy) -> None:
    fault_proxy.max_body(2500)
    fault_proxy.item_failures(lambda item: 429 if item.n == 1 else None)
    clock, events = FakeClock(wall=1_000.0), RecordingEvents()
    s = _sender(fault_proxy.url, clock, events, compression="none")
    try:
        body = _pairs(range(20)) + _pairs([20], pad="x" * 4000) + _pairs(range(21, 40))
        dead = await s.deliver_items(Attempt(body, False, 40))
        assert [(pos, orjson.loads(d.document)["seq"], d.status) for pos, d in dead] == [(20, 20, 413)]
        assert s.too_large >= 1
        assert _seqs(es) == [n for n in range(40) if n != 20]
    finally:
        await s.client.close()


async def test_a_retry_takes_a_slot_before_any_new_request() -> None:
    clock = FakeClock()
    slots = RequestSlots(AdaptiveLimit(max_limit=1), clock, 30.0, lambda now: 0.0)
    first = await slots.acquire()
    order: list[str] = []

    async def take(name: str, urgent: bool) -> None:
        token = await slots.acquire(urgent=urgent)
        order.append(name)
        slots.release(token, 0.01, False)

    new = asyncio.create_task(take("new", False))
    await asyncio.sleep(0)
    retry = asyncio.create_task(take("retry", True))
    for _ in range(5):
        await asyncio.sleep(0)
    slots.release(first, 0.01, False)
    await asyncio.wait_for(asyncio.gather(new, retry), 5)
    assert order == ["retry", "new"]
    token = await slots.acquire()            # a slot reserved and not used is given back whole
    slots.cancel(token)
    assert slots.limit.in_flight == 0 and not slots.starts
