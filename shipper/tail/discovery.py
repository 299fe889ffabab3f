"""Globs and excludes -> the files they match now, with their stat, and the matched paths that are
symbolic links resolved to their targets (Kubernetes' /var/log/containers/*.log), whose
directories tail/watch.py watches too. Never opens or reads a file: the rescan's first look."""
from __future__ import annotations

import errno
import fnmatch
import os
import stat as stat_mod
from collections.abc import Container, Iterable, Mapping, Sequence
from dataclasses import dataclass

from shipper.config import InputConfig
from shipper.tail.opening import Refused, judge_stat
from shipper.tail.scan import Scanner, base_dir


def is_excluded(path: str, excludes: Sequence[str]) -> bool:
    if not excludes:
        return False
    name = os.path.basename(path)
    for ex in excludes:
        if fnmatch.fnmatch(path, ex) or ("/" not in ex and fnmatch.fnmatch(name, ex)):
            return True
    return False


def scan_stat(inputs: Sequence[InputConfig], links: set[str] | None = None, *, scanner: Scanner | None = None,
              known: Mapping[str, tuple[int, int]] | None = None,
              reused: set[str] | None = None,
              fresh: Container[str] = (),
              refused: list[Refused] | None = None) -> list[tuple[str, int, os.stat_result]]:
    """Every regular file matched now, with its stat: (path, index of the first input whose globs
    match it, stat). A symlink and its target, or two links to one file, are followed once: the
    identity is (dev, inode), so no realpath walk is needed. The matched paths that are symbolic
    links are added to `links` (an lstat per path, a stat more only for a link: at 10,000 files
    a separate `islink` walk cost as much as the stats). A match its input's `symlinks` rule would
    not follow, or one on /proc, /sys or /dev, is left out and added to `refused` (`opening.judge_stat`:
    a first look, so such files are not opened at every rescan; the open judges what it opened).

    With a `scanner` (the daemon's rescans), directories unchanged since its last scan are not
    listed again, and a file `known` to be open at its path (path -> (dev, inode)) in such a
    directory is not stat'ed again: its entry carries the last scan's stat (the identity holds;
    size and times are the open fd's business) and its path is added to `reused`. A `known` path
    in `fresh` is stat'ed all the same (and its stat kept for the next scan). Without one, a
    scanner of its own walks the globs (`shipper check`): the same bounded walk as the daemon's."""
    out: list[tuple[str, int, os.stat_result]] = []
    paths: set[str] = set()
    seen: set[tuple[int, int]] = set()
    if scanner is None:
        scanner, known = Scanner(), None
    scanner.begin()
    for idx, inp in enumerate(inputs):
        for pattern in inp.paths:
            pattern = os.path.expanduser(pattern)
            for path in scanner.iglob(pattern, inp.symlinks):
                if path in paths or is_excluded(path, inp.exclude):
                    continue
                is_link = False
                st: os.stat_result | None = None
                if known:
                    k = known.get(path)
                    if k is not None and path not in fresh:
                        st = scanner.known_stat(path)
                        if st is not None and (st.st_dev, st.st_ino) != k:
                            st = None
                        elif st is not None and reused is not None:
                            reused.add(path)
                if st is None:
                    try:
                        lst = st = os.lstat(path)
                        is_link = stat_mod.S_ISLNK(st.st_mode)
                        if is_link:
                            st = os.stat(path)
                    except OSError:
                        continue
                    why = judge_stat(path, lst, st, inp.symlinks)
                    if why is not None:
                        if refused is not None:
                            refused.append(why)
                        continue
                if known and not is_link and path in known and stat_mod.S_ISREG(st.st_mode):
                    scanner.note_stat(path, st)     # kept for open files only: they are what may reuse it
                if not stat_mod.S_ISREG(st.st_mode):
                    continue
                key = (st.st_dev, st.st_ino)
                if key in seen:
                    continue
                seen.add(key)
                paths.add(path)
                if is_link and links is not None:
                    links.add(path)
                out.append((path, idx, st))
    scanner.end()
    if refused is not None:
        refused.extend(scanner.refused)
    return out


def glob_bases(inp: InputConfig) -> list[str]:
    """The fixed parts of an input's globs, longest first (`opening.glob_rule`)."""
    return sorted({os.path.normpath(base_dir(os.path.expanduser(p))[0]) for p in inp.paths}, key=len, reverse=True)


def scan(inputs: Sequence[InputConfig], refused: list[Refused] | None = None) -> dict[str, int]:
    """Every regular file matched now: path -> index of the first input whose globs match it."""
    return {path: idx for path, idx, _st in scan_stat(inputs, refused=refused)}


MAX_LINK_HOPS = 40     # as the kernel's own limit on nested symlinks (ELOOP)


@dataclass(frozen=True, slots=True)
class LinkTarget:
    """A matched path that is a symbolic link, resolved: the file it leads to and the directories
    to watch for it (the final target's, where its writer recreates it after a rotation, and each
    intermediate link's, where a link may be replaced)."""

    path: str                  # the matched path: log.file.path, the link
    target: str                # the file at the end of the chain (realpath)
    dirs: tuple[str, ...]


def resolve_link(path: str) -> LinkTarget | None:
    """The chain of links from `path` to a file; None when `path` is no link, or the chain
    dangles or loops (the rescan, which stats through it, will not see a file there either)."""
    hops: list[str] = []
    cur = path
    for _ in range(MAX_LINK_HOPS):
        try:
            dest = os.readlink(cur)
        except OSError as e:
            if e.errno == errno.EINVAL and hops:
                break                          # not a link: the end of the chain
            return None                        # `path` is no link, or a hop vanished meanwhile
        cur = os.path.join(os.path.dirname(cur), dest)
        hops.append(cur)
    else:
        return None
    try:
        target = os.path.realpath(path, strict=True)
    except (OSError, RuntimeError):
        return None
    dirs = [os.path.dirname(target)]
    for hop in hops[:-1]:
        d = os.path.dirname(os.path.normpath(hop))
        if d not in dirs:
            dirs.append(d)
    return LinkTarget(path, target, tuple(dirs))


def resolve_links(paths: Iterable[str]) -> dict[str, LinkTarget]:
    """The matched paths that are symbolic links, resolved (one lstat per path, readlinks for links)."""
    out: dict[str, LinkTarget] = {}
    for p in paths:
        if os.path.islink(p):
            lt = resolve_link(p)
            if lt is not None:
                out[p] = lt
    return out
