"""One harvester per file incarnation: owns the fd, the read position and the rotation state machine.

It reads bounded chunks and returns complete lines (via `LineSplitter`); it never parses, batches
or talks HTTP. Rename rotation: the old fd is read to its end while the path gets a new harvester.
Truncation (size below our position, or the first bytes changed): a new incarnation from 0.
A deleted file that is still open is read to its end before it is closed.
"""

from __future__ import annotations

import errno
import os
import stat as stat_mod
from typing import Literal

from shipper.model import Checkpoint, Line
from shipper.tail import identity
from shipper.tail.lines import LineSplitter

State = Literal["active", "renamed", "deleted", "closed"]

CHUNK_BYTES = 1024 * 1024


class Harvester:
    """Reads one file incarnation. `checkpoint.offset` is updated by the pipeline, not here."""

    def __init__(self, path: str, fd: int, st: os.stat_result, checkpoint: Checkpoint,
                 max_line_bytes: int, now: float) -> None:
        self.path = path
        self.fd = fd
        self.dev = st.st_dev
        self.inode = st.st_ino
        self.size = st.st_size
        self.checkpoint = checkpoint
        self.splitter = LineSplitter(checkpoint.offset, max_line_bytes)
        self.state: State = "active"
        self.last_growth = now      # monotonic time the file last grew (or was opened)
        self.at_eof = False
        self.truncations = 0

    # ------------------------------------------------------------------ reading

    @property
    def position(self) -> int:
        return self.splitter.read_position

    @property
    def lag_bytes(self) -> int:
        return max(0, self.size - self.checkpoint.offset)

    def read(self, max_bytes: int = CHUNK_BYTES) -> list[Line]:
        """Read up to max_bytes from the current position; [] at EOF (at_eof is then set)."""
        pos = self.splitter.read_position
        try:
            chunk = os.pread(self.fd, max_bytes, pos)
        except OSError as e:
            if e.errno in (errno.EIO, errno.ESTALE):
                self.at_eof = True
                return []
            raise
        if not chunk:
            self.at_eof = True
            return []
        self.at_eof = len(chunk) < max_bytes
        if pos + len(chunk) > self.size:
            self.size = pos + len(chunk)
        return self.splitter.feed(chunk)

    def flush_partial(self) -> list[Line]:
        """The file will not grow any more: its last line without newline counts as a line."""
        return self.splitter.flush()

    # ------------------------------------------------------------------ state checks

    def check(self, now: float) -> Literal["grown", "same", "truncated", "renamed", "deleted"]:
        """fstat the fd and stat the path; decide what happened since the last look."""
        try:
            fst = os.fstat(self.fd)
        except OSError:
            return "deleted"
        size = fst.st_size
        pos = self.splitter.read_position
        if size < pos:
            return "truncated"
        if size != self.size:
            self.size = size
            if size > pos:
                self.last_growth = now
                # copytruncate followed quickly by new writes: the size alone may not shrink below
                # our position, but the first bytes are no longer the ones we fingerprinted.
                if self.checkpoint.fp_len and not identity.matches(self.fd, self.checkpoint.fp_len, self.checkpoint.fp):
                    return "truncated"
        if self.state != "active":
            return "grown" if size > pos else "same"
        if fst.st_nlink == 0:
            self.state = "deleted"
            return "deleted"
        try:
            pst = os.stat(self.path)
        except FileNotFoundError:
            self.state = "renamed"     # moved away or unlinked-with-other-links: read to the end
            return "renamed"
        except OSError:
            return "same"
        if pst.st_ino != self.inode or pst.st_dev != self.dev:
            self.state = "renamed"
            return "renamed"
        return "grown" if size > pos else "same"

    def restart_at_zero(self, new_checkpoint: Checkpoint) -> None:
        """A truncation: continue as a new incarnation from offset 0 of the same fd."""
        self.checkpoint = new_checkpoint
        self.splitter = LineSplitter(0, self.splitter.max_line_bytes)
        self.truncations += 1
        try:
            self.size = os.fstat(self.fd).st_size
        except OSError:
            self.size = 0

    def refresh_fingerprint(self) -> bool:
        """Grow a short fingerprint as the file grows (tiny files are shipped at once). True if changed."""
        cp = self.checkpoint
        if cp.fp_len >= identity.FP_MAX_BYTES or self.size <= cp.fp_len:
            return False
        fp_len, fp = identity.fingerprint_fd(self.fd, self.size)
        if fp_len <= cp.fp_len:
            return False
        cp.fp_len, cp.fp = fp_len, fp
        return True

    def close(self) -> None:
        if self.fd >= 0:
            try:
                os.close(self.fd)
            except OSError:
                pass
            self.fd = -1
        self.state = "closed"


def open_file(path: str) -> tuple[int, os.stat_result] | None:
    """Open a regular file for reading (symlinks followed); None when it vanished or is not a file."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | getattr(os, "O_NOATIME", 0))
    except PermissionError:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return None
    except OSError:
        return None
    try:
        st = os.fstat(fd)
    except OSError:
        os.close(fd)
        return None
    if not stat_mod.S_ISREG(st.st_mode):
        os.close(fd)
        return None
    return fd, st
