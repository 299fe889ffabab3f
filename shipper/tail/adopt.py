"""The decision taken when a file is opened: what is it, and how is it read? Pure: from what the open
saw (off the loop, tail/look.py) and what the catalog knows, a `Decision` that the file source acts
on (read as the incarnation it names, park, or close and look again)."""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Literal

from shipper.model import Checkpoint
from shipper.tail.catalog import Catalog
from shipper.tail.fileset import Candidate, Key, Role

Kind = Literal[
    "look_again",   # the name names another file now (rotated names shift): close, rescan soon
    "drop",         # what it was to continue is finished, replaced or read elsewhere: close
    "continue",     # the rest of a known incarnation, where it lives now (renamed, a copy, a .gz)
    "resume",       # a known incarnation at a glob's path: read on from its offset
    "read_copy",    # a rotated copy of an incarnation we lost track of: read its rest from here
    "park",         # read to its end, or a copy of what we read: closed, seen again when it changes
    "new",          # a new incarnation
]


@dataclass(frozen=True, slots=True)
class Decision:
    kind: Kind
    cp: Checkpoint | None = None
    role: Role = "live"
    renamed: bool = False           # read as a renamed file (no glob shows it)
    reason: str = ""                # why it is parked
    reopened: bool = False          # resume: it was parked (a reopen, not an open)
    look_around: bool = False       # a new incarnation at a known path: look for what was rotated away unseen
    orphans_dirty: bool = False     # its inode held another incarnation: find where that one went
    look_again_later: bool = False  # a successor not taken now: the next rescan looks again


def decide(cand: Candidate, key: Key, size: int, head: bytes, compressed: bool, being_copied: bool, *,
           catalog: Catalog, open_keys: Collection[Key], reading: Callable[[str], bool],
           has_input: Callable[[str], bool], was_parked: bool) -> Decision:
    """What the opened file `cand` (now (dev, inode) `key`, `size` bytes, first bytes `head`) is."""
    if key in open_keys or key != cand.key:
        return Decision("look_again", look_again_later=True)
    if cand.cp is not None:
        cp = cand.cp
        if cp.finished or catalog.get(cp.incarnation) is not cp or reading(cp.incarnation):
            return Decision("drop")
        if cand.why == "renamed":
            return Decision("continue", cp, renamed=True)
        return Decision("continue", cp, role="copy")
    if cand.why == "glob":
        found = catalog.lookup(key, head, None if compressed else size)
        if found is not None:
            look_around = found.fp_len == 0       # an empty file's inode proves little: look around
            if found.finished and (compressed or size <= found.offset):
                return Decision("park", found, reason="finished", look_around=look_around)
            return Decision("resume", found, role="copy" if compressed else "live", reopened=was_parked,
                            look_around=look_around)
        orphans_dirty = catalog.at_key(key)
        copy_of = catalog.copy_of(cand.path, head, key)
        if copy_of is not None:
            if copy_of.finished or reading(copy_of.incarnation) or not has_input(copy_of.path):
                # a rotated copy of what we read (or are reading): shipping it would ship twice
                return Decision("park", copy_of, reason="rotated copy", orphans_dirty=orphans_dirty)
            return Decision("read_copy", copy_of, role="copy", orphans_dirty=orphans_dirty)
    else:
        orphans_dirty = False
    if being_copied:
        # judged again when it changes: shipping it now would ship a copy under a new identity
        if cand.why == "successor":
            return Decision("drop", look_again_later=True)   # no glob shows it: no park would be seen again
        return Decision("park", reason="copy being written", orphans_dirty=orphans_dirty)
    return Decision("new", role="copy" if compressed else "live",
                    renamed=cand.why == "successor" and not compressed,
                    look_around=cand.why == "glob", orphans_dirty=orphans_dirty)
