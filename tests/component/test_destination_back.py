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
import pytest

from shipper.clock import SystemClock
from shipper.config import Config, ElasticsearchConfig, RetryConfig
from shipper.events import Events
from shipper.model import Attempt
from shipper.ship.sender import Sender
from tests.support.es import ES
from tests.support.fake_clock import FakeClock
from tests.support.proxy import FaultProxy


def _batch(seqs: range) -> Attempt:
    body = b"".join(orjson.dumps({"create": {"_index": "t", "_id": f"id-{n}"}}) + b"\n" +
                    orjson.dumps({"seq": n}) + b"\n" for n in seqs)
    return Attempt(body, False, len(seqs))


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


@pytest.mark.parametrize("clock", ["fake", "system"])
async def test_a_hung_request_after_a_transport_failure_does_not_hold_back_the_ready_batches(
        fault_proxy: FaultProxy, es: ES, clock: str) -> None:
    # The first request fails (a dropped connection: the limit on requests in flight is 1 then),
    # the next one is read and indexed but never answered (a dead peer that never resets). The
    # other batches must go within the backoff, not after the 30 s request timeout; the hung one,
    # once its connection drops, is re-sent (409: already there) and acked once, like every batch.
    cfg = Config(output=ElasticsearchConfig(hosts=(fault_proxy.url,), compression="none"),  # timeout_s: 30 s
                 retry=RetryConfig(initial_backoff_s=0.1, max_backoff_s=1.0))
    assert cfg.output.timeout_s == 30.0 and cfg.output.max_in_flight == 4
    s = Sender(cfg, Events(), FakeClock(wall=1_000.0) if clock == "fake" else SystemClock())
    fault_proxy.reset_next(1)
    fault_proxy.hang_next(1, forward=True)
    acked: list[int] = []

    async def worker(i: int) -> list[object]:        # as delivery.py's workers: one batch each
        dead = await s.deliver(_batch(range(3 * i, 3 * i + 3)))
        acked.append(i)
        return list(dead)

    tasks = [asyncio.create_task(worker(i)) for i in range(cfg.output.max_in_flight)]
    try:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 5
        while len(acked) < len(tasks) - 1:
            if loop.time() > deadline:
                raise AssertionError(f"only {len(acked)} of {len(tasks) - 1} batches delivered in 5 s: the hung "
                                     "request holds the only slot until its timeout")
            await asyncio.sleep(0.01)
        assert fault_proxy.hanging == 1 and len(acked) == len(tasks) - 1
        assert s.peak_in_flight <= cfg.output.max_in_flight
        await asyncio.to_thread(fault_proxy.down)     # the hung request's connection drops
        fault_proxy.up()
        assert await asyncio.wait_for(asyncio.gather(*tasks), 5) == [[]] * len(tasks)
        assert sorted(acked) == list(range(len(tasks)))       # every batch acked exactly once
        docs = es.all_docs("t")
        assert sorted(d["_source"]["seq"] for d in docs) == list(range(3 * len(tasks)))   # none lost, none twice
        assert s.up is True and s.failures == 0 and s.limit.in_flight == 0
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await s.client.close()
