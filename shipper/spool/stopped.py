"""What a stopped daemon's spool holds, for `shipper status`: read without writing, through the
store, or as an immutable file when opening would need a write the full disk refuses."""

from __future__ import annotations

import sqlite3

from shipper.model import Checkpoint
from shipper.spool.contents import SpoolContents
from shipper.spool.lost import newest_checkpoints
from shipper.spool.salvage import inspect
from shipper.spool.store import Spool


def read_stopped(state_dir: str) -> SpoolContents:
    """What a stopped daemon's spool holds, for `shipper status`: through Spool, or, when opening
    it cannot write (diskcache writes its settings at open: a full disk), read as an immutable file."""
    try:
        spool = Spool(state_dir, read_only=True)
    except sqlite3.OperationalError:
        ins = inspect(state_dir, immutable=True)
        cps = newest_checkpoints(ins.checkpoints.values(), (row for _v, row in ins.batches.values()))
        return SpoolContents(tuple(row.meta for _s, (_v, row) in sorted(ins.batches.items())),
                             tuple(Checkpoint.from_dict(d) for d in cps.values()), len(ins.dead_letters))
    try:
        return spool.contents()
    finally:
        spool.close()


