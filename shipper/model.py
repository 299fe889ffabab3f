"""Values that flow through the pipeline: lines, checkpoints, drafts, batches' metadata, send
attempts, status rows. Imports no other shipper module. Hot-path values are plain tuples: a `Line`
is (start, end, data, flags), byte offsets in its file (end past the newline), the bytes, FLAG_* bits."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

Line = tuple[int, int, bytes, int]

# A document builder's C loop bound to one batch (`DocBuilder.split_builder`), called by
# `LineSplitter.feed_built` as split(chunk, carry, offset, max_line_bytes, FLAG_TRUNCATED): it
# splits as LineSplitter.feed does and builds each line's bulk pair at once
# (`_native.split_splice`): (offset, tail_index, lines, first_start, last_end, nbytes, pairs), or
# None when it leaves the chunk to feed (and the caller's build).
SplitBuild = Callable[[Any, bytes, int, int, int], "tuple[int, int, int, int, int, int, int] | None"]

# A joined container record (parse/container_join.py): (start, end, data, flags, stream, time,
# attrs). start/end/data/flags as a Line's: start is the first piece's start, end the last piece's
# end, data the joined text (without its newline or a final \r). stream is "stdout" or "stderr";
# "" for a line that is no container record (format auto: a plain line of the file, parsed as
# usual; docker/cri: a line flagged FLAG_CONTAINER_UNPARSED), then time is "" (no runtime time).
# time: the first piece's runtime time text (RFC 3339, as written); attrs: Docker's, or None.
ContainerEvent = tuple[int, int, bytes, int, str, str, "dict[str, Any] | None"]
# What a holder (the multiline aggregator, the container joiner) lets go of: events (lines or
# multiline groups) and joined container records, in that order.
Held = tuple[list[Line], list[ContainerEvent]]

FLAG_TRUNCATED = 1          # the line was longer than max_line_bytes and was cut
FLAG_MULTILINE_CAPPED = 2   # a multiline event reached max_lines
FLAG_CONTAINER_UNPARSED = 4  # format docker/cri: the line is no record of that format (shipped as a plain line)


@dataclass(slots=True)
class Checkpoint:
    """What the spool remembers of a file incarnation: the offset queued up to.

    Owned by the file source (`sources/file_*.py`): only the source reading an incarnation changes
    its live checkpoint (offset, fingerprint, finished); the catalog indexes it, and drafts, the
    spool and status hold copies (`dataclasses.replace`)."""

    incarnation: str
    path: str
    dev: int
    inode: int
    fp_len: int
    fp: str
    offset: int               # everything before this offset is in the queue (or delivered)
    size: int = 0             # file size when last seen
    updated: float = 0.0      # wall time of the last change
    finished: bool = False    # the file is gone (rotated away/deleted) and read to its end
    # a journald input's position: the cursor of the last entry queued (`offset` is its seqnum;
    # dev, inode, fp_len are 0). Files have none.
    cursor: str | None = None
    # the file's owner when the incarnation was first opened: its rotated copies must be owned by
    # the same user or by root (SPEC, Trust boundaries). None: not known (a journal, an older state)
    uid: int | None = None
    # end offsets above `offset` where a multiline event was completed by time (its timeout, the
    # file's end, a stop), not by its bytes: a re-read from `offset` cuts there too, so every event
    # gets the `_id` and text it was sent with (parse/multiline.py). Ascending; empty for most files
    cuts: tuple[int, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        d = {"incarnation": self.incarnation, "path": self.path, "dev": self.dev, "inode": self.inode,
             "fp_len": self.fp_len, "fp": self.fp, "offset": self.offset, "size": self.size,
             "updated": self.updated, "finished": self.finished}
        if self.cursor is not None:
            d["cursor"] = self.cursor
        if self.uid is not None:
            d["uid"] = self.uid
        if self.cuts:
            d["cuts"] = list(self.cuts)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Checkpoint:
        return cls(d["incarnation"], d["path"], d["dev"], d["inode"], d["fp_len"], d["fp"], d["offset"],
                   d.get("size", 0), d.get("updated", 0.0), d.get("finished", False), d.get("cursor"),
                   d.get("uid") if isinstance(d.get("uid"), int) else None, _cuts(d.get("cuts")))


def _cuts(value: Any) -> tuple[int, ...]:
    """A stored `cuts` list: its integer offsets, ascending (anything else in it names no cut)."""
    if not isinstance(value, list):
        return ()
    return tuple(sorted({c for c in value if isinstance(c, int) and not isinstance(c, bool) and c >= 0}))


@dataclass(frozen=True, slots=True)
class BatchMeta:
    """A batch in the spool: one bulk request, stored (gzip-compressed once, or plain) until acked.

    `covers` maps each file incarnation the batch has lines of to the byte range (start, end)
    they were read from; a file counts as shipped up to an offset only when no queued batch
    covers anything below it. Sizes are the NDJSON body's (`raw_bytes`) and what is stored and
    posted (`stored_bytes`). `at` is the wall time it was queued.
    """

    seq: int
    events: int
    raw_bytes: int
    stored_bytes: int
    gzipped: bool
    covers: dict[str, tuple[int, int]] = field(default_factory=dict)
    at: float = 0.0


@dataclass(frozen=True, slots=True)
class DeadLetter:
    index: str
    reason: str
    status: int
    document: bytes           # the document's JSON source
    at: float                 # wall time
    doc_id: str = ""


@dataclass(slots=True)
class Draft:
    """What the sources read since the last commit: bulk pairs, the ranges they cover and the
    checkpoints they advance. Committed as one spool transaction (grouped there into batches);
    sources append, the draft writer takes it whole. `started` is monotonic time."""

    parts: list[bytes] = field(default_factory=list)
    multi: dict[int, int] = field(default_factory=dict)    # parts[i] holds multi[i] pairs (absent: one)
    events: int = 0
    nbytes: int = 0
    covers: dict[str, list[int]] = field(default_factory=dict)     # incarnation -> [start, end]
    checkpoints: dict[str, Checkpoint] = field(default_factory=dict)
    started: float = 0.0

    def empty(self) -> bool:
        return not self.parts and not self.checkpoints

    def cover(self, incarnation: str, start: int, end: int) -> None:
        """Extend the range this draft covers for an incarnation (it starts where the first take began)."""
        cov = self.covers.get(incarnation)
        if cov is None:
            self.covers[incarnation] = [start, end]
        else:
            cov[1] = end


@dataclass(frozen=True, slots=True)
class FileStatus:
    """One row of `shipper status` (SPEC: path, inode, offset shipped, size, lag)."""

    path: str
    inode: int | None
    incarnation: str
    offset: int               # acknowledged up to here
    queued_offset: int        # read and queued up to here
    size: int
    lag_bytes: int
    state: str

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "inode": self.inode, "incarnation": self.incarnation, "offset": self.offset,
                "queued_offset": self.queued_offset, "size": self.size, "lag_bytes": self.lag_bytes,
                "state": self.state}


@dataclass(frozen=True, slots=True)
class JournalStatus:
    """One journald input in `shipper status` (SPEC: directory, units, cursor, lag_entries).

    `cursor` is the position queued (what a restart resumes from), `shipped_cursor` the one below
    which everything is acknowledged (None: not known in this process); lags are measured from
    the acknowledged position to the journal's newest matching entry (None: not known)."""

    key: str
    directory: str | None
    units: tuple[str, ...]
    cursor: str | None
    shipped_cursor: str | None
    lag_entries: int | None
    lag_seconds: float | None
    entries_read: int
    gaps: int
    entries_lost: int
    reader_restarts: int

    def to_dict(self) -> dict[str, Any]:
        return {"directory": self.directory, "units": list(self.units), "cursor": self.cursor,
                "lag_entries": self.lag_entries, "lag_seconds": self.lag_seconds, "key": self.key,
                "shipped_cursor": self.shipped_cursor, "entries_read": self.entries_read, "gaps": self.gaps,
                "entries_lost": self.entries_lost, "reader_restarts": self.reader_restarts}


@dataclass(frozen=True, slots=True)
class JournalGap:
    """Journal entries lost before they were read (vacuumed, or a cursor journalctl cannot seek
    to). `lost_entries` comes from the sequence-number distance (None: unknown); `seconds` is how
    far the journal's realtime jumped. `reason`: vacuumed | cursor_invalid | seqnum_jump."""

    reason: str
    after: str                       # the last cursor read (or stored) before the gap
    resumed_at: str | None           # the first cursor read after it; None: none yet
    lost_entries: int | None
    seconds: float | None


@dataclass(frozen=True, slots=True)
class PipelineStatus:
    """What the running pipeline shows `monitor.Monitor`, `/status` and `shipper status`."""

    files: tuple[FileStatus, ...]
    queue_events: int
    queue_bytes: int
    dead_letters: int
    output_up: bool
    last_error: str | None
    last_success: float       # monotonic time of the last request that worked
    hosts: tuple[str, ...]
    bytes_at_risk: int
    read_total: int
    shipped_total: int
    paused: bool
    in_flight: int
    drained: bool             # nothing read, queued or in flight is waiting
    journald: tuple[JournalStatus, ...] = ()
    memory_events: int = 0    # sent from memory, not yet acknowledged nor in the queue (queue.spool: when_behind)
    memory_bytes: int = 0
    spool: str = "when_behind"     # queue.spool


@dataclass(frozen=True, slots=True)
class Attempt:
    """One send attempt: a bulk request's body as sent (the stored bytes, gzip or raw), whether gzipped, its documents."""

    body: bytes
    gzipped: bool
    count: int


def is_journal_checkpoint(cp: Checkpoint) -> bool:
    """A journald input's checkpoint (its incarnation is the input's journal key), not a file's."""
    return cp.cursor is not None or cp.incarnation.startswith("journald:")
