"""Sender's request slots under the FakeClock: one probe above the adaptive limit when every request
in flight is stalled (sent before the last transport failure, or out too long), never two."""

from __future__ import annotations

import asyncio

from shipper.config import Config, ElasticsearchConfig, RetryConfig
from shipper.events import Events
from shipper.ship.sender import Sender
from tests.support.fake_clock import FakeClock


def _sender(clock: FakeClock) -> Sender:
    cfg = Config(output=ElasticsearchConfig(hosts=("http://127.0.0.1:9",), max_in_flight=4),
                 retry=RetryConfig(initial_backoff_s=0.1, max_backoff_s=1.0))
    return Sender(cfg, Events(), clock)


async def _settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_a_request_sent_before_the_last_transport_failure_lets_one_probe_go_at_once() -> None:
    clock = FakeClock()
    s = _sender(clock)
    hung = await s.slots.acquire()                      # the limit is 1: the only slot
    clock.advance(0.2)
    s.slots.last_transport_failure = clock.monotonic()   # another request just failed without an answer
    clock.advance(0.01)
    probe = await asyncio.wait_for(s.slots.acquire(), 1)    # no fake time needs to pass
    assert s.limit.in_flight == 2 and s.limit.current == 1 and s.slots.probe == probe
    assert clock.waited == []
    third = asyncio.create_task(s.slots.acquire())
    await _settle()
    assert not third.done()                        # never a second probe while one is out
    clock.advance(60.0)
    await _settle()
    assert not third.done()                        # not by time either: it waits for a release
    s.slots.release(probe, 0.01, False)
    token = await asyncio.wait_for(third, 1)       # a slot of the grown limit, or the next probe
    assert s.limit.in_flight == 2 and s.slots.probe in (None, token)
    assert s.limit.in_flight <= s.limit.current + (s.slots.probe is not None)    # at most one above the limit
    s.slots.release(token, 0.01, False)
    s.slots.release(hung, 30.0, True)
    assert s.limit.in_flight == 0 and s.slots.starts == {} and s.slots.probe is None


async def test_a_request_sent_after_the_failure_is_probed_beside_once_it_has_been_out_a_while() -> None:
    clock = FakeClock()
    s = _sender(clock)
    s.slots.last_transport_failure = clock.monotonic()
    clock.advance(0.1)
    hung = await s.slots.acquire()                      # sent after the failure: not suspect yet
    t0 = clock.monotonic()
    probe = await asyncio.wait_for(s.slots.acquire(), 1)
    assert clock.monotonic() - t0 == s.limit.stall_after_s() == 1.0   # waited on the injected clock
    assert s.slots.probe == probe and s.limit.in_flight == 2 and s.peak_in_flight == 2
    s.slots.release(probe, 0.01, False)
    s.slots.release(hung, 30.0, True)


async def test_a_healthy_request_in_flight_holds_the_slot_until_it_is_stalled() -> None:
    clock = FakeClock()
    s = _sender(clock)
    first = await s.slots.acquire()
    waiter = asyncio.create_task(s.slots.acquire())
    await _settle()
    assert not waiter.done()
    s.slots.release(first, 0.01, False)                 # answered in time: the waiter takes its slot
    token = await asyncio.wait_for(waiter, 1)
    assert s.slots.probe is None and s.limit.in_flight == 1
    assert all(w < s.limit.stall_after_s() + 1e-9 for w in clock.waited)
    s.slots.release(token, 0.01, False)


async def test_a_probe_still_waits_for_the_backoff_gate() -> None:
    clock = FakeClock()
    s = _sender(clock)
    hung = await s.slots.acquire()
    s.slots.last_transport_failure = clock.monotonic() + 0.001
    clock.advance(0.01)
    s.resume_at = clock.monotonic() + 0.5          # the failure's backoff
    t0 = clock.monotonic()
    probe = await asyncio.wait_for(s.slots.acquire(), 1)
    assert clock.monotonic() - t0 >= 0.5 and s.slots.probe == probe
    s.slots.release(probe, 0.01, False)
    s.slots.release(hung, 30.0, True)


async def test_while_the_hung_request_stays_out_the_next_requests_go_one_probe_at_a_time() -> None:
    clock = FakeClock()
    s = _sender(clock)
    hung = await s.slots.acquire()
    clock.advance(0.01)
    s.slots.last_transport_failure = clock.monotonic()
    clock.advance(0.01)
    for _ in range(3):                             # delivery goes on, serially, beside the hung one
        token = await asyncio.wait_for(s.slots.acquire(), 1)
        assert s.slots.probe == token and s.limit.in_flight == 2 and s.limit.current == 1
        s.slots.release(token, 0.01, False)             # nobody waiting: the limit stays 1
    assert s.peak_in_flight == 2 and clock.waited == []
    s.slots.release(hung, 30.0, True)
    assert s.slots.starts == {} and s.limit.in_flight == 0
