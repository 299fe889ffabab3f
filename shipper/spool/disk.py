"""How the spool's keys and values meet SQLite: diskcache's `Disk`, narrowed to data (SPEC, Trust
boundaries): bytes and int values under str or int keys, a pickle handed back unread, and no file a
row names ever opened or removed. Used through diskcache's public `disk=` argument (database.py)."""

from __future__ import annotations

import sqlite3
from typing import Any

import diskcache
from diskcache.core import MODE_PICKLE, MODE_RAW, UNKNOWN


class Pickled:
    """A value an older version let diskcache pickle: its bytes, never unpickled."""

    __slots__ = ("data",)

    def __init__(self, data: bytes) -> None:
        self.data = data

    def __repr__(self) -> str:
        return f"Pickled({len(self.data)} bytes)"


class DataDisk(diskcache.Disk):  # type: ignore[misc]   # diskcache has no type hints
    """diskcache's serializer for the spool: bytes and int values, str and int keys, no pickles.

    diskcache's own `Disk` pickles any key or value that is not bytes, str, int or float,
    unpickles whatever a row's `mode` column says is a pickle, and reads (or deletes) the file a
    row's `filename` column names. The state dir is data whoever wrote it, so this one stores
    only bytes and int values under str or int keys, hands a pickled value back unread as
    `Pickled` (rows.py reads the known old shapes with legacy.read_pickle), refuses a key that
    is not stored raw, and never opens or removes a file a row names: shipper's rows are never
    kept in files.
    """

    def put(self, key: Any) -> tuple[Any, bool]:
        if type(key) not in (str, int):
            raise TypeError(f"a spool key is a str or an int, not {type(key).__name__}")
        return super().put(key)  # type: ignore[no-any-return]

    def get(self, key: Any, raw: bool) -> Any:
        if not raw:
            raise ValueError("a key stored as a pickle (shipper never writes one)")
        return bytes(key) if isinstance(key, bytes) else key

    def store(self, value: Any, read: bool, key: Any = UNKNOWN) -> tuple[int, int, None, Any]:
        if read or type(value) not in (bytes, int):
            raise TypeError(f"a spool value is bytes or an int, not {type(value).__name__}")
        if isinstance(value, bytes):
            if len(value) >= self.min_file_size:
                raise ValueError(f"a spool value of {len(value)} bytes: over the row limit")
            return 0, MODE_RAW, None, sqlite3.Binary(value)
        return 0, MODE_RAW, None, value

    def fetch(self, mode: int, filename: Any, value: Any, read: bool) -> Any:
        if filename is not None:
            raise ValueError("a value kept in a file the row names (shipper never writes one)")
        if mode == MODE_RAW:
            return bytes(value) if isinstance(value, bytes) else value
        if mode == MODE_PICKLE and isinstance(value, bytes):
            return Pickled(bytes(value))
        raise ValueError(f"a value stored in mode {mode!r} (not written by shipper)")

    def remove(self, file_path: Any) -> None:
        """Rows name no files of shipper's: a name found in one is not acted on."""
        return None
