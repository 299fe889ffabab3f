"""The sender workers: outbox -> ship.Sender (bulk requests until every document is acked or
dead-lettered) -> the ack in the spool, which drops the batch, or (sent from memory) to the keeper,
whose window lets its checkpoints move. `max_in_flight` workers run; a batch whose body is not
cached is read from the spool first. Nothing leaves before it is acked."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from shipper.clock import Clock
from shipper.events import Events
from shipper.model import Attempt, BatchMeta, DeadLetter
from shipper.ship.outbox import Outbox
from shipper.ship.sender import Sender
from shipper.spool.aio import AsyncSpool
from shipper.spool.keeper import Keeper
from shipper.spool.writer import DiskWait

log = logging.getLogger("shipper.output")

# An idle sender waits for `outbox.wait_for_batch()`, woken by a batch added and when reading is
# done (the end the senders return at). No timeout: an idle daemon does not wake its
# max_in_flight senders at all.


class Delivery:
    def __init__(self, outbox: Outbox, sender: Sender, spool: AsyncSpool, disk: DiskWait, events: Events,
                 clock: Clock, finished: Callable[[], bool], keeper: Keeper) -> None:
        self.keeper = keeper
        self.outbox = outbox
        self.sender = sender
        self.spool = spool
        self.disk = disk
        self.events = events
        self.clock = clock
        self._finished = finished     # reading is done and everything read is in the outbox
        self.on_ack: Callable[[], None] = _nothing

    async def worker(self) -> None:
        """Take batches in order and deliver each; return once reading is done and nothing is left."""
        ob = self.outbox
        while True:
            while not len(ob):
                if self._finished():
                    return
                woken = ob.wait_for_batch()
                try:
                    await woken
                except asyncio.CancelledError:
                    ob.pass_wake_on(woken)
                    raise
            meta, body = ob.take()
            try:
                if body is None:
                    body = await self.spool.read(meta.seq)
                if body is None:
                    log.error("queue record missing", extra={"seq": meta.seq})
                    ob.lost(meta)
                    continue
                dead = await self.sender.deliver(Attempt(body, meta.gzipped, meta.events))
                await self._ack(meta, dead)
            finally:
                ob.done()
                self.on_ack()     # a draft held back for a free slot may go now

    async def _ack(self, meta: BatchMeta, dead: list[DeadLetter]) -> None:
        if meta.seq < 0:
            # sent from memory: the keeper's (its dead letters stored first); spilled meanwhile, its row
            held = await self.keeper.delivered(meta, dead)
            delivered = meta.events - len(dead)
            self.outbox.acked(held, delivered)
            self.events.batch_acked(held.seq, delivered, len(dead))
            if dead:
                self.events.dead_lettered(len(dead), dead[0].reason)
            return
        if dead:
            await self.disk.run(lambda: self.spool.ack(meta.seq, dead))   # with its dead letters, now
        else:
            self.spool.ack_soon(meta.seq)      # carried by the next commit's transaction (or lingers)
        delivered = meta.events - len(dead)
        self.outbox.acked(meta, delivered)
        self.events.batch_acked(meta.seq, delivered, len(dead))
        if dead:
            self.events.dead_lettered(len(dead), dead[0].reason)


def _nothing() -> None:
    return None
