"""The seam every input stands behind: the reader loop drives sources only through `Source`, and a
source reads into the writer's draft (`Drafts`): pairs, the ranges they cover and the checkpoints
they advance, so a position is committed only with its events. Sources never commit, send or sleep."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, replace
from typing import Protocol

from shipper.config import InputConfig
from shipper.events import Events
from shipper.model import Checkpoint, Draft, FileStatus, JournalStatus
from shipper.parse.document import DocBuilder
from shipper.sources.journald.cursor import journal_key


class CutMaker(Protocol):
    """What holds a file's lines (tail/fileset.Holder), as far as its cuts go."""

    def take_cuts(self) -> list[int]: ...


class Drafts(Protocol):
    """The draft writer, as a source sees it."""

    @property
    def draft(self) -> Draft: ...
    def stage(self, cp: Checkpoint) -> None: ...
    def must_spool(self, incarnation: str) -> None:
        """The file of this incarnation is being deleted or truncated: a restart could not read its
        lines again, so those in flight go to the queue now, and so do those read of it from now on."""
        ...

    def must_store(self, cp: Checkpoint) -> None:
        """A new incarnation, at its start: the _ids of its events are built from it, so none goes
        out before it is in the state dir. A restart that did not find it would name the same lines
        again under a new incarnation: other _ids, every line twice."""
        ...

    async def forget(self, pick: Callable[[set[str]], list[str]]) -> list[str]:
        """Forget checkpoints between two drafts' writes: `pick` gets the incarnations the current
        draft moves (never forgotten) and returns those to delete; returns the ones deleted."""
        ...


@dataclass(frozen=True, slots=True)
class Room:
    """How much the draft may still take in this read round."""

    max_events: int
    max_bytes: int
    full_events: int      # with a backlog, a draft of this many events is full enough to go


@dataclass(frozen=True, slots=True)
class Progress:
    read: bool            # something was read (or a source is not at its end)
    backlog: bool         # a source stopped with more to read, or the draft is full


class Source(Protocol):
    @property
    def exhausted(self) -> bool:
        """Nothing more will come (stdin at EOF, all read); files never are."""
        ...

    @property
    def watching(self) -> bool:
        """A watcher wakes the loop for whatever there is to read: when every source says so, a
        quiet fallback poll may look less often."""
        ...

    @property
    def read_total(self) -> int:
        """Lines (entries) read since start."""
        ...

    async def start(self, wake: asyncio.Event) -> None:
        """Start watching (wake.set() when there may be something to read)."""
        ...

    async def tick(self, now: float) -> None:
        """Housekeeping between read rounds: rescans on schedule, opening, cleaning (monotonic now)."""
        ...

    def read_round(self, room: Room, now_wall: float, now_mono: float) -> Progress: ...

    def flush_due(self, now_mono: float) -> None:
        """Events held past their timeout (multiline) go into the draft."""
        ...

    async def check(self, now_mono: float) -> None:
        """Rotation, truncation, deletion and idleness of what is open."""
        ...

    def next_deadline(self) -> float | None:
        """The monotonic time something held must go, if any."""
        ...

    def pause_watch(self) -> None: ...
    def resume_watch(self) -> None: ...
    def drain_watch(self) -> None:
        """While paused: take what the watch queued meanwhile, staying paused."""
        ...

    async def stop(self) -> None:
        """Stopping: take the last complete lines into the draft and stop watching."""
        ...

    def close(self) -> None: ...

    def status(self, shipped: Mapping[str, int], writing: list[Draft]) -> list[FileStatus]:
        """Rows for `shipper status`: `shipped` maps incarnation -> lowest unacknowledged offset."""
        ...

    def bytes_at_risk(self) -> int: ...

    def steady_key(self) -> Hashable | None:
        """What moves whenever a row of `status` may change, while the source is steady, so the
        status tick may keep the last rows while it stays the same; None: make them afresh."""
        ...

    def journal_status(self, shipped: Mapping[str, int], writing: list[Draft]) -> JournalStatus | None:
        """A journald input's row of `shipper status` (its `journald` list); None for the others."""
        ...


def lowest_unshipped(inc: str, queued: int, shipped: Mapping[str, int], drafts: list[Draft]) -> int:
    """The offset below which everything of `inc` is acknowledged: the lowest start of a range in
    the queue or in a draft not yet queued, else what is queued."""
    out = shipped.get(inc, queued)
    for d in drafts:
        cov = d.covers.get(inc)
        if cov is not None and cov[0] < out:
            out = cov[0]
    return out


def input_label(inp: InputConfig) -> str:
    """The `input` label of an input's metrics (`shipper_events_dropped_total`) and its name in
    `shipper status`: a journald input's journal key (as its `shipper_journal_*` series have it),
    else its globs."""
    if inp.journald is not None:
        return journal_key(inp.journald.directory, inp.journald.units)
    return ",".join(inp.paths)


class DropCounter:
    """Tells the events what an input's builder dropped (`DocBuilder.take_dropped`), by reason;
    from the start, each reason the input can drop for shows 0."""

    def __init__(self, builder: DocBuilder, label: str, events: Events) -> None:
        self.builder = builder
        self.label = label
        self.events = events
        for reason in builder.drop_reasons:
            events.events_dropped(label, reason, 0)

    def report(self) -> None:
        if self.builder.dropped:
            for reason, n in self.builder.take_dropped().items():
                self.events.events_dropped(self.label, reason, n)


def record_cuts(holder: CutMaker, cp: Checkpoint, writer: Drafts) -> None:
    """Events the holder completed by time (parse/multiline.py): their end offsets join the live
    checkpoint's cuts, stored before any draft holding those events goes out from memory
    (`must_store`: a record at offset 0, which moves no stored offset, spool/carried.merge_cuts).
    A re-read after a kill -9 cuts where this read did: the same `_id`s hold the same lines, and a
    continuation written after the timeout stays an event of its own."""
    made = holder.take_cuts()
    if made:
        cp.cuts = tuple(sorted({*cp.cuts, *made}))
        writer.must_store(replace(cp, offset=0))
