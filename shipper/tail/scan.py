"""The globs as `glob.iglob(recursive=True)` matches them, with unchanged directories' listings
reused (their mtime and ctime move with every entry made, removed or renamed), and the `**` walk
bounded (SPEC, Trust boundaries). Lists and stats; opens no file."""

from __future__ import annotations

import fnmatch
import glob
import logging
import os
import stat as stat_mod
from collections.abc import Iterator
from dataclasses import dataclass

from shipper.clock import Clock, SystemClock
from shipper.config import Symlinks
from shipper.tail import opening
from shipper.tail.opening import Refused

MAX_DEPTH = 8                 # directory levels a `**` walk descends below the glob's fixed part
RACY_NS = 2_000_000_000       # a listing younger than this, against the directory's timestamps, is taken again
FULL_EVERY = 6                # every this many scans nothing is reused (at scan_interval 10s: once a minute)
TOLD_MAX = 1024               # loops logged per process at most (each once); then no more lines

log = logging.getLogger(__name__)
_told: set[str] = set()       # the paths at which a loop was cut and said so

_GLOB_CHARS = frozenset("*?[")


def base_dir(pattern: str) -> tuple[str, bool]:
    """The directory prefix of a glob without glob characters, and whether files lie deeper."""
    parts = pattern.split(os.sep)
    fixed: list[str] = []
    for part in parts[:-1]:
        if _GLOB_CHARS & set(part):
            return os.sep.join(fixed) or os.sep, True
        fixed.append(part)
    return os.sep.join(fixed) or os.sep, False


def _depth(path: str) -> int:
    """How many directory names `path` has (`/var/log/` and `/var/log`: 2)."""
    return sum(1 for c in path.split("/") if c and c != ".")


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
    links: frozenset[str]              # the names that are symbolic links
    uid: int                           # the directory's owner


class Scanner:
    """One rescan at a time (the scan thread's): `begin()`, `iglob` for each pattern, `end()`. A
    directory whose names came from the cache in this scan binds each path in it to the inode it
    was bound to at the last scan: `known_stat` hands back that scan's stat of such a path.

    A directory that stat()s as it did when it was listed holds the same names, each bound to
    the same inode, and a regular file found there before is the same file (its content may have
    changed: that is what the caller's stat, or its open fd, is for). Two guards: a listing
    taken within RACY_NS of the directory's own timestamps is not trusted (a change in the same
    clock tick as the listing would leave them as they were), and every FULL_EVERY-th scan lists
    everything afresh.

    `iglob` is the standard library's algorithm (glob.py: `_iglob`, `_glob0/1/2`, `_rlistdir`,
    hidden names, `**` only as a whole component) over `listdir`; tests/component/test_scan.py
    checks it against a reference on random trees, and across changes to them. Where the `**`
    walk departs from glob: it descends at most MAX_DEPTH directory levels below the glob's
    fixed part, it visits each directory (st_dev, st_ino) once per walk (glob walks a loop until
    the path is too long, and links fanning out to siblings make its walk exponential), and it
    follows a link to a directory only as the input's `symlinks` allows
    (`opening.follows_dir_link`). A link not walked is still matched by name; what is opened
    through it is judged again at the open.
    """

    def __init__(self, clock: Clock | None = None) -> None:
        self._clock = clock or SystemClock()       # its wall time: directory timestamps are wall time
        self._dirs: dict[str, _Listing] = {}
        self._seen: dict[str, _Listing] = {}       # listed or reused in this scan
        self._trusted: set[str] = set()
        self.scans = 0
        self.reused = 0                            # directories reused in this scan (for tests, figures)
        # the lstat of each regular file (not a link) open where the last scan matched it, and this scan's so far
        self.stats: dict[str, os.stat_result] = {}
        self._stats: dict[str, os.stat_result] = {}
        # the links a `**` walk did not follow in this scan (the caller says so, once per link)
        self.refused: list[Refused] = []

    def begin(self) -> None:
        self.scans += 1
        self._seen = {}
        self._trusted = set()
        self.reused = 0
        self._stats = {}
        self.refused = []

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

    def _listing(self, dirname: str, st: os.stat_result | None = None) -> _Listing | None:
        """The listing of `dirname` in this scan (`st`: its stat, when the caller took it)."""
        d = dirname or os.curdir
        key = os.path.normpath(d)         # glob names the base both "logs" and "logs/"
        got = self._seen.get(key)
        if got is not None:
            return got
        if st is None:
            st = self._stat_dir(d)
            if st is None:
                return None
        sig = (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_ctime_ns)
        old = self._dirs.get(key)
        if old is not None and reusable(old.sig, old.taken_ns, sig, self.scans):
            self._seen[key] = old
            self._trusted.add(key)
            self._trusted.add(dirname)        # as glob's paths name it: known_stat's lookup needs no normpath
            self.reused += 1
            return old
        taken = int(self._clock.time() * 1e9)
        names: list[str] = []
        dirs: list[str] | None = []
        links: list[str] = []
        try:
            with os.scandir(d) as it:
                for entry in it:
                    names.append(entry.name)
                    try:
                        if entry.is_symlink():
                            dirs = None        # a link's target may change with no change here
                            links.append(entry.name)
                        elif dirs is not None and entry.is_dir():
                            dirs.append(entry.name)
                    except OSError:
                        pass
        except OSError:
            return None
        new = _Listing(sig, taken, names, dirs, frozenset(links), st.st_uid)
        self._seen[key] = new
        return new

    @staticmethod
    def _stat_dir(path: str) -> os.stat_result | None:
        try:
            st = os.stat(path)
        except (OSError, ValueError):
            return None
        return st if stat_mod.S_ISDIR(st.st_mode) else None

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

    def iglob(self, pathname: str, symlinks: Symlinks = "owner") -> Iterator[str]:
        """`glob.iglob(pathname, recursive=True)`, listing through `listdir`, its `**` walks bounded
        (see the module's docstring); `symlinks`: the input's rule for links to directories."""
        fixed = _depth(base_dir(pathname)[0])
        it = self._iglob(pathname, False, symlinks, fixed)
        if not pathname or _isrecursive(pathname[:2]):
            first = next(it, None)          # skip the empty string
            if first:
                yield first
        yield from it

    def _iglob(self, pathname: str, dironly: bool, symlinks: Symlinks, fixed: int) -> Iterator[str]:
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
                yield from self._glob2(dirname, basename, dironly, symlinks, 0)
            else:
                yield from self._glob1(dirname, basename, dironly)
            return
        dirs: Iterator[str] | list[str]
        if dirname != pathname and glob.has_magic(dirname):
            dirs = self._iglob(dirname, True, symlinks, fixed)
        else:
            dirs = [dirname]
        for d in dirs:
            if glob.has_magic(basename):
                names = (self._glob2(d, basename, dironly, symlinks, _depth(d) - fixed) if _isrecursive(basename)
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

    def _glob2(self, dirname: str, pattern: str, dironly: bool, symlinks: Symlinks, level: int) -> Iterator[str]:
        """One `**` walk from `dirname`, `level` directories below the glob's fixed part."""
        yield pattern[:0]
        got = self._listing(dirname)
        if got is None:
            return
        key = got.sig[:2]
        yield from self._rlistdir(dirname, got, dironly, {key: dirname}, {key}, level, symlinks)

    def _rlistdir(self, dirname: str, got: _Listing, dironly: bool, ancestors: dict[tuple[int, ...], str],
                  visited: set[tuple[int, ...]], level: int, symlinks: Symlinks) -> Iterator[str]:
        """glob's `_rlistdir` of `dirname` (`level` directories below the fixed part), listed as
        `got`, descending only into a directory this walk has not visited (`visited`: its
        (st_dev, st_ino); `ancestors`: those from its base down to `dirname`, each with the path
        the walk reached it by), at most MAX_DEPTH levels down, and through a link only as
        `symlinks` allows. With `dironly` (the rest of the pattern lists what is yielded) a
        directory is yielded by the path it was first reached by only; else every entry is a
        match. The stat that tells is the one glob takes of each entry anyway."""
        for x in self._names(got, dirname, dironly):
            if _ishidden(x):
                continue
            if level >= MAX_DEPTH:
                if not dironly:
                    yield x                  # matched; a directory here is not walked nor listed
                continue
            path = _join(dirname, x) if dirname else x
            # the directory's identity first (a listing of this scan, or a stat), its listing only
            # once it is to be walked: a directory reached again costs a stat, not a listing
            sub = self._seen.get(os.path.normpath(path))
            st = None
            key: tuple[int, ...]
            if sub is not None:
                key, uid = sub.sig[:2], sub.uid
            else:
                st = self._stat_dir(path)
                if st is None:
                    yield x                  # not a directory (or gone)
                    continue
                key, uid = (st.st_dev, st.st_ino), st.st_uid
            if x in got.links and not self._follows(path, uid, symlinks):
                if not dironly:
                    yield x                  # matched by name all the same (a file glob's stat says what it is)
                continue
            if key in visited:
                # walked already (or the way down: a loop): matched by name, but a directory to list
                # for the rest of the pattern once per walk, where it was first reached
                if key in ancestors:
                    _tell_loop(path, ancestors[key])
                if not dironly:
                    yield x
                continue
            yield x
            if sub is None:
                sub = self._listing(path, st)
                if sub is None:
                    continue
            visited.add(key)
            ancestors[key] = path
            try:
                for y in self._rlistdir(path, sub, dironly, ancestors, visited, level + 1, symlinks):
                    yield _join(x, y)
            finally:
                del ancestors[key]

    def _follows(self, path: str, target_uid: int, symlinks: Symlinks) -> bool:
        """May the walk go through the link `path` into a directory of `target_uid`? Noted in
        `refused` when not."""
        if symlinks == "all":
            return True
        try:
            link_uid = os.lstat(path).st_uid if symlinks == "owner" else -1
        except OSError:
            return False
        if opening.follows_dir_link(link_uid, target_uid, symlinks):
            return True
        if symlinks == "none":
            self.refused.append(Refused(path, "a symbolic link", path, opening.RULE_TEXT["none"]))
        else:
            self.refused.append(opening.owner_refusal(path, path, link_uid, target_uid))
        return False


def _tell_loop(path: str, ancestor: str) -> None:
    """Log, once per path and process, that the `**` walk did not follow `path` back into `ancestor`."""
    if path in _told or len(_told) >= TOLD_MAX:
        return
    _told.add(path)
    log.info("a ** glob met a link back to an ancestor directory and did not follow it",
             extra={"path": path, "ancestor": ancestor or os.curdir})
