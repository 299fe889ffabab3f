"""The destination goes down while the proxy's loop is busy (a loaded machine), then comes back:
the daemon's Sender must deliver again within the backoff, never after a whole request timeout.

This is test_core.py::test_destination_down_for_a_while_then_back in small. Its flake: a bulk
request on a connection accepted in the same loop turn as `down()` was left open and unread by the
proxy (an asyncio race, see FaultProxy._unlisten), so it held the Sender's only slot (the adaptive
limit is 1 after a failure) until the 30 s timeout, and nothing was sent after `up()`.
"""

from __future__ import annotations

import asyncio

import orjson

from shipper.config import Config, ElasticsearchConfig, RetryConfig
from shipper.events import Events
from shipper.model import Batch
from shipper.ship.sender import Sender
from tests.support.es import ES
from tests.support.fake_clock import FakeClock
from tests.support.proxy import FaultProxy


def _batch(seqs: range) -> Batch:
    body = b"".join(orjson.dumps({"create": {"_index": "t", "_id": f"id-{n}"}}) + b"\n" +
                    orjson.dumps({"seq": n}) + b"\n" for n in seqs)
    return Batch(body, False, len(seqs))


async def test_a_request_caught_by_down_on_a_busy_proxy_fails_fast_and_delivery_resumes(
        fault_proxy: FaultProxy, es: ES) -> None:
    fault_proxy.require_basic_auth("shipper", "pw")
    cfg = Config(output=ElasticsearchConfig(hosts=(fault_proxy.url,), compression="none", username="shipper",
                                            password="pw"),       # timeout_s: the default 30 s
                 retry=RetryConfig(initial_backoff_s=0.1, max_backoff_s=1.0))
    s = Sender(cfg, Events(), FakeClock(wall=1_000.0))
    try:
        fault_proxy.stall(1.0)
        task = asyncio.create_task(s.deliver(_batch(range(3))))   # a new connection: into the backlog
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 5
        while s.limit.in_flight == 0:
            assert loop.time() < deadline, "the request did not start"
            await asyncio.sleep(0.01)
        await asyncio.to_thread(fault_proxy.down)    # runs when the stall ends, with the accept
        fault_proxy.up()
        try:
            assert await asyncio.wait_for(task, 5) == []
        except TimeoutError:
            raise AssertionError("delivery did not resume after up(): a request hangs on a dropped connection") from None
        assert s.up is True and s.failures == 0
        assert sorted(d["_source"]["seq"] for d in es.all_docs("t")) == [0, 1, 2]
    finally:
        await s.client.close()
