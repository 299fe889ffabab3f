"""The in-flight window (pure): drafts handed over and not yet safe, and the checkpoints waiting behind them.
An incarnation's checkpoint is written only once every draft before it holding its events is acknowledged
or goes to the spool in the same or an earlier transaction (SPEC, Delivery). No I/O and no clock: the
draft writer and the keeper (spool/keeper.py) pass times in and perform the writes it plans.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Literal

from shipper.model import Checkpoint

Route = Literal["spool", "memory", "wait"]
SpoolMode = Literal["when_behind", "always"]


@dataclass(slots=True)
class _Draft:
    id: int
    at: float                   # monotonic time it was handed over
    incs: tuple[str, ...]       # the lanes it stands in
    memory: bool                # its batches went out from memory only (not in the spool)
    batches: int | None = None  # memory: batches not yet acknowledged (None: bodies not made yet)
    nbytes: int = 0
    events: int = 0
    settled: bool = False       # acknowledged, or in (or on its way to) the spool
    lanes_left: int = 0


@dataclass(frozen=True, slots=True)
class InMemory:
    """What is out from memory only: acknowledged by nobody yet, in no spool (`shipper status`)."""

    drafts: int = 0
    events: int = 0
    nbytes: int = 0


@dataclass(slots=True)
class Window:
    """Drafts in the order they were handed over; per incarnation a lane of (draft, checkpoint).

    A transaction that writes checkpoints (a draft's commit, a spill, a checkpoint flush) is planned
    with `plan()` as it is handed to the spool thread, and transactions run there in the order they
    were handed: each runs only if the one before it was written (`AsyncSpool.commit_in_order`). So a
    plan may count every draft already settled as safe, including drafts whose own transaction is
    only queued; a crash loses the queued transactions together with this window."""

    _next: int = 1
    _drafts: dict[int, _Draft] = field(default_factory=dict)     # every draft still in a lane or in memory
    _lanes: dict[str, deque[tuple[int, Checkpoint | None]]] = field(default_factory=dict)
    _ready: set[str] = field(default_factory=set)               # lanes whose front draft is settled
    _memory: dict[int, _Draft] = field(default_factory=dict)     # unsettled memory drafts, oldest first
    memory_events: int = 0
    memory_bytes: int = 0

    def add(self, covers: Iterable[str], checkpoints: Mapping[str, Checkpoint], *, memory: bool, now: float,
            nbytes: int = 0, events: int = 0) -> int:
        """A draft handed over: `covers` the incarnations it holds events of, `checkpoints` the moves it
        makes. memory=False: it goes to the spool with the next transaction handed over (settled now).
        Returns its id."""
        did = self._next
        self._next += 1
        incs = tuple(dict.fromkeys([*covers, *checkpoints]))
        d = _Draft(did, now, incs, memory, nbytes=nbytes, events=events, lanes_left=len(incs))
        self._drafts[did] = d
        for inc in incs:
            lane = self._lanes.get(inc)
            if lane is None:
                lane = self._lanes[inc] = deque()
            lane.append((did, checkpoints.get(inc)))
        if memory:
            self._memory[did] = d
            self.memory_events += events
            self.memory_bytes += nbytes
        else:
            self._settle(d)
        return did

    def made(self, did: int, batches: int, nbytes: int) -> None:
        """A memory draft's bodies are made: `batches` requests of `nbytes` in all (as sent)."""
        d = self._memory.get(did)
        if d is None:
            return
        self.memory_bytes += nbytes - d.nbytes
        d.nbytes = nbytes
        d.batches = batches
        if batches <= 0:
            self._settle(d)

    def acked(self, did: int) -> None:
        """One of a memory draft's batches is acknowledged (or dead-lettered and stored)."""
        d = self._memory.get(did)
        if d is None or d.batches is None:
            return
        d.batches -= 1
        if d.batches <= 0:
            self._settle(d)

    def spill(self, dids: Iterable[int] | None = None) -> list[int]:
        """These memory drafts (default: every one whose bodies are made) go to the spool with the
        next transaction handed over: settled now. Returns the ids settled, oldest first."""
        picked = [i for i, d in self._memory.items() if d.batches is not None] if dids is None \
            else [i for i in dids if i in self._memory]
        for did in picked:
            self._settle(self._memory[did])
        return picked

    def plan(self) -> dict[str, Checkpoint]:
        """The checkpoints the transaction handed over next may write: per incarnation the newest one
        of its lane's settled front. They leave the window (written with that transaction, or lost
        with it and with everything after it)."""
        out: dict[str, Checkpoint] = {}
        for inc in self._ready:
            lane = self._lanes[inc]
            while lane:
                did, cp = lane[0]
                d = self._drafts[did]
                if not d.settled:
                    break
                lane.popleft()
                if cp is not None:
                    out[inc] = cp
                d.lanes_left -= 1
                if d.lanes_left <= 0 and did not in self._memory:
                    del self._drafts[did]
            if not lane:
                del self._lanes[inc]
        self._ready.clear()
        return out

    def _settle(self, d: _Draft) -> None:
        if d.settled:
            return
        d.settled = True
        if self._memory.pop(d.id, None) is not None:
            self.memory_events -= d.events
            self.memory_bytes -= d.nbytes
        for inc in d.incs:
            if self._lanes[inc][0][0] == d.id:
                self._ready.add(inc)
        if not d.incs:
            self._drafts.pop(d.id, None)

    # ---------------------------------------------------------------- questions

    @property
    def has_plan(self) -> bool:
        """Some checkpoint is waiting for a transaction."""
        return bool(self._ready)

    @property
    def in_memory(self) -> InMemory:
        return InMemory(len(self._memory), self.memory_events, self.memory_bytes)

    def in_memory_ids(self) -> list[int]:
        return list(self._memory)

    def is_memory(self, did: int) -> bool:
        """Still out from memory only (not acknowledged, not spilled)."""
        return did in self._memory

    def oldest_at(self) -> float | None:
        """When the oldest draft out from memory only (its bodies made) was handed over (None: none is)."""
        for d in self._memory.values():
            if d.batches is not None:
                return d.at
        return None

    def holds_memory(self, inc: str) -> bool:
        """Events of this incarnation are out from memory only."""
        return any(inc in d.incs for d in self._memory.values())

    def holds(self, inc: str) -> bool:
        """The incarnation has a draft in flight or a checkpoint not yet written."""
        return inc in self._lanes


def route(mode: SpoolMode, *, durable: bool, spooled: bool, memory_bytes: int, draft_bytes: int,
          memory_max_bytes: int) -> Route:
    """Where a draft goes: to the spool (`always`; stdin or a file going away, `durable`; anything
    already spooled, so that it stays in order behind it), out from memory, or it waits for room
    (memory holds `memory_max_bytes`, always at least one draft; the keeper spills when the oldest
    waited `spill_after`, and then the spool takes it)."""
    if mode == "always" or durable or spooled:
        return "spool"
    if memory_bytes and memory_bytes + draft_bytes > memory_max_bytes:
        return "wait"
    return "memory"


def spill_due(oldest_at: float | None, now: float, spill_after_s: float) -> bool:
    """The oldest draft out from memory only has waited `spill_after` for its acknowledgement."""
    return oldest_at is not None and now - oldest_at >= spill_after_s
