"""Exceptions shared by every layer. Retry code asks `err.retryable`, never exception names.

Only the stdlib is imported here; `commands/` turns these into exit codes.
"""

from __future__ import annotations


class ShipperError(Exception):
    """Base of every error shipper raises on purpose."""

    retryable: bool = False


class ConfigError(ShipperError):
    """An invalid configuration: names the key, and the file and line where known. Exit code 2."""

    def __init__(self, key: str, message: str, file: str | None = None, line: int | None = None) -> None:
        self.key = key
        self.message = message
        self.file = file
        self.line = line
        super().__init__(str(self))

    def __str__(self) -> str:
        where = ""
        if self.file:
            where = f" ({self.file}" + (f", line {self.line}" if self.line else "") + ")"
        return f"config error: {self.key}: {self.message}{where}"


class TransportError(ShipperError):
    """The destination could not be reached or answered with a failure status for the whole request."""

    def __init__(self, message: str, *, status: int | None = None, retryable: bool = True,
                 retry_after_s: float | None = None, host: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.retryable = retryable
        self.retry_after_s = retry_after_s
        self.host = host


class SpoolFullError(ShipperError):
    """The disk under state_dir is full: reading pauses and the commit is retried."""

    retryable = True


class SpoolCorruptError(ShipperError):
    """A stored batch does not decode (its checksum or header is wrong): names the file and the batch."""

    def __init__(self, path: str, seq: int, what: str) -> None:
        self.path = path
        self.seq = seq
        self.what = what
        super().__init__(f"{path}: batch {seq}: {what}")
