"""The spool: the durable queue of batches, the checkpoints they advance, and the dead letters.

`AsyncSpool` is the daemon's typed async API (one worker thread); `Spool` the synchronous store
behind it, used directly only while no daemon runs (status, dlq, tests). Layout: `rows.py`.
"""

from __future__ import annotations

from shipper.model import BatchMeta
from shipper.spool.aio import AsyncSpool
from shipper.spool.contents import SpoolContents
from shipper.spool.store import Spool

__all__ = ["AsyncSpool", "BatchMeta", "Spool", "SpoolContents"]
