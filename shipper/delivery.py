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
from shipper.ship import merge
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
                 clock: Clock, finished: Callable[[], bool], keeper: Keeper, *, max_events: int,
                 max_bytes: int) -> None:
        self.keeper = keeper
        self.max_events = max_events          # a merged request's bounds: bulk_max_events, bulk_max_bytes
        self.merge_max_bytes = max_bytes      # lowered after a merged request was answered 413
        self.outbox = outbox
        self.sender = sender
        self.spool = spool
        self.disk = disk
        self.events = events
        self.clock = clock
        self._finished = finished     # reading is done and everything read is in the outbox
        self.on_ack: Callable[[], None] = _nothing

    async def worker(self) -> None:
        """Take batches in order and deliver each; return once reading is done and nothing is left.
        Several waiting (every slot was busy: behind) go as one request of up to bulk_max_events
        and bulk_max_bytes (ship/merge.py), each still acked, dead-lettered and checkpointed as
        its own batch: requests stay full however small the drafts flush_interval cut."""
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
            # the slot first, then the batches: whatever waits when a request may go goes in it
            # (a sender holding batches while it waits for a slot would send them small)
            token = await self.sender.reserve()
            if not len(ob):
                self.sender.unreserve(token)      # another sender took them meanwhile
                continue
            group = ob.take_group(self.max_events, self.merge_max_bytes)
            try:
                if len(group) == 1:
                    await self._deliver_one(*group[0], token)
                else:
                    await self._deliver_merged(group, token)
            finally:
                self.sender.unreserve(token)      # no-op once its request went
                ob.done()
                self.on_ack()     # a draft held back for a free slot may go now

    async def _deliver_one(self, meta: BatchMeta, body: bytes | None, token: int) -> None:
        if body is None:
            body = await self.spool.read(meta.seq)
        if body is None:
            log.error("queue record missing", extra={"seq": meta.seq})
            self.outbox.lost(meta)
            return
        dead = await self.sender.deliver_items(Attempt(body, meta.gzipped, meta.events), token)
        await self._ack(meta, [d for _, d in dead])

    async def _deliver_merged(self, group: list[tuple[BatchMeta, bytes | None]], token: int) -> None:
        """One request of several batches: their bodies joined on the spool thread (re-compressed
        as one gzip member), each document's dead letter back to its batch, each batch acked."""
        body, missing = await self.spool.joined([b if b is not None else m.seq for m, b in group],
                                                group[0][0].gzipped)
        if missing:
            for meta, _ in group:
                if meta.seq in missing:
                    log.error("queue record missing", extra={"seq": meta.seq})
                    self.outbox.lost(meta)
            group = [g for g in group if g[0].seq not in missing]
            if not group:
                return
        metas = [meta for meta, _ in group]
        counts = [meta.events for meta in metas]
        too_large = self.sender.too_large
        dead = await self.sender.deliver_items(Attempt(body, metas[0].gzipped, sum(counts)), token)
        if self.sender.too_large > too_large:
            self.merge_max_bytes = merge.split_cap(sum(m.raw_bytes for m in metas), self.merge_max_bytes)
        self.events.merged(len(metas), sum(counts))
        for meta, its_dead in zip(metas, merge.by_record(counts, dead), strict=True):
            await self._ack(meta, its_dead)

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
