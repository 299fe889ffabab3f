"""The walk that finds the directories to watch below a watched one: opened one at a time below
it (never through a link the input's `symlinks` would not follow; never into /proc, /sys, /dev),
judged by the open descriptor, listed only where a glob can match deeper (watchplan.py). Blocking:
run in the rescan's worker thread, never on the event loop; tail/watch.py adds the watches."""

from __future__ import annotations

import errno
import os
import stat as stat_mod
from typing import Protocol

from shipper.tail import opening
from shipper.tail.watchplan import GlobTable, Item

# O_NONBLOCK: nothing a user swaps in can make an open wait; O_DIRECTORY: only a directory opens
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NONBLOCK | os.O_CLOEXEC
# gone, or not (or no longer) what the listing said: a directory swapped for a link or a file
GONE = (errno.ENOENT, errno.ENOTDIR, errno.ELOOP, errno.EMLINK, errno.EINVAL, errno.EACCES, errno.EPERM)


class Adder(Protocol):
    def __call__(self, paths: tuple[str, ...], fd: int, st: os.stat_result, items: frozenset[Item]) -> bool | None:
        """Watch the directory open at `fd` (its fstat `st`), reached by `paths` with `items`:
        whether it is watched now, or None when the walk must stop (the bound on watches)."""
        ...


def open_dir(path: str) -> tuple[int, os.stat_result] | None:
    """A directory named by a path the admin gave (a glob's fixed part, links in it followed), or
    by a watch's own path (the caller checks the inode); None when there is none there now."""
    try:
        fd = os.open(path, _DIR_FLAGS)
    except OSError:
        return None
    return _judged(fd)


def _judged(fd: int) -> tuple[int, os.stat_result] | None:
    try:
        st = os.fstat(fd)
        if stat_mod.S_ISDIR(st.st_mode) and not opening.is_pseudo(st.st_dev):
            return fd, st
    except OSError:
        pass
    os.close(fd)
    return None


def open_child(parent: int, name: str, is_link: bool, table: GlobTable,
               items: frozenset[Item]) -> tuple[int, os.stat_result] | None:
    """The directory `name` in the directory open at `parent`, as the walk may enter it: not
    through a link unless the globs' `symlinks` rule follows it (`opening.follows_dir_link`: the
    link's owner and target read from the link itself, the target's owner from what opened)."""
    try:
        if not is_link:
            return _judged(os.open(name, _DIR_FLAGS | os.O_NOFOLLOW, dir_fd=parent))
        rule = table.rule(items)
        if rule == "none":
            return None
        link_uid, dest = _read_link(parent, name)
        got = _judged(os.open(dest, _DIR_FLAGS, dir_fd=parent))
    except OSError as e:
        if e.errno in GONE:
            return None        # gone, replaced by a link or a file meanwhile: its events say so
        raise
    if got is not None and not opening.follows_dir_link(link_uid, got[1].st_uid, rule):
        os.close(got[0])
        return None
    return got


def _read_link(parent: int, name: str) -> tuple[int, str]:
    """The owner and target of the link `name`, both from the link's own fd where there is one
    (a link swapped meanwhile cannot pair one link's owner with another's target)."""
    if not opening.O_PATH:
        return os.stat(name, dir_fd=parent, follow_symlinks=False).st_uid, os.readlink(name, dir_fd=parent)
    lfd = os.open(name, opening.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent)
    try:
        return os.fstat(lfd).st_uid, os.readlink("", dir_fd=lfd)
    finally:
        os.close(lfd)


def subdirs(fd: int) -> list[tuple[str, bool]]:
    """The directories (and links, which may lead to one) in the directory open at `fd`: (name,
    is a link). A listing is bounded by the directory itself; the walk opens only what matches."""
    out: list[tuple[str, bool]] = []
    try:
        with os.scandir(fd) as it:
            for e in it:
                try:
                    if e.is_symlink():
                        out.append((e.name, True))
                    elif e.is_dir(follow_symlinks=False):
                        out.append((e.name, False))
                except OSError:
                    pass
    except OSError:
        pass
    return out


class Walk:
    """One walk: `visit` each directory to watch from where the watcher starts it, depth first
    (one descriptor open per level: a level is at most MAX_DEPTH below a glob's fixed part plus its
    other parts), descending only where `table.descends`, each directory (st_dev, st_ino) once for
    each item (a directory reached again, by a link or by another glob's root, is listed again only
    for what is new). `stopped`: the adder refused (the bound)."""

    def __init__(self, table: GlobTable, add: Adder) -> None:
        self.table = table
        self.add = add
        self.stopped = False
        self.why: str | None = None      # a directory that could not be entered, and why (EMFILE, say)
        self._seen: dict[tuple[int, int], frozenset[Item]] = {}

    def visit(self, paths: tuple[str, ...], fd: int, st: os.stat_result, items: frozenset[Item]) -> None:
        """Watch the directory at `fd` (the walk closes it) and every directory to watch below it."""
        try:
            ok = self.add(paths, fd, st, items)
            if ok is None:
                self.stopped = True
                return
            key = (st.st_dev, st.st_ino)
            before = self._seen.get(key, frozenset())
            new = items - before
            self._seen[key] = before | items
            if ok and new and self.table.descends(new):
                self.below(paths, fd, new)
        finally:
            os.close(fd)

    def below(self, paths: tuple[str, ...], fd: int, items: frozenset[Item]) -> None:
        """Visit the directories in the one open at `fd` that a glob of `items` can match."""
        for name, is_link in subdirs(fd):
            if self.stopped:
                return
            sub = self.table.step(items, name)
            if not sub:
                continue
            at = tuple(os.path.join(p, name) for p in paths)
            try:
                got = open_child(fd, name, is_link, self.table, sub)
            except OSError as e:
                self.why = f"{at[0]}: {e.strerror or e}"
                continue
            if got is not None:
                self.visit(at, got[0], got[1], sub)
