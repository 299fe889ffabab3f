"""The globs, as `glob.iglob(recursive=True)` matches them, with the listing of every directory whose
entries did not change since the last rescan reused (issue 14: the rescan of an idle host).

A directory's mtime and ctime move whenever an entry is created, removed or renamed in it, so a
directory that stat()s as it did when it was listed holds the same names, each bound to the same
inode, and a regular file found there before is the same file (its content may have changed: that
is what the caller's stat, or its open fd, is for). Two guards: a listing taken within RACY_NS of
the directory's own timestamps is not trusted (a change in the same clock tick as the listing
would leave them as they were), and every FULL_EVERY-th scan lists everything afresh.

`Scanner.iglob` is the standard library's algorithm (glob.py: `_iglob`, `_glob0/1/2`, `_rlistdir`,
hidden names, `**` only as a whole component) over `Scanner.listdir`; tests/component/test_scan.py
checks it against `glob.glob` on random trees, and across changes to them. One departure: like
glob, the `**` walk follows links to directories, but it does not descend into a directory that is
already on its way down (the same st_dev and st_ino as the walk's base or a directory between),
where glob walks the loop until the path is too long (a link such as /var/log/app/loop -> /var/log;
several of them make glob's walk exponential). The link itself is still matched, and two links to
one directory that is not an ancestor are both walked, as glob does.
"""

from __future__ import annotations

import fnmatch
import glob
import logging
import os
import stat as stat_mod
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

RACY_NS = 2_000_000_000       # a listing younger than this, against the directory's timestamps, is taken again
FULL_EVERY = 6                # every this many scans nothing is reused (at scan_interval 10s: once a minute)
TOLD_MAX = 1024               # loops logged per process at most (each once); then no more lines

log = logging.getLogger(__name__)
_told: set[str] = set()       # the paths at which a loop was cut and said so

def _ishidden(name: str) -> bool:
    return name[0] == "."


def _isrecursive(pattern: str) -> bool:
    return pattern == "**"


def _join(a: str, b: str) -> str:
    """os.path.join(a, b) for a name `b` that glob made (never absolute), at a fraction of its cost."""
    if not a or a.endswith("/"):
        return a + b
    return a + "/" + b


def reusable(old_sig: tuple[int, int, int, int], taken_ns: int, sig: tuple[int, int, int, int], scan: int) -> bool:
    """Whether a directory listed at `taken_ns` (wall clock), with the signature (dev, inode,
    mtime_ns, ctime_ns) `old_sig` then, holds the same names now that it stat()s as `sig`, in scan
    number `scan`. A change made after the listing stamps the directory with the kernel's coarse
    clock, at most a tick (a few ms) behind the listing's own `taken_ns`; so when the stamps the
    directory had then were older than the listing by more than RACY_NS, any later change moves
    them. A listing younger than that against them is never reused (the change may have come in
    the same tick), nor is one in every FULL_EVERY-th scan."""
    return (old_sig == sig and scan % FULL_EVERY != 0
            and taken_ns - max(sig[2], sig[3]) > RACY_NS)


@dataclass(slots=True)
class _Listing:
    sig: tuple[int, int, int, int]     # dev, inode, mtime_ns, ctime_ns of the directory when listed
    taken_ns: int                      # wall clock just before the listing
    names: list[str]
    dirs: list[str] | None             # the names that are directories; None when one is a symlink


class Scanner:
    """One rescan at a time (the scan thread's): `begin()`, `iglob` for each pattern, `end()`. A
    directory whose names came from the cache in this scan binds each path in it to the inode it
    was bound to at the last scan: `known_stat` hands back that scan's stat of such a path."""

    def __init__(self, now_ns: Callable[[], int] = time.time_ns) -> None:
        self._now_ns = now_ns                      # the wall clock (directory timestamps are wall time)
        self._dirs: dict[str, _Listing] = {}
        self._seen: dict[str, _Listing] = {}       # listed or reused in this scan
        self._trusted: set[str] = set()
        self.scans = 0
        self.reused = 0                            # directories reused in this scan (for tests, figures)
        # the lstat of each regular file (not a link) open where the last scan matched it, and this scan's so far
        self.stats: dict[str, os.stat_result] = {}
        self._stats: dict[str, os.stat_result] = {}

    def begin(self) -> None:
        self.scans += 1
        self._seen = {}
        self._trusted = set()
        self.reused = 0
        self._stats = {}

    def end(self) -> None:
        """Forget the directories and files this scan did not reach (removed, or no glob leads there now)."""
        self._dirs = self._seen
        self.stats = self._stats

    def known_stat(self, path: str) -> os.stat_result | None:
        """The last scan's lstat of `path` when this scan found its directory unchanged: the same
        regular file is there (its size and times may have moved since)."""
        st = self.stats.get(path)
        if st is None:
            return None
        i = path.rfind("/")
        d = path[:i] if i > 0 else path[:i + 1]        # os.path.dirname of a file's path, for less
        if d in self._trusted or os.path.normpath(d or os.curdir) in self._trusted:
            return st
        return None

    def note_stat(self, path: str, st: os.stat_result) -> None:
        """This scan's lstat of a regular file at `path` (not a link), for the next scan."""
        self._stats[path] = st

    # ---------------------------------------------------------------- listing

    def _listing(self, dirname: str) -> _Listing | None:
        d = dirname or os.curdir
        key = os.path.normpath(d)         # glob names the base both "logs" and "logs/"
        got = self._seen.get(key)
        if got is not None:
            return got
        try:
            st = os.stat(d)
        except (OSError, ValueError):
            return None
        if not stat_mod.S_ISDIR(st.st_mode):
            return None
        sig = (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_ctime_ns)
        old = self._dirs.get(key)
        if old is not None and reusable(old.sig, old.taken_ns, sig, self.scans):
            self._seen[key] = old
            self._trusted.add(key)
            self._trusted.add(dirname)        # as glob's paths name it: known_stat's lookup needs no normpath
            self.reused += 1
            return old
        taken = self._now_ns()
        names: list[str] = []
        dirs: list[str] | None = []
        try:
            with os.scandir(d) as it:
                for entry in it:
                    names.append(entry.name)
                    try:
                        if dirs is not None and entry.is_symlink():
                            dirs = None        # a link's target may change with no change here
                        if dirs is not None and entry.is_dir():
                            dirs.append(entry.name)
                    except OSError:
                        pass
        except OSError:
            return None
        new = _Listing(sig, taken, names, dirs)
        self._seen[key] = new
        return new

    def listdir(self, dirname: str, dironly: bool) -> list[str]:
        """glob's `_listdir`: the names in `dirname` (only directories', following symlinks, when
        `dironly`); [] when it cannot be listed."""
        return self._names(self._listing(dirname), dirname, dironly)

    @staticmethod
    def _names(got: _Listing | None, dirname: str, dironly: bool) -> list[str]:
        """`listdir` of `dirname` given its listing `got`."""
        if got is None:
            return []
        if not dironly:
            return got.names
        if got.dirs is not None:
            return got.dirs
        out = []
        base = dirname or os.curdir
        for name in got.names:
            try:
                if os.path.isdir(os.path.join(base, name)):
                    out.append(name)
            except (OSError, ValueError):
                pass
        return out

    # ---------------------------------------------------------------- glob.py's algorithm

    def iglob(self, pathname: str) -> Iterator[str]:
        """`glob.iglob(pathname, recursive=True)`, listing through `listdir`."""
        it = self._iglob(pathname, False)
        if not pathname or _isrecursive(pathname[:2]):
            first = next(it, None)          # skip the empty string
            if first:
                yield first
        yield from it

    def _iglob(self, pathname: str, dironly: bool) -> Iterator[str]:
        dirname, basename = os.path.split(pathname)
        if not glob.has_magic(pathname):
            if basename:
                if os.path.lexists(pathname):
                    yield pathname
            elif os.path.isdir(dirname):
                yield pathname
            return
        if not dirname:
            if _isrecursive(basename):
                yield from self._glob2(dirname, basename, dironly)
            else:
                yield from self._glob1(dirname, basename, dironly)
            return
        dirs: Iterator[str] | list[str]
        if dirname != pathname and glob.has_magic(dirname):
            dirs = self._iglob(dirname, True)
        else:
            dirs = [dirname]
        for d in dirs:
            if glob.has_magic(basename):
                names = (self._glob2(d, basename, dironly) if _isrecursive(basename)
                         else self._glob1(d, basename, dironly))
            else:
                names = self._glob0(d, basename)
            for name in names:
                yield _join(d, name)

    def _glob1(self, dirname: str, pattern: str, dironly: bool) -> list[str]:
        names = self.listdir(dirname, dironly)
        if not _ishidden(pattern):
            names = [x for x in names if not _ishidden(x)]
        return fnmatch.filter(names, pattern)

    @staticmethod
    def _glob0(dirname: str, basename: str) -> list[str]:
        if basename:
            if os.path.lexists(_join(dirname, basename)):
                return [basename]
        elif os.path.isdir(dirname):
            return [basename]
        return []

    def _glob2(self, dirname: str, pattern: str, dironly: bool) -> Iterator[str]:
        yield pattern[:0]
        got = self._listing(dirname)
        if got is None:
            return
        yield from self._rlistdir(dirname, got, dironly, {got.sig[:2]: dirname})

    def _rlistdir(self, dirname: str, got: _Listing, dironly: bool,
                  ancestors: dict[tuple[int, ...], str]) -> Iterator[str]:
        """glob's `_rlistdir` of `dirname`, listed as `got`, not descending into a directory
        whose (st_dev, st_ino) is in `ancestors` (this walk's directories from its base down to
        `dirname`, each with the path the walk reached it by). The stat that tells is the one
        `_listing` takes of each directory anyway (glob lists each entry it yields)."""
        for x in self._names(got, dirname, dironly):
            if not _ishidden(x):
                yield x
                path = _join(dirname, x) if dirname else x
                sub = self._listing(path)
                if sub is None:
                    continue
                key = sub.sig[:2]
                if key in ancestors:
                    _tell_loop(path, ancestors[key])
                    continue
                ancestors[key] = path
                try:
                    for y in self._rlistdir(path, sub, dironly, ancestors):
                        yield _join(x, y)
                finally:
                    del ancestors[key]


def _tell_loop(path: str, ancestor: str) -> None:
    """Log, once per path and process, that the `**` walk did not follow `path` back into `ancestor`."""
    if path in _told or len(_told) >= TOLD_MAX:
        return
    _told.add(path)
    log.info("a ** glob met a link back to an ancestor directory and did not follow it",
             extra={"path": path, "ancestor": ancestor or os.curdir})
