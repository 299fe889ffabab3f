"""The looks at a directory that block, run off the event loop one at a time (tail/fileset.py keeps a
slot for the one short look beside the open files): opening files, rotated siblings' heads. Every
file opened by opening.py's policy; they return values that adopt.py and recovery.py judge."""

from __future__ import annotations

import os
import stat as stat_mod
import zlib
from dataclasses import dataclass

from shipper.model import Checkpoint
from shipper.tail import identity, opening
from shipper.tail.fileset import Candidate, Key
from shipper.tail.harvester import GzipReader
from shipper.tail.opening import Refused, Rule

Found = tuple[identity.Kind, identity.Sibling]
MOVED_LOOKS = 3         # looks for a copy that moves while it is looked at (logrotate's next rotation)


@dataclass(frozen=True, slots=True)
class Reference:
    """A file we hold (open or parked) whose first bytes an unknown short file may be a copy of."""

    root: str             # rotation root of its path
    path: str
    key: Key
    fd: int               # -1 for a parked file (opened for the look)
    fp_len: int           # how far it is fingerprinted: a file that holds less cannot be told by it


@dataclass(slots=True)
class Opened:
    """A candidate opened off the loop: its fd, stat, first bytes (through gzip for compressed
    ones) and the facts the open decision needs that take I/O."""

    fd: int
    st: os.stat_result
    head: bytes
    gz: GzipReader | None
    being_copied: bool = False     # an unknown short file at a rotated name whose bytes so far are a held file's first ones
    tail_start: int = 0            # start_at end: just past the last newline

    def close(self) -> None:
        close_file(self.fd, self.gz)


def close_file(fd: int, gz: GzipReader | None) -> None:
    if gz is not None:
        gz.close()
    os.close(fd)


def open_batch(cands: list[Candidate], rules: list[Rule], refs: list[Reference],
               tail_of: set[int]) -> list[Opened | Refused | None]:
    """Open files (each by its rule: `opening.open_log`) and read their first bytes. `refs`: the
    files held of each rotation root, for the copy check; `tail_of`: indexes of candidates that
    start at their last newline (start_at: end). None: nothing there to open now."""
    out: list[Opened | Refused | None] = []
    for i, (c, rule) in enumerate(zip(cands, rules, strict=True)):
        opened = opening.open_log(c.path, rule)
        if not isinstance(opened, tuple):
            out.append(opened)
            continue
        fd, st = opened
        gz = None
        try:
            if c.why == "gz" or (c.why in ("glob", "successor") and identity.is_compressed(c.path)):
                gz = GzipReader(fd)
                head = gz.read(identity.FP_MAX_BYTES)
            else:
                head = os.pread(fd, identity.FP_MAX_BYTES, 0)
            o = Opened(fd, st, head, gz)
            if c.cp is None and c.why in ("glob", "successor"):
                o.being_copied = being_copied(c.path, head, refs)
            if i in tail_of and gz is None:
                o.tail_start = last_newline_end(fd, st.st_size)
        except (OSError, EOFError, zlib.error):
            close_file(fd, gz)
            out.append(None)
            continue
        out.append(o)
    return out


def being_copied(path: str, head: bytes, refs: list[Reference]) -> bool:
    """Is this unknown file at a rotated name a copy logrotate is still writing? The compressor
    creates its .gz empty and fills it; copytruncate's copy starts empty and grows. Such a file
    is too short to carry the fingerprint of the file it copies, but its bytes so far are that
    file's first bytes (looked up among the files of the same rotation root we hold or parked)."""
    root = identity.rotation_root(path)
    if root == path or len(head) >= identity.FP_MAX_BYTES:
        return False
    if not head:
        return True           # nothing to ship yet either way; judged by content once written
    n = len(head)
    for ref in refs:
        if ref.root != root or ref.fp_len <= n:
            continue
        if ref.fd >= 0:
            try:
                if os.pread(ref.fd, n, 0) == head:
                    return True
            except OSError:
                pass
            continue
        fd = opening.reopen(ref.path, ref.key)
        if fd is None:
            continue
        try:
            if os.pread(fd, n, 0) == head:
                return True
        except OSError:
            pass
        finally:
            os.close(fd)
    return False


def last_newline_end(fd: int, size: int) -> int:
    """Offset just past the last newline before size (0 if none in the last 1 MiB)."""
    start = max(0, size - 1024 * 1024)
    data = os.pread(fd, size - start, start)
    nl = data.rfind(b"\n")
    return start + nl + 1 if nl >= 0 else start if start else 0


class Surroundings:
    """One look around: directory listings and rotated siblings' heads, each read once."""

    def __init__(self) -> None:
        self._listings: dict[str, list[str]] = {}
        self._looked: dict[str, identity.Sibling | None] = {}

    def rotated(self, path: str) -> list[str]:
        """The rotated siblings' paths of `path` (app.log.1, app.log-20260101.gz, ...). For a
        symbolic link, those of its target, where its writer rotates it (kubelet: `0.log` ->
        `0.log.<timestamp>`), even while the link dangles between the rename and the reopen:
        only a link owned by root or by its target's owner (`symlink_dir`)."""
        path = symlink_dir(path)
        d = os.path.dirname(path)
        names = self._listings.get(d)
        if names is None:
            try:
                names = os.listdir(d or ".")
            except OSError:
                names = []
            self._listings[d] = names
        return list(identity.rotated_siblings(path, names))

    def look(self, path: str) -> identity.Sibling | None:
        if path not in self._looked:
            self._looked[path] = identity.look_at(path)
        return self._looked[path]

    def siblings(self, path: str) -> list[identity.Sibling]:
        return [s for s in map(self.look, self.rotated(path)) if s is not None]


def symlink_dir(path: str) -> str:
    """Where the rotated copies of `path` lie: beside it, or for a symbolic link, beside its target
    when the link is owned by root or by the target's owner (a runtime's links into its own files).
    Beside another user's link they are not looked for elsewhere: its copies there would have to be
    that user's or root's, and root's files elsewhere are not for that user to name."""
    try:
        lst = os.lstat(path)
    except OSError:
        return path
    if not stat_mod.S_ISLNK(lst.st_mode):
        return path
    target = os.path.realpath(path)
    if lst.st_uid != 0:
        try:
            if os.stat(target).st_uid != lst.st_uid:
                return path
        except OSError:
            return path
    return target


Located = tuple[Checkpoint, Found | None, list[identity.Sibling]]


def locate(cps: list[Checkpoint], cache: dict[str, tuple[str, int, int, int]]) -> list[Located | None]:
    """For each incarnation, its rotated siblings and which of them holds it. None for one whose
    remembered place (`cache`: path, inode, size, mtime) has not changed."""
    around = Surroundings()
    out: list[Located | None] = []
    for cp in cps:
        c = cache.get(cp.incarnation)
        if c is not None:
            try:
                st = os.stat(c[0])
                if (st.st_ino, st.st_size, st.st_mtime_ns) == c[1:]:
                    out.append(None)
                    continue
            except OSError:
                pass
        sibs = around.siblings(cp.path)
        found = identity.find_incarnation(cp.path, cp.dev, cp.inode, cp.fp_len, cp.fp, cp.offset, sibs, owner=cp.uid)
        out.append((cp, found, sibs))
    return out


def list_siblings(paths: dict[str, float], mtime_slack_s: float) -> dict[str, list[identity.Sibling]]:
    """The rotated siblings of each path changed after its time, with their heads (the older ones
    are only stat'ed)."""
    out: dict[str, list[identity.Sibling]] = {}
    around = Surroundings()
    for path, since in paths.items():
        sibs = []
        for p in around.rotated(path):
            try:
                if os.stat(p).st_mtime <= since - mtime_slack_s:
                    continue
            except OSError:
                continue
            s = identity.look_at(p)
            if s is not None:
                sibs.append(s)
        out[path] = sibs
    return out


def content_nowhere(cps: list[Checkpoint]) -> list[Checkpoint]:
    """The incarnations whose content is nowhere any more (not at their path, not among its
    rotated siblings, renamed or copied or compressed)."""
    out = []
    around = Surroundings()
    for cp in cps:
        try:
            st = os.stat(cp.path)
            if (st.st_dev, st.st_ino) == (cp.dev, cp.inode):
                continue
        except OSError:
            pass
        present = False
        for p in around.rotated(cp.path):
            s = around.look(p)
            if s is not None and identity.classify(s, cp.dev, cp.inode, cp.fp_len, cp.fp) is not None:
                present = True
                break
        if not present:
            out.append(cp)
    return out


@dataclass(slots=True)
class TruncationLook:
    """After a truncation: the copy logrotate left beside the file (opened), and the file's new head."""

    copy: Opened | None
    copy_path: str
    new_size: int
    new_fp: tuple[int, str] | None     # None: unreadable now (grows once it reads again)
    refused: Refused | None = None     # the copy found by content, not read (opening's rule)
    moved: bool = False                # the copy found by content kept moving: it is somewhere still


def _owner(fd: int, cp: Checkpoint) -> int | None:
    """The owner of the file a copy is of: the open file's, else the one its checkpoint keeps."""
    try:
        return os.fstat(fd).st_uid
    except OSError:
        return cp.uid


def look_after_truncation(path: str, fd: int, old: Checkpoint, committed: int, open_keys: set[Key],
                          may_open: bool) -> TruncationLook:
    """copytruncate: find the rotated copy holding the incarnation's unread range (by content),
    open it when `may_open` (a slot is free), and fingerprint what the file holds now.

    logrotate's next rotation may move the copy while it is looked for (listed as app.log.1, by
    then app.log.2 with a new copy at app.log.1; or renamed between the look and the open): while
    what the look saw beside the file changes, it looks again (at most MOVED_LOOKS times). `moved`:
    a copy found but never opened at its name, or looks that never saw the same twice; the caller
    leaves the incarnation to the next rescan's look for orphans."""
    copy: Opened | None = None
    copy_path = ""
    refused: Refused | None = None
    moved = False
    if old.fp_len and may_open:
        owner = _owner(fd, old)
        seen: list[tuple[str, int, int, int]] | None = None
        for _ in range(MOVED_LOOKS):
            sibs = Surroundings().siblings(path)
            found = identity.find_incarnation(path, old.dev, old.inode, old.fp_len, old.fp, committed, sibs,
                                              copies_only=True, owner=owner)
            if found is None:
                now = sorted((s.path, s.dev, s.inode, s.size) for s in sibs)
                if now == seen:
                    break           # nothing moved since the last look: there is no copy
                seen = now
                continue
            kind, sib = found
            skey = (sib.dev, sib.inode)
            if skey in open_keys:
                break
            opened = opening.open_log(sib.path, opening.copy_rule(sib.path, owner))
            if isinstance(opened, Refused):
                refused = opened
                break
            if isinstance(opened, tuple) and (opened[1].st_dev, opened[1].st_ino) == skey:
                cfd, st = opened
                try:
                    gz = GzipReader(cfd) if kind == "gz" else None
                except OSError:
                    os.close(cfd)
                else:
                    copy, copy_path = Opened(cfd, st, b"", gz), sib.path
                break
            if isinstance(opened, tuple):
                os.close(opened[0])
            moved = True        # gone from its name, or another file there now
        else:
            moved = True        # still moving after MOVED_LOOKS looks: the next rescan looks again
    try:
        size = os.fstat(fd).st_size
    except OSError:
        size = 0
    try:
        fp: tuple[int, str] | None = identity.fingerprint_fd(fd, size)
    except OSError:
        fp = None
    return TruncationLook(copy, copy_path, size, fp, refused, moved)
