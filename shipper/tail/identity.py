"""File incarnations: device + inode + a digest of the first bytes, and a persisted identifier.

The fingerprint covers the first `fp_len` bytes (up to FP_MAX_BYTES), so a file smaller than that
is recognised at once and the fingerprint grows with it. Keeps no fds open: callers pass one.
"""

from __future__ import annotations

import gzip
import hashlib
import os
import secrets

FP_MAX_BYTES = 1024


def new_incarnation() -> str:
    """A fresh identifier for a file incarnation: 12 hex chars, part of every document _id."""
    return secrets.token_hex(6)


def digest(head: bytes) -> str:
    return hashlib.blake2b(head, digest_size=12).hexdigest()


def read_head(fd: int, n: int = FP_MAX_BYTES) -> bytes:
    return os.pread(fd, n, 0)


def fingerprint_fd(fd: int, size: int) -> tuple[int, str]:
    """(fp_len, digest) over the first min(size, FP_MAX_BYTES) bytes of an open file."""
    head = os.pread(fd, min(size, FP_MAX_BYTES), 0) if size > 0 else b""
    return len(head), digest(head)


def matches(fd: int, fp_len: int, fp: str) -> bool:
    """Does the open file still start with the bytes the fingerprint was taken over?"""
    if fp_len == 0:
        return True
    head = os.pread(fd, fp_len, 0)
    return len(head) == fp_len and digest(head) == fp


def head_of_path(path: str, n: int = FP_MAX_BYTES) -> bytes:
    """First n bytes of a file, decompressing .gz transparently; b'' when unreadable."""
    try:
        if path.endswith(".gz"):
            with gzip.open(path, "rb") as g:
                return g.read(n)
        with open(path, "rb") as f:
            return f.read(n)
    except (OSError, EOFError):
        return b""


def path_matches(path: str, fp_len: int, fp: str) -> bool:
    if fp_len == 0:
        return False
    head = head_of_path(path, fp_len)
    return len(head) == fp_len and digest(head) == fp
