"""The incarnation index: every file incarnation's checkpoint, found by inode, by path and by rotation
root. Pure: no I/O, no clock. Identity is kept apart from paths and offsets (as Vector's checkpointer
does); the live Checkpoints are owned here, the reading source advances its own, drafts take copies."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator, KeysView
from typing import TypeVar

from shipper.model import Checkpoint
from shipper.tail import identity

Key = tuple[int, int]        # (dev, inode)
K = TypeVar("K")


class Catalog:
    def __init__(self, checkpoints: Iterable[Checkpoint] = ()) -> None:
        self._cps: dict[str, Checkpoint] = {}
        self._by_key: dict[Key, set[str]] = {}
        self._by_path: dict[str, set[str]] = {}
        self._by_root: dict[str, set[str]] = {}     # rotation root (app.log for app.log.2.gz) -> incarnations
        self.known_paths: set[str] = set()          # paths known at start (start_at: end skips only new ones)
        self._link_roots: dict[str, str] = {}       # a symlink target's rotation root -> the link's path
        for cp in checkpoints:
            self.index(dataclasses.replace(cp))
            self.known_paths.add(cp.path)

    def __len__(self) -> int:
        return len(self._cps)

    def __iter__(self) -> Iterator[Checkpoint]:
        return iter(list(self._cps.values()))

    def get(self, incarnation: str) -> Checkpoint | None:
        return self._cps.get(incarnation)

    def paths(self) -> list[str]:
        """Every path some incarnation was read at."""
        return list(self._by_path)

    def path_set(self) -> KeysView[str]:
        """The same as a live set view (set operations against it run in C, nothing is copied)."""
        return self._by_path.keys()

    def at_path(self, path: str) -> list[Checkpoint]:
        return [self._cps[i] for i in self._by_path.get(path, ())]

    def holds_path(self, path: str, incarnation: str) -> bool:
        """Is `incarnation` the only one known at `path`?"""
        return self._by_path.get(path) == {incarnation}

    def at_key(self, key: Key) -> bool:
        """Does any incarnation live on this inode?"""
        return bool(self._by_key.get(key))

    def index(self, cp: Checkpoint) -> None:
        """Record this checkpoint as its incarnation's latest, unless the one held is newer: the
        object an open source moves is the truth, and a draft's copy of it is never newer."""
        old = self._cps.get(cp.incarnation)
        if old is not None and old is not cp and (old.updated, old.offset, old.finished) >= (cp.updated, cp.offset, cp.finished):
            return
        self._cps[cp.incarnation] = cp
        self._by_key.setdefault((cp.dev, cp.inode), set()).add(cp.incarnation)
        self._by_path.setdefault(cp.path, set()).add(cp.incarnation)
        self._by_root.setdefault(identity.rotation_root(cp.path), set()).add(cp.incarnation)

    def unindex(self, incarnation: str) -> Checkpoint | None:
        cp = self._cps.pop(incarnation, None)
        if cp is None:
            return None
        _drop(self._by_key, (cp.dev, cp.inode), incarnation)
        _drop(self._by_path, cp.path, incarnation)
        _drop(self._by_root, identity.rotation_root(cp.path), incarnation)
        return cp

    def lookup(self, key: Key, head: bytes, size: int | None) -> Checkpoint | None:
        """The known incarnation of the file (dev, inode) whose fingerprint its first bytes carry,
        and that has not read past its size (else it was truncated and is another one now).
        `size` is None for a compressed file (its size is not known before reading it)."""
        best: tuple[tuple[bool, float, int], Checkpoint] | None = None
        for inc in self._by_key.get(key, ()):
            cp = self._cps[inc]
            if size is not None and cp.offset > size:
                continue
            if cp.fp_len == 0:
                # an empty file's fingerprint names nothing: only an open-ended incarnation that read
                # nothing yet may claim its inode (a finished one is some other file's inode now),
                # and never for a compressed file (always a new inode: the number was reused)
                if cp.offset != 0 or cp.finished or size is None:
                    continue
            elif not identity.head_matches(head, cp.fp_len, cp.fp):
                continue
            rank = (not cp.finished, cp.updated, cp.offset)
            if best is None or rank > best[0]:
                best = (rank, cp)
        return None if best is None else best[1]

    def note_links(self, roots: dict[str, str]) -> None:
        """Symbolic links the globs matched: {rotation root of the target: the link's path}. A
        target rotates beside itself (kubelet: `pods/.../0.log.<time>.gz`), while its incarnations
        are known by the link's path: copies there are copies of them (`copy_of`). Kept across
        rescans (a deleted pod's link is gone before its copies are), bounded."""
        if len(self._link_roots) > 4 * len(roots) + 1024:
            self._link_roots = {}
        self._link_roots.update(roots)

    def copy_of(self, path: str, head: bytes, key: Key) -> Checkpoint | None:
        """The known incarnation that this file is a rotated copy of (plain or compressed): its name
        is a rotation of that incarnation's name (or of a symlink's target, `note_links`) and it
        starts with the fingerprinted bytes."""
        root = identity.rotation_root(path)
        if root == path:
            return None
        root = self._link_roots.get(root, root)
        best: tuple[tuple[int, bool, float], Checkpoint] | None = None
        for inc in self._by_root.get(root, ()):
            cp = self._cps[inc]
            if (cp.dev, cp.inode) == key or not identity.head_matches(head, cp.fp_len, cp.fp):
                continue
            rank = (cp.fp_len, not cp.finished, cp.updated)
            if best is None or rank > best[0]:
                best = (rank, cp)
        return None if best is None else best[1]


def _drop(index: dict[K, set[str]], k: K, incarnation: str) -> None:
    s = index.get(k)
    if s is not None:
        s.discard(incarnation)
        if not s:
            del index[k]
