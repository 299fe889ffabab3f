"""Dead-letter requests to a running daemon: `shipper dlq replay|purge` leaves a request file.

The command must not write the spool beside the daemon (its in-memory queue would not know the
new batches), so it leaves a request file; the daemon claims it by renaming it, acts on its own
spool thread and writes the answer. A claimed request that a crash interrupted is acted on at the
next start (replay and purge are idempotent). One service task (`DeadLetterControl.run`) answers.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any, Callable

from shipper.clock import Clock
from shipper.events import Events
from shipper.model import BatchMeta
from shipper.spool.store import AsyncSpool
from shipper.spool.writer import DiskWait

CHECK_EVERY_S = 1.0           # how often the daemon looks for a request


DLQ_REQUEST = "dlq.request"
DLQ_ANSWER = "dlq.answer"


def dlq_request(state_dir: str, action: str, nonce: str) -> None:
    """Leave a request for the daemon (atomically: it never sees half a file)."""
    path = os.path.join(state_dir, DLQ_REQUEST)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(f"{action} {nonce}\n")
    os.replace(tmp, path)


def dlq_cancel(state_dir: str) -> bool:
    """Withdraw an unclaimed request; False when the daemon has claimed it already."""
    try:
        os.unlink(os.path.join(state_dir, DLQ_REQUEST))
        return True
    except FileNotFoundError:
        return False


def dlq_claim(state_dir: str) -> tuple[str, str, str] | None:
    """The daemon's side: (action, nonce, claimed path) of a pending request, or None."""
    path = os.path.join(state_dir, DLQ_REQUEST)
    claimed = path + ".claimed"
    if not os.path.exists(claimed):
        try:
            os.rename(path, claimed)
        except FileNotFoundError:
            return None
    try:
        with open(claimed) as f:
            action, _, nonce = f.read().strip().partition(" ")
    except OSError:
        return None
    if action not in ("replay", "purge"):
        os.unlink(claimed)
        return None
    return action, nonce, claimed


def dlq_answer(state_dir: str, claimed: str, nonce: str, action: str, count: int) -> None:
    path = os.path.join(state_dir, DLQ_ANSWER)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(f"{nonce} {action} {count}\n")
    os.replace(tmp, path)
    try:
        os.unlink(claimed)
    except FileNotFoundError:
        pass


def dlq_read_answer(state_dir: str, nonce: str) -> int | None:
    """The count the daemon answered for this request, or None while there is no answer yet."""
    try:
        with open(os.path.join(state_dir, DLQ_ANSWER)) as f:
            got, _action, count = f.read().split()
    except (OSError, ValueError):
        return None
    return int(count) if got == nonce else None


class DeadLetterControl:
    """Answers `shipper dlq replay|purge` while the daemon runs; replayed batches go to `requeue`."""

    def __init__(self, state_dir: str, spool: AsyncSpool, disk: DiskWait, events: Events, clock: Clock,
                 make_bodies: Callable[[list[dict[str, Any]]], list[tuple[bytes, int]]], gzip: bool,
                 requeue: Callable[[list[tuple[BatchMeta, bytes]]], None]) -> None:
        self.state_dir = state_dir
        self.spool = spool
        self.disk = disk
        self.events = events
        self.clock = clock
        self.make_bodies = make_bodies
        self.gzip = gzip
        self.requeue = requeue

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await self.answer_once()
            await self.clock.wait(stop, CHECK_EVERY_S)

    async def answer_once(self) -> bool:
        """Claim and answer one pending request; False when there was none."""
        request = await asyncio.to_thread(dlq_claim, self.state_dir)
        if request is None:
            return False
        action, nonce, claimed = request
        count = 0
        if action == "replay":
            batches = await self.disk.run(lambda: self.spool.replay_dead_letters(self.make_bodies, self.gzip))
            count = sum(m.events for m, _ in batches)
            self.requeue(batches)
        elif action == "purge":
            count = await self.disk.run(self.spool.purge_dead_letters)
        self.events.info("dead letters " + ("re-queued" if action == "replay" else "purged"), count=count)
        await asyncio.to_thread(dlq_answer, self.state_dir, claimed, nonce, action, count)
        return True
