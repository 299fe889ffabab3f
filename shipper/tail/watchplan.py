"""Which directories the inotify watcher watches: each glob's directory parts matched one name at a
time below its fixed part (or the nearest existing parent of a fixed part not there yet), no deeper
than the glob can match a file (a `**`: scan.py's MAX_DEPTH levels); the directories of symlinks'
targets. Stats paths at most: tail/dirwalk.py lists and opens, tail/watch.py watches."""

from __future__ import annotations

import fnmatch
import glob
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from shipper.config import InputConfig, Symlinks
from shipper.tail.discovery import LinkTarget
from shipper.tail.scan import MAX_DEPTH, base_dir

# A directory's place in a glob: (the glob's index in a GlobTable, how many of its parts the
# directory's path has matched, the directory's level below the glob's fixed part). Levels above
# the fixed part (while it does not exist yet) are negative.
Item = tuple[int, int, int]

MAX_PENDING_PATHS = 4096      # paths named and not taken yet, at most: past it a rescan looks at all


@dataclass(frozen=True, slots=True)
class Glob:
    """The directory parts of one glob below the directory watched for it (`**` may repeat; a
    literal part is a name, as glob's own), and the input's rule for links to directories."""

    parts: tuple[str, ...]
    symlinks: Symlinks


class GlobTable:
    """The globs watched, each with a stable index (items name them). Append-only: a glob is few
    bytes, and an index must mean the same glob for as long as a watch carries it."""

    def __init__(self) -> None:
        self.globs: list[Glob] = []
        self._index: dict[Glob, int] = {}

    def index(self, g: Glob) -> int:
        i = self._index.get(g)
        if i is None:
            i = self._index[g] = len(self.globs)
            self.globs.append(g)
        return i

    def closure(self, items: Iterable[Item]) -> frozenset[Item]:
        """`items` with each `**` also matching no directory at all."""
        out = set(items)
        todo = list(out)
        while todo:
            gi, pos, lvl = todo.pop()
            parts = self.globs[gi].parts
            if pos < len(parts) and parts[pos] == "**":
                nxt = (gi, pos + 1, lvl)
                if nxt not in out:
                    out.add(nxt)
                    todo.append(nxt)
        return frozenset(out)

    def step(self, items: frozenset[Item], name: str) -> frozenset[Item]:
        """The items of the directory `name` in a directory of `items`: empty when no glob can
        match a file in it or below it (then it is not watched). As glob.py matches: `*` and the
        like skip hidden names unless the part begins with a dot, a `**` walk skips them always
        and descends while the directory it lists is less than MAX_DEPTH below the fixed part."""
        hidden = name.startswith(".")
        out: list[Item] = []
        for gi, pos, lvl in items:
            parts = self.globs[gi].parts
            if pos >= len(parts):
                continue
            p = parts[pos]
            if p == "**":
                if not hidden and lvl < MAX_DEPTH:
                    out.append((gi, pos, lvl + 1))
            elif _matches(p, name, hidden):
                out.append((gi, pos + 1, lvl + 1))
        return self.closure(out) if out else frozenset()

    def descends(self, items: frozenset[Item]) -> bool:
        """Whether a directory of `items` may hold a directory to watch."""
        for gi, pos, lvl in items:
            parts = self.globs[gi].parts
            if pos < len(parts) and (parts[pos] != "**" or lvl < MAX_DEPTH):
                return True
        return False

    def rule(self, items: frozenset[Item]) -> Symlinks:
        """The most permissive `symlinks` rule among the globs of `items` (a link one input's rule
        refuses may lead to another's files; opening.py judges every file on its own path)."""
        rules = {self.globs[gi].symlinks for gi, _pos, _lvl in items}
        return "all" if "all" in rules else "owner" if "owner" in rules else "none"


def _matches(part: str, name: str, hidden: bool) -> bool:
    if not glob.has_magic(part):
        return name == part
    if hidden and not part.startswith("."):
        return False
    return fnmatch.fnmatch(name, part)


def glob_root(pattern: str, symlinks: Symlinks) -> tuple[str, Glob, int]:
    """The directory to watch for one glob: its fixed part or, while that does not exist, its
    nearest existing parent (the caller watches neither / nor ""), with the glob's directory parts below it and the level of
    that directory below the fixed part (0, or negative for a parent). Stats the path only."""
    pattern = os.path.expanduser(pattern)
    fixed, _deep = base_dir(pattern)
    comps = [c for c in pattern[len(fixed):].split(os.sep) if c]
    dir_parts = comps[:-1]
    if comps and comps[-1] == "**":
        dir_parts.append("**")          # `dir/**` matches files in every directory its walk lists
    d, missing = fixed, list[str]()
    while d not in ("", os.sep) and not os.path.isdir(d):
        d, name = os.path.split(d)
        missing.insert(0, name)
    return d, Glob(tuple(missing + dir_parts), symlinks), -len(missing)


def watch_targets(inputs: Sequence[InputConfig]) -> list[tuple[str, bool]]:
    """(directory, recursive) to watch for these inputs: each glob's base directory, or while it
    does not exist its nearest existing parent, recursively (so its appearance is seen); never /."""
    out = []
    for inp in inputs:
        for pattern in inp.paths:
            d, deep = base_dir(os.path.expanduser(pattern))
            while not os.path.isdir(d) and d != os.sep:
                d, deep = os.path.dirname(d), True
            if d != os.sep:
                out.append((d, deep))
    return out


def link_watch_targets(links: Iterable[LinkTarget]) -> list[tuple[str, bool]]:
    """(directory, recursive=False) to watch for these links' targets, each once; never /."""
    out: list[tuple[str, bool]] = []
    seen: set[str] = set()
    for lt in links:
        for d in lt.dirs:
            if d != os.sep and d not in seen:
                seen.add(d)
                out.append((d, False))
    return out


def links_by_target(links: Mapping[str, LinkTarget]) -> dict[str, tuple[str, ...]]:
    """target path -> the matched paths leading to it: a write inotify reports on the target
    is reported on the paths the reader knows the file by."""
    by: dict[str, list[str]] = {}
    for lt in links.values():
        by.setdefault(lt.target, []).append(lt.path)
    return {t: tuple(ps) for t, ps in by.items()}


def translate(modified: set[str], link_of: Mapping[str, tuple[str, ...]]) -> set[str]:
    """The paths modified, with the matched paths that lead to each symlink target among them."""
    if not link_of:
        return modified
    out = set(modified)
    for p in modified:
        out.update(link_of.get(p, ()))
    return out
