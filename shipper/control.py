"""Dead-letter requests to a running daemon: the file protocol between `shipper dlq` (which leaves a
request in state_dir) and the daemon (which claims it, acts through its own spool and answers).
Owns only the files; the daemon's spool thread does the work."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from typing import Any, Literal

from shipper import statedir
from shipper.clock import Clock
from shipper.events import Events
from shipper.model import BatchMeta
from shipper.spool.aio import AsyncSpool
from shipper.spool.writer import DiskWait

CHECK_EVERY_S = 2.0           # how often the daemon looks for a request (the task `DeadLetterControl.run`)

DlqAction = Literal["replay", "purge"]

DLQ_REQUEST = "dlq.request"
DLQ_ANSWER = "dlq.answer"
DLQ_ACTIONS: tuple[DlqAction, ...] = ("replay", "purge")


REQUEST_MAX_BYTES = 4096      # a request or an answer is one short line


def _write_atomically(path: str, text: str) -> None:
    """The reader never sees half a file: written beside it, then renamed over it."""
    statedir.write_atomically(path, text.encode())


def _read(path: str) -> str:
    got = statedir.read_file(path, REQUEST_MAX_BYTES)
    if got is None:
        raise FileNotFoundError(path)
    return got.decode("utf-8", "replace")


# `shipper dlq replay|purge` must not write the spool beside the daemon (its in-memory queue would
# not know the new batches), so it leaves a request file; the daemon claims it by renaming it, acts
# through its own spool and writes the answer. A claimed request that a crash interrupted is acted
# on at the next start (replay and purge are idempotent). File names and contents are the ones
# earlier versions used, so a command and a daemon of different versions still understand each
# other.
def dlq_request(state_dir: str, action: DlqAction, nonce: str) -> None:
    """Leave a request for the daemon."""
    _write_atomically(os.path.join(state_dir, DLQ_REQUEST), f"{action} {nonce}\n")


def dlq_cancel(state_dir: str) -> bool:
    """Withdraw an unclaimed request; False when the daemon has claimed it already."""
    try:
        os.unlink(os.path.join(state_dir, DLQ_REQUEST))
        return True
    except FileNotFoundError:
        return False


def dlq_pending(state_dir: str) -> bool:
    """Whether a request (or one claimed before a crash) waits: two stats, no reads."""
    path = os.path.join(state_dir, DLQ_REQUEST)
    return os.path.exists(path) or os.path.exists(path + ".claimed")


def dlq_claim(state_dir: str) -> tuple[DlqAction, str, str] | None:
    """The daemon's side: (action, nonce, claimed path) of a pending request, or None. A request
    claimed before a crash is returned again; one with an unknown action is dropped."""
    path = os.path.join(state_dir, DLQ_REQUEST)
    claimed = path + ".claimed"
    if not os.path.exists(claimed):
        try:
            os.rename(path, claimed)
        except FileNotFoundError:
            return None
    try:
        action, _, nonce = _read(claimed).strip().partition(" ")
    except (OSError, statedir.UnsafeStateDir):
        return None
    if action == "replay":
        return "replay", nonce, claimed
    if action == "purge":
        return "purge", nonce, claimed
    os.unlink(claimed)
    return None


def dlq_answer(state_dir: str, claimed: str, nonce: str, action: DlqAction, count: int) -> None:
    """The daemon's answer (events re-queued or purged), then the claimed request is removed."""
    _write_atomically(os.path.join(state_dir, DLQ_ANSWER), f"{nonce} {action} {count}\n")
    try:
        os.unlink(claimed)
    except FileNotFoundError:
        pass


def dlq_read_answer(state_dir: str, nonce: str) -> int | None:
    """The count the daemon answered for this request, or None while there is no answer yet."""
    try:
        got, _action, count = _read(os.path.join(state_dir, DLQ_ANSWER)).split()
    except (OSError, ValueError, statedir.UnsafeStateDir):
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
            await self.clock.wait(stop, CHECK_EVERY_S, coalesce=True)

    async def answer_once(self) -> bool:
        """Claim and answer one pending request; False when there was none."""
        if not dlq_pending(self.state_dir):
            return False      # two stats on the loop: an idle daemon hands no work to a thread each second
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
