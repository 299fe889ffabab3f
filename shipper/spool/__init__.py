"""The durable queue and checkpoints (diskcache on SQLite), behind one typed async API, and its record writer.

`store.py` is the synchronous store (one thread); `AsyncSpool` runs it on its own thread for the
daemon; `writer.py` writes drafts as batches, in order, with the checkpoints they advance.
"""

from __future__ import annotations

from shipper.spool.store import AsyncSpool, Spool, SpoolContents

__all__ = ["AsyncSpool", "Spool", "SpoolContents"]
