"""How the spool's values are laid out in diskcache: keys, the batch row, the other rows, and the older
layouts read as data. Pure; every value is bytes (JSON, or a JSON head and raw bytes) or an int,
nothing is pickled (SPEC, Trust boundaries). The layout is written out above the key constants."""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from typing import Any, Literal

import orjson

from shipper.codec import crc32
from shipper.model import BatchMeta
from shipper.spool.disk import Pickled
from shipper.spool.legacy import NotData, read_pickle

# The layout (diskcache keys -> values):
#     <seq>            int: one batch, ONE row: HEADER (version 2) + metadata (JSON) + the stored body.
#                      The last batch of a commit also carries that commit's checkpoints, so the
#                      commit is one set() (see store.Spool for why, and when they move).
#     "c:<inc>"        a file incarnation's checkpoint: JSON of Checkpoint.to_dict() + "v"
#     "d:<n:016d>"     a dead letter: JSON head (index, reason, status, at, id), "\n", the document
#     "n:dlq"          int: the number of the last dead letter
#     "q:<seq>"        a batch row that did not decode when it was read to be sent: JSON head (seq,
#                      reason, covers when its header decoded, events, at), "\n", the value as stored;
#                      see store.Spool.read
# Strings are UTF-8 JSON; a path that is not UTF-8 (surrogate escapes of a non-UTF-8 file name)
# is written with \udcXX escapes by the stdlib's encoder, which orjson does not read: `loads`
# falls back to the stdlib for those rows.
#
# Older layouts, read as data (legacy.read_pickle, never unpickled) and never written any more; a
# row leaves, or is written anew in this layout, as it is acked, rewritten or repaired, and a
# two-row batch when a writer opens the spool (loading.upgrade):
#     b19ade4 and earlier ("pickled"): the batch row's metadata a pickle (HEADER version 1); "c:",
#                      "d:" and "q:" rows pickled dicts (the same fields, the document and value as bytes)
#     073664d and earlier ("two-row"): <seq> the bare stored body, its metadata a pickled dict in
#                      "m:<seq>" {"events", "raw_bytes", "stored_bytes", "gzipped", "covers", "at"};
#                      "c:<inc>" without "v" (reads as version 0)
# A checkpoint's version "v" grows with every write: at open, the newest version of each
# incarnation wins, wherever it is stored (its own row or a queued batch).
CHECKPOINT = "c:"
LEGACY_META = "m:"
DEAD_LETTER = "d:"
NEXT_DEAD_LETTER = "n:dlq"
QUARANTINE = "q:"

MAGIC = b"\x00SB"        # a two-row layout's body starts with "{" (NDJSON) or 0x1f 0x8b (gzip), never with NUL
VERSION = 2
PICKLED_VERSION = 1      # b19ade4 and earlier: the metadata pickled
HEADER = struct.Struct("<3sBII")    # magic, version, crc32 of the stored body, metadata length

Layout = Literal["data", "pickled", "two-row"]
LAYOUT_NAMES: dict[Layout, str] = {
    "data": "data rows (this version)",
    "pickled": "rows with pickled metadata (b19ade4 and earlier)",
    "two-row": "batches in two rows (073664d and earlier)",
}


class BadRow(ValueError):
    """A value that does not decode as the row its key says it is."""


# ---------------------------------------------------------------- JSON

def dumps(value: Any) -> bytes:
    try:
        return orjson.dumps(value)
    except TypeError:
        # a str orjson refuses (a surrogate escape: a non-UTF-8 file name): \\udcXX escapes
        return json.dumps(value, separators=(",", ":"), ensure_ascii=True, allow_nan=False).encode()


def loads(data: bytes | memoryview) -> Any:
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        try:
            return json.loads(bytes(data))
        except (ValueError, RecursionError) as e:
            raise BadRow(f"does not decode ({e})") from e


def _pickled(value: Pickled) -> dict[str, Any]:
    try:
        d = read_pickle(value.data)
    except NotData as e:
        raise BadRow(str(e)) from e
    if not isinstance(d, dict):
        raise BadRow("an old row that is not a dict")
    return d


def layout_of(value: Any) -> Layout:
    """Which layout wrote a stored value (a batch row, or any other row)."""
    if isinstance(value, Pickled):
        return "pickled"
    if isinstance(value, bytes) and value[:len(MAGIC)] == MAGIC and len(value) > len(MAGIC) \
            and value[len(MAGIC)] == PICKLED_VERSION:
        return "pickled"
    return "data"


# ---------------------------------------------------------------- batch rows

@dataclass(frozen=True, slots=True)
class BatchRow:
    meta: BatchMeta
    checkpoints: dict[str, dict[str, Any]]      # incarnation -> checkpoint dict with "v"
    body_at: int                                # where the stored body starts in the value
    crc: int


def pack_batch(meta: BatchMeta, checkpoints: dict[str, dict[str, Any]], stored: bytes) -> bytes:
    """One batch row. The crc32 (cheap with ISA-L) lets a damaged body be told from a bad
    answer of the destination without decompressing it."""
    m = dumps({"e": meta.events, "r": meta.raw_bytes, "g": meta.gzipped, "cv": meta.covers,
               "at": meta.at, "cp": checkpoints})
    return b"".join((HEADER.pack(MAGIC, VERSION, crc32(stored), len(m)), m, stored))


def is_batch_row(value: object) -> bool:
    return isinstance(value, bytes) and value[:len(MAGIC)] == MAGIC


def unpack_batch(seq: int, value: bytes) -> BatchRow:
    """The header and metadata of a batch row (the body is not copied). Raises BadRow."""
    try:
        magic, version, crc, n = HEADER.unpack_from(value)
        if magic != MAGIC or version not in (VERSION, PICKLED_VERSION):
            raise BadRow(f"not a batch row (version {version})")
        at = HEADER.size + n
        if at > len(value):
            raise BadRow("the metadata runs past the row")
        view = memoryview(value)[HEADER.size:at]
        m = loads(view) if version == VERSION else _pickled(Pickled(bytes(view)))
        covers = {_str(inc): (int(r[0]), int(r[1])) for inc, r in m["cv"].items()}
        cps = m["cp"]
        if not isinstance(cps, dict):
            raise BadRow("checkpoints that are not an object")
        carried = {_str(inc): checkpoint_dict(d) for inc, d in cps.items()}
        meta = BatchMeta(seq, _int(m["e"]), _int(m["r"]), len(value) - at, bool(m["g"]), covers, float(m["at"]))
        return BatchRow(meta, carried, at, crc)
    except (struct.error, KeyError, TypeError, ValueError, AttributeError, IndexError) as e:
        if isinstance(e, BadRow):
            raise
        raise BadRow(f"header does not decode: {e}") from e


def batch_body(row: BatchRow, value: bytes) -> bytes:
    """The stored body of a batch row, checked against its crc32. Raises BadRow."""
    body = value[row.body_at:]
    if crc32(body) != row.crc:
        raise BadRow("the stored body does not match its checksum")
    return body


def legacy_meta(seq: int, value: Any) -> BatchMeta:
    """An "m:<seq>" row of the two-row layout. Raises BadRow."""
    m = _pickled(value) if isinstance(value, Pickled) else value
    try:
        return BatchMeta(seq, _int(m["events"]), _int(m["raw_bytes"]), _int(m["stored_bytes"]), bool(m["gzipped"]),
                         {_str(k): (int(v[0]), int(v[1])) for k, v in m["covers"].items()}, float(m.get("at", 0.0)))
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as e:
        if isinstance(e, BadRow):
            raise
        raise BadRow(f"metadata does not decode: {e}") from e


# ---------------------------------------------------------------- checkpoints

_CP_FIELDS: dict[str, tuple[type, ...]] = {
    "incarnation": (str,), "path": (str,), "dev": (int,), "inode": (int,), "fp_len": (int,), "fp": (str,),
    "offset": (int,), "size": (int,), "updated": (float, int), "finished": (bool,), "cursor": (str, type(None)),
    "v": (int,), "cuts": (list,),
}
_CP_REQUIRED = ("incarnation", "path", "dev", "inode", "fp_len", "fp", "offset")


def checkpoint_dict(d: Any) -> dict[str, Any]:
    """A stored checkpoint's dict, its fields of the types Checkpoint takes. Raises BadRow."""
    if not isinstance(d, dict):
        raise BadRow(f"a checkpoint that is a {type(d).__name__}")
    for k in _CP_REQUIRED:
        if k not in d:
            raise BadRow(f"a checkpoint without {k!r}")
    for k, v in d.items():
        kinds = _CP_FIELDS.get(k)
        if kinds is not None and not isinstance(v, kinds):
            raise BadRow(f"a checkpoint whose {k!r} is a {type(v).__name__}")
    if any(type(c) is not int or c < 0 for c in d.get("cuts", ())):
        raise BadRow("a checkpoint whose 'cuts' are not all offsets")
    return d


def pack_checkpoint(d: dict[str, Any]) -> bytes:
    return dumps(d)


def unpack_checkpoint(value: Any) -> dict[str, Any]:
    """A "c:" row: the checkpoint dict (with "v" when stored since 073664d). Raises BadRow."""
    if isinstance(value, Pickled):
        return checkpoint_dict(_pickled(value))
    if not isinstance(value, bytes):
        raise BadRow(f"a checkpoint row that is a {type(value).__name__}")
    return checkpoint_dict(loads(value))


# ---------------------------------------------------------------- dead letters and quarantine

def dead_letter_value(index: str, reason: str, status: int, document: bytes, at: float, doc_id: str) -> dict[str, Any]:
    return {"index": index, "reason": reason, "status": status, "document": document, "at": at, "id": doc_id}


def _pack_with_tail(d: dict[str, Any], tail: str) -> bytes:
    """A JSON head of every field but `tail`, "\n", then `tail`'s bytes as they are."""
    head = {k: v for k, v in d.items() if k != tail}
    return b"".join((dumps(head), b"\n", bytes(d[tail])))


def _unpack_with_tail(value: Any, tail: str) -> dict[str, Any]:
    """`_pack_with_tail`'s dict back, or an old row's pickled dict read as data. Raises BadRow."""
    if isinstance(value, Pickled):
        return _pickled(value)
    if not isinstance(value, bytes):
        raise BadRow(f"a {type(value).__name__}, not bytes")
    head, nl, rest = value.partition(b"\n")
    if not nl:
        raise BadRow("no head")
    d = loads(head)
    if not isinstance(d, dict):
        raise BadRow("the head is not an object")
    d[tail] = rest
    return d


def pack_dead_letter(d: dict[str, Any]) -> bytes:
    return _pack_with_tail(d, "document")


def unpack_dead_letter(value: Any) -> dict[str, Any]:
    """A "d:" row as dead_letter_value's dict. Raises BadRow."""
    d = _unpack_with_tail(value, "document")
    for k, kinds in (("index", (str,)), ("reason", (str,)), ("status", (int,)), ("document", (bytes,)),
                     ("at", (float, int))):
        if not isinstance(d.get(k), kinds):
            raise BadRow(f"a dead letter whose {k!r} is a {type(d.get(k)).__name__}")
    d.setdefault("id", "")
    return d


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


def pack_quarantine(q: dict[str, Any]) -> bytes:
    return _pack_with_tail(q, "value")


def unpack_quarantine(value: Any) -> dict[str, Any]:
    """A "q:" row as quarantine_value's dict. Raises BadRow."""
    q = _unpack_with_tail(value, "value")
    try:
        q["seq"] = _int(q["seq"])
        q["covers"] = {_str(inc): (int(r[0]), int(r[1])) for inc, r in dict(q.get("covers") or {}).items()}
    except (KeyError, TypeError, ValueError, IndexError) as e:
        raise BadRow(f"a quarantined row that does not decode: {e}") from e
    return q


# ---------------------------------------------------------------- field checks

def _int(v: Any) -> int:
    if not isinstance(v, int):
        raise BadRow(f"a number that is a {type(v).__name__}")
    return v


def _str(v: Any) -> str:
    if not isinstance(v, str):
        raise BadRow(f"a name that is a {type(v).__name__}")
    return v
