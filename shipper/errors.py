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
    logged = False      # True: the spool's headroom already logged this episode (issue 19)


class StateDamagedError(ShipperError):
    """The state dir cannot be used as it is (a damaged spool file): exit code 3, which the service
    manager does not restart into. Names the file, says what is wrong and what to do."""

    exit_code = 3

    def __init__(self, path: str, what: str) -> None:
        self.path = path
        self.what = what
        super().__init__(path, what)

    def __str__(self) -> str:
        return (f"state dir damaged: {self.path}: {self.what}. The daemon does not start on it; "
                "run `shipper state repair` (with the same -c or --state-dir) to salvage what can be read "
                "into a fresh spool: the damaged file is kept beside it and what was lost is listed")


class SpoolCorruptError(StateDamagedError):
    """A stored record does not decode (its checksum, header or pickle is wrong), or SQLite says the
    file is malformed: names the file and, where known, the batch (`seq`)."""

    def __init__(self, path: str, seq: int | None, what: str) -> None:
        self.seq = seq
        super().__init__(path, what if seq is None else f"batch {seq}: {what}")
        self.args = (path, seq, what)
