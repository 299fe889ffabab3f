"""How the spool's values are laid out in diskcache: keys, the batch row, checkpoint rows. Pure.

The layout (diskcache keys -> values, all through diskcache's public get/set/delete):
    <seq>            int: one batch, ONE row: HEADER + metadata (pickle) + the stored body.
                     The last batch of a commit also carries that commit's checkpoints, so the
                     commit is one set() (see store.Spool for why, and when they move).
    "c:<inc>"        a file incarnation's checkpoint (Checkpoint.to_dict() + "v")
    "d:<n:016d>"     a dead letter (dict), numbered by "n:dlq"
    "q:<seq>"        a batch row that did not decode when it was read to be sent (dict: seq, reason,
                     covers when its header decoded, the value as stored); see store.Spool.read
Written by 073664d and earlier (read, acked and replaced, never written any more):
    <seq>            the bare stored body, its metadata in
    "m:<seq>"        {"events", "raw_bytes", "stored_bytes", "gzipped", "covers", "at"}
    "c:<inc>"        without "v" (reads as version 0)
A checkpoint's version "v" grows with every write: at open, the newest version of each
incarnation wins, wherever it is stored (its own row or a queued batch).
"""

from __future__ import annotations

import pickle
import struct
from dataclasses import dataclass
from typing import Any

from shipper.codec import crc32
from shipper.model import BatchMeta

CHECKPOINT = "c:"
LEGACY_META = "m:"
DEAD_LETTER = "d:"
NEXT_DEAD_LETTER = "n:dlq"
QUARANTINE = "q:"

MAGIC = b"\x00SB"        # a legacy body starts with "{" (NDJSON) or 0x1f 0x8b (gzip), never with NUL
VERSION = 1
HEADER = struct.Struct("<3sBII")    # magic, version, crc32 of the stored body, metadata length


class BadRow(ValueError):
    """A value that starts like a batch row but does not decode."""


@dataclass(frozen=True, slots=True)
class BatchRow:
    meta: BatchMeta
    checkpoints: dict[str, dict[str, Any]]      # incarnation -> checkpoint dict with "v"
    body_at: int                                # where the stored body starts in the value
    crc: int


def pack_batch(meta: BatchMeta, checkpoints: dict[str, dict[str, Any]], stored: bytes) -> bytes:
    """One batch row. The crc32 (ISA-L: ~4 us for 140 KB) lets a damaged body be told from a bad
    answer of the destination without decompressing it."""
    # pickle, as diskcache stores dicts: paths may hold surrogate escapes (non-UTF-8 file names)
    m = pickle.dumps({"e": meta.events, "r": meta.raw_bytes, "g": meta.gzipped, "cv": meta.covers,
                      "at": meta.at, "cp": checkpoints}, pickle.HIGHEST_PROTOCOL)
    return b"".join((HEADER.pack(MAGIC, VERSION, crc32(stored), len(m)), m, stored))


def is_batch_row(value: object) -> bool:
    return isinstance(value, bytes) and value[:len(MAGIC)] == MAGIC


def unpack_batch(seq: int, value: bytes) -> BatchRow:
    """The header and metadata of a batch row (the body is not copied). Raises BadRow."""
    try:
        magic, version, crc, n = HEADER.unpack_from(value)
        if magic != MAGIC or version != VERSION:
            raise BadRow(f"not a batch row (version {version})")
        at = HEADER.size + n
        m = pickle.loads(memoryview(value)[HEADER.size:at])
        covers = {inc: (int(r[0]), int(r[1])) for inc, r in m["cv"].items()}
        meta = BatchMeta(seq, int(m["e"]), int(m["r"]), len(value) - at, bool(m["g"]), covers, float(m["at"]))
        return BatchRow(meta, dict(m["cp"]), at, crc)
    except (struct.error, pickle.UnpicklingError, EOFError, KeyError, TypeError, ValueError, AttributeError,
            IndexError) as e:
        if isinstance(e, BadRow):
            raise
        raise BadRow(f"header does not decode: {e}") from e


def batch_body(row: BatchRow, value: bytes) -> bytes:
    """The stored body of a batch row, checked against its crc32. Raises BadRow."""
    body = value[row.body_at:]
    if crc32(body) != row.crc:
        raise BadRow("the stored body does not match its checksum")
    return body


def legacy_meta(seq: int, m: dict[str, Any]) -> BatchMeta:
    return BatchMeta(seq, m["events"], m["raw_bytes"], m["stored_bytes"], m["gzipped"],
                     {k: (int(v[0]), int(v[1])) for k, v in m["covers"].items()}, m.get("at", 0.0))


def dead_letter_value(index: str, reason: str, status: int, document: bytes, at: float, doc_id: str) -> dict[str, Any]:
    return {"index": index, "reason": reason, "status": status, "document": document, "at": at, "id": doc_id}


def quarantine_value(seq: int, reason: str, value: bytes, at: float) -> dict[str, Any]:
    """A batch row set aside because it does not decode: what is known of it (the covers, from its
    header when that still decodes) and the bytes as stored, for a human to look at."""
    covers: dict[str, tuple[int, int]] = {}
    events = None
    try:
        row = unpack_batch(seq, value)
        covers, events = dict(row.meta.covers), row.meta.events
    except BadRow:
        pass
    return {"seq": seq, "reason": reason, "covers": covers, "events": events, "at": at, "value": bytes(value)}
