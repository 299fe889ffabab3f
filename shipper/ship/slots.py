"""Request slots: a bulk request waits for the gate (the backoff, a usable host), then for a slot
under the adaptive limit (concurrency.py), or goes as the one probe beside requests that all
stalled. The sender holds one and releases each slot with what its request answered."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from shipper.clock import Clock
from shipper.ship.concurrency import AdaptiveLimit

log = logging.getLogger("shipper.output")


class RequestSlots:
    """`gate(now)`: how long before any request may start. `probe`: the token of the request let
    go above the limit while it is out; `starts`: token -> when each request in flight started;
    `last_transport_failure`: when the last request ended without an answer (monotonic)."""

    def __init__(self, limit: AdaptiveLimit, clock: Clock, timeout_s: float, gate: Callable[[float], float]) -> None:
        self.limit = limit
        self.clock = clock
        self.timeout_s = timeout_s
        self.gate = gate
        self._freed = asyncio.Event()  # set (and replaced) when a request ends: the waiting ones look again
        self._waiting = 0             # requests ready to go, held back by the limit
        self._urgent = 0              # retries waiting for a slot: they go before any new request
        self.starts: dict[int, float] = {}
        self._tokens = 0
        self.probe: int | None = None
        self.last_transport_failure = float("-inf")
        self.peak_in_flight = 0

    async def acquire(self, urgent: bool = False) -> int:
        """Wait for the gate, then for a slot under the adaptive limit, or for the moment every
        request in flight is stalled and one probe may go beside them (`AdaptiveLimit.probe_in`).
        `urgent`: a retry, whose documents are older than anything not yet sent; no other request
        takes a slot while one waits (after an outage the oldest batch goes first, not after the
        queue's newer ones). Returns the request's token for `release`."""
        if urgent:
            self._urgent += 1
        try:
            return await self._acquire(urgent)
        finally:
            if urgent:
                self._urgent -= 1
                self._wake()         # the others may take the slots left

    async def _acquire(self, urgent: bool) -> int:
        while True:
            now = self.clock.monotonic()
            wait = self.gate(now)
            if wait > 0:
                await self.clock.sleep(wait)
                continue
            probe = False
            if not urgent and self._urgent:
                self._waiting += 1
                try:
                    await self._freed.wait()
                finally:
                    self._waiting -= 1
                continue
            if not self.limit.can_start():
                after = self.limit.probe_in(self.starts.values(), self.probe is not None,
                                            self.last_transport_failure, now, self.timeout_s)
                if after is None or after > 0:
                    freed = self._freed
                    self._waiting += 1
                    try:
                        if after is None:
                            await freed.wait()
                        else:
                            await self.clock.wait(freed, after)
                    finally:
                        self._waiting -= 1
                    continue       # look at the gate again: a failure may have closed it meanwhile
                probe = True
            self.limit.started()
            self._tokens += 1
            token = self._tokens
            self.starts[token] = now
            if probe:
                self.probe = token
                log.debug("probe request sent beside stalled ones",
                          extra={"in_flight": self.limit.in_flight, "limit": self.limit.current})
            self.peak_in_flight = max(self.peak_in_flight, self.limit.in_flight)
            return token

    def release(self, token: int, rtt_s: float, pushback: bool) -> None:
        """The request of `token` ended after `rtt_s`; `pushback`: the destination asked for less."""
        self.starts.pop(token, None)
        if self.probe == token:
            self.probe = None
        self.limit.finished(self.clock.monotonic(), rtt_s, pushback, self._waiting > 0)
        self._wake()

    def cancel(self, token: int) -> None:
        """A slot acquired and not used (its sender found nothing left to send): given back as if
        never taken, with no round trip for the adaptive limit."""
        if self.starts.pop(token, None) is None:
            return
        if self.probe == token:
            self.probe = None
        self.limit.in_flight = max(0, self.limit.in_flight - 1)
        self._wake()

    def pushback(self) -> None:
        """Items rejected for load (429 es_rejected_execution_exception): shrink the limit like a 429."""
        self.limit.started()
        self.limit.finished(self.clock.monotonic(), 0.0, True)
        self._wake()

    def _wake(self) -> None:
        self._freed.set()
        self._freed = asyncio.Event()
