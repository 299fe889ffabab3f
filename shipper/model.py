"""Values that flow through the pipeline. Imports no other shipper module.

Hot-path values are plain tuples (a million lines a second cannot afford an object each):
a `Line` is `(start, end, data, flags)`: byte offsets of the line in its file (end is just past
the newline), the line's bytes without the newline, and a bitmask of `FLAG_*`.
An event (one line, or a multiline group) has the same shape; its offset is its first line's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

Line = tuple[int, int, bytes, int]

FLAG_TRUNCATED = 1          # the line was longer than max_line_bytes and was cut
FLAG_MULTILINE_CAPPED = 2   # a multiline event reached max_lines
FLAG_CONTAINER_UNPARSED = 4  # format docker/cri: the line is no record of that format (shipped as a plain line)


@dataclass(slots=True)
class Checkpoint:
    """What the spool remembers of a file incarnation: the offset queued up to."""

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

    def to_dict(self) -> dict[str, Any]:
        return {"incarnation": self.incarnation, "path": self.path, "dev": self.dev, "inode": self.inode,
                "fp_len": self.fp_len, "fp": self.fp, "offset": self.offset, "size": self.size,
                "updated": self.updated, "finished": self.finished}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Checkpoint":
        return cls(d["incarnation"], d["path"], d["dev"], d["inode"], d["fp_len"], d["fp"], d["offset"],
                   d.get("size", 0), d.get("updated", 0.0), d.get("finished", False))


@dataclass(frozen=True, slots=True)
class DeadLetter:
    index: str
    reason: str
    status: int
    document: bytes           # the document's JSON source
    at: float                 # wall time
    doc_id: str = ""
