"""File incarnations: device + inode + a digest of the first bytes (growing with a small file, up to
FP_MAX_BYTES), a persisted identifier, and rotated siblings matched by content (gzip read through).
Keeps no fds: callers pass one, or a path opened here by opening.py's rule for rotated copies."""

from __future__ import annotations

import gzip
import hashlib
import os
import re
import secrets
import struct
import zlib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from shipper.tail import opening

FP_MAX_BYTES = 1024

Kind = Literal["renamed", "copy", "gz"]

# what logrotate appends: .N, -YYYYMMDD (dateext, any dateformat of digits and - _ .), then .gz etc.
_ROTATED_SUFFIX = re.compile(r"^[.\-_](?:\d+|\d{4}[\d.\-_]*)(?:\.(?:gz|z|Z|bz2|xz|zst|lz4))?$")
GZIP_SUFFIXES = (".gz", ".z", ".Z")


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


def fingerprint_head(head: bytes) -> tuple[int, str]:
    head = head[:FP_MAX_BYTES]
    return len(head), digest(head)


def matches(fd: int, fp_len: int, fp: str) -> bool:
    """Does the open file still start with the bytes the fingerprint was taken over?"""
    if fp_len == 0:
        return True
    head = os.pread(fd, fp_len, 0)
    return len(head) == fp_len and digest(head) == fp


def head_matches(head: bytes, fp_len: int, fp: str) -> bool:
    """Do these first bytes of a file (at least fp_len of them) carry the fingerprint?"""
    if fp_len == 0:
        return False          # an empty file's fingerprint names nothing: never match by content
    return len(head) >= fp_len and digest(head[:fp_len]) == fp


def is_compressed(path: str) -> bool:
    return path.endswith(GZIP_SUFFIXES)


def head_of_fd(fd: int, compressed: bool, n: int = FP_MAX_BYTES) -> bytes:
    """First n bytes of an open file, decompressing .gz transparently; b'' when unreadable."""
    try:
        if not compressed:
            return os.pread(fd, n, 0)
        with os.fdopen(os.dup(fd), "rb") as raw, gzip.GzipFile(fileobj=raw, mode="rb") as g:
            return g.read(n)
    except (OSError, EOFError, zlib.error):
        return b""


def head_of_path(path: str, n: int = FP_MAX_BYTES) -> bytes:
    """First n bytes of the file at `path` (a rotated copy's rule: a regular file, not a link),
    decompressing .gz transparently; b'' when unreadable or refused."""
    got = opening.open_log(path, opening.copy_rule(path, None))
    if not isinstance(got, tuple):
        return b""
    fd = got[0]
    try:
        return head_of_fd(fd, is_compressed(path), n)
    finally:
        os.close(fd)


def path_matches(path: str, fp_len: int, fp: str) -> bool:
    return head_matches(head_of_path(path, fp_len), fp_len, fp)


def gzip_size_hint(fd: int, size: int) -> int | None:
    """The uncompressed size a gzip member records in its trailer (mod 2**32); None if unreadable."""
    if size < 4:
        return None
    try:
        tail = os.pread(fd, 4, size - 4)
    except OSError:
        return None
    if len(tail) != 4:
        return None
    return int(struct.unpack("<I", tail)[0])


def is_rotated_name(base: str, name: str) -> bool:
    """Is `name` what logrotate makes of `base` (`.1`, `-20260101`, `.2.gz`, `-20260101.gz`)?"""
    return name.startswith(base) and len(name) > len(base) and bool(_ROTATED_SUFFIX.match(name[len(base):]))


def rotated_bases(name: str) -> list[str]:
    """The names that `name` could be a rotation of (`app.log.1.gz` -> `app.log`)."""
    return [name[:i] for i in range(1, len(name)) if name[i] in ".-_" and _ROTATED_SUFFIX.match(name[i:])]


def rotation_root(path: str) -> str:
    """The path a rotated name comes from (`d/app.log.2.gz` and `d/app.log.1` -> `d/app.log`)."""
    d, name = os.path.split(path)
    bases = rotated_bases(name)
    return os.path.join(d, min(bases, key=len)) if bases else path


def rotated_siblings(path: str, listing: Iterable[str] | None = None) -> list[str]:
    """Paths beside `path` whose names are rotations of its name (no I/O when `listing` is given)."""
    d, base = os.path.split(path)
    if listing is None:
        try:
            listing = os.listdir(d or ".")
        except OSError:
            return []
    return [os.path.join(d, n) for n in listing if is_rotated_name(base, n)]


@dataclass(frozen=True, slots=True)
class Sibling:
    """A rotated sibling as seen now: its stat and its first bytes (decompressed for .gz)."""

    path: str
    dev: int
    inode: int
    size: int                 # on-disk size; for .gz the trailer's uncompressed size (mod 2**32)
    mtime: float
    mtime_ns: int
    head: bytes
    compressed: bool
    uid: int = 0
    in_progress: bool = False  # a .gz whose stream has not ended yet (gzip still writing it)


def look_at(path: str) -> Sibling | None:
    """Open (by the rule for rotated copies) and read the head of one file; None when it vanished,
    is refused (a link, not a regular file, on /proc) or cannot be read."""
    got = opening.open_log(path, opening.copy_rule(path, None))
    if not isinstance(got, tuple):
        return None
    fd, st = got
    try:
        comp = is_compressed(path)
        head = head_of_fd(fd, comp)
        size = st.st_size
        in_progress = comp and not head and gzip_in_progress(fd)
        if comp:
            hint = gzip_size_hint(fd, size)
            size = hint if hint is not None else 0
    finally:
        os.close(fd)
    return Sibling(path, st.st_dev, st.st_ino, size, st.st_mtime, st.st_mtime_ns, head, comp, st.st_uid, in_progress)


def gzip_in_progress(fd: int) -> bool:
    """A .gz with no first bytes to read yet: is its stream unfinished (gzip still writing it: its
    first bytes, which say whose copy it is, are to come)? A finished one of an empty file is not.
    Called only when less than FP_MAX_BYTES came out of it, so what is there is small."""
    try:
        data = os.pread(fd, 1 << 16, 0)
    except OSError:
        return False
    if len(data) < 18:                  # not yet a gzip header and trailer
        return True
    d = zlib.decompressobj(wbits=31)
    try:
        d.decompress(data)
    except zlib.error:
        return False                    # not gzip: nothing to wait for
    return not d.eof


def classify(sib: Sibling, dev: int, inode: int, fp_len: int, fp: str) -> Kind | None:
    """Is this sibling the incarnation (dev, inode, fingerprint)? As the same inode renamed, as a
    plain copy (copytruncate), or compressed. None when its first bytes say otherwise."""
    if fp_len == 0:
        # nothing was fingerprinted (the file was empty): only the same inode, renamed, can be it;
        # a compressed file is always a new inode, and an inode number alone says nothing of it
        return "renamed" if not sib.compressed and (sib.dev, sib.inode) == (dev, inode) else None
    if not head_matches(sib.head, fp_len, fp):
        return None
    if sib.compressed:
        return "gz"
    if sib.dev == dev and sib.inode == inode:
        return "renamed"
    return "copy"


def find_incarnation(path: str, dev: int, inode: int, fp_len: int, fp: str, offset: int,
                     siblings: Iterable[Sibling], *, copies_only: bool = False,
                     owner: int | None = None) -> tuple[Kind, Sibling] | None:
    """Where the content of incarnation (dev, inode, fp) of `path` lives now among its rotated
    siblings. The same inode renamed wins; then plain copies, then compressed ones; among those,
    the most recently modified that holds at least `offset` bytes (an older copy that shares the
    first bytes of a short file is not it). A copy not owned by `owner` (the file's owner, when
    known) or by root is not it (SPEC, Trust boundaries: its first bytes are whoever wrote them)."""
    best: tuple[int, float, Kind, Sibling] | None = None
    rank = {"renamed": 0, "copy": 1, "gz": 2}
    for sib in siblings:
        if sib.path == path:
            continue
        kind = classify(sib, dev, inode, fp_len, fp)
        if kind is None or (copies_only and kind == "renamed"):
            continue
        if owner is not None and kind != "renamed" and sib.uid not in (0, owner):
            continue
        if kind != "gz" and sib.size < offset:
            continue
        key = (rank[kind], -sib.mtime)
        if best is None or key < (best[0], best[1]):
            best = (key[0], key[1], kind, sib)
    return None if best is None else (best[2], best[3])
