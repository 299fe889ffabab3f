"""What the inotify watcher watches, on real directories with real inotify (SPEC, Trust boundaries;
issue 42): only the directories a glob can match files in, as deep as the glob reaches (a `**`:
8 levels below its fixed part), each once, through no link the input's `symlinks` refuses, at
most `max_watches` of them; and a directory made under a watched one is watched by the rescan's
`watch()` in a worker thread, never walked by the event loop.

The watches are counted by the kernel's own list (/proc/self/fdinfo of the inotify fd: one
`inotify wd:` line per watch), and the watcher's directories checked against the scanner's own
matching of each glob's directory prefixes (scan.py, the rescan's truth)."""

from __future__ import annotations

import asyncio
import ctypes
import os
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shipper.config import InputConfig
from shipper.tail import inotify, watch
from shipper.tail.scan import MAX_DEPTH, Scanner
from tests.support.wait import async_wait_until, wait_until

NOBODY = 65534
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root: the trees are made by `nobody`")


def kernel_watches(w: watch.InotifyWatcher) -> int:
    """The watches the kernel holds for the watcher's inotify fd."""
    with open(f"/proc/self/fdinfo/{w._fd}") as f:
        return sum(1 for line in f if line.startswith("inotify wd:"))


def watched(w: watch.InotifyWatcher) -> set[str]:
    return {os.path.normpath(p) for d in w._dirs.values() for p in d.paths}


def as_nobody(script: str, cwd: Path) -> None:
    """Run `script` (bash) in another process as `nobody`, in `cwd`: the attacker making a tree."""
    subprocess.run(["bash", "-ec", script], cwd=cwd, user=NOBODY, group=NOBODY, check=True, timeout=120)


def nobodys_dir(root: Path, name: str = "logs") -> Path:
    d = root / name
    d.mkdir()
    os.chown(d, NOBODY, NOBODY)
    return d


@pytest.fixture
def loop_watcher() -> Iterator[tuple[asyncio.AbstractEventLoop, watch.InotifyWatcher]]:
    """A watcher on a loop that is not running (for tests that drive `watch` and `poll` themselves)."""
    loop = asyncio.new_event_loop()
    w = watch.InotifyWatcher(loop, asyncio.Event(), inotify.init())
    try:
        yield loop, w
    finally:
        loop.close()
        w.stop()


# ---------------------------------------------------------------- against the scanner's matching

DIRS = ["a", "a/b", "a/b/c", "b", "c/b", "c/x", ".h", ".h/b", "a/.h", "a/.h/b",
        "/".join(f"d{i}" for i in range(12)), "a/b/c/d/e/f/g/h/i/j/k"]
GLOBS = ["**/*.log", "*/*.log", "a/**/x.log", "*/b/*.log", "**", ".h/*.log", "a/*/**/*.log", "missing/**/*.log",
         "**/b/*.log", "c/*.log", "*/**/b/*.log", "a/b/*/*/*/*.log", "d0/d1/**/*.log", "a/.h/*.log"]


def _prefixes(root: str, pattern: str) -> set[str]:
    """The directories the scanner matches for each prefix of the glob's directory parts: those a
    file may be matched in, and those on the way to them (the fixed part's, once it exists)."""
    comps = pattern.split("/")
    dir_parts = comps[:-1] + (["**"] if comps[-1] == "**" else [])
    fixed = next((i for i, c in enumerate(dir_parts) if "*" in c), len(dir_parts))
    out: set[str] = set()
    for k in range(fixed, len(dir_parts) + 1):
        sub = "/".join(dir_parts[:k])
        pat = os.path.join(root, sub) + "/" if sub else root + "/"
        sc = Scanner()
        sc.begin()
        out.update(os.path.normpath(p) for p in sc.iglob(pat, "owner"))
        sc.end()
    return out


def _expected(root: str, patterns: list[str]) -> set[str]:
    out: set[str] = set()
    for pattern in patterns:
        fixed = root
        for c in pattern.split("/")[:-1]:
            if "*" in c:
                break
            fixed = os.path.join(fixed, c)
        d = fixed
        while not os.path.isdir(d):
            d = os.path.dirname(d)
        out.add(os.path.normpath(d))              # the fixed part, or its nearest existing parent
        if d == fixed:
            out.update(_prefixes(root, pattern))
    return out


@settings(max_examples=60, deadline=None)
@given(st.sets(st.sampled_from(DIRS), max_size=8), st.lists(st.sampled_from(GLOBS), min_size=1, max_size=3))
def test_the_watched_directories_are_those_the_globs_lead_to(dirs: set[str], patterns: list[str]) -> None:
    """Every directory a glob's directory parts (or a prefix of them) match is watched, and no other:
    a file the scanner matches lies in a watched directory; nothing deeper than a glob reaches is."""
    with tempfile.TemporaryDirectory() as root:
        for d in dirs:
            os.makedirs(os.path.join(root, d), exist_ok=True)
            Path(root, d, "x.log").write_bytes(b"x\n")
        loop = asyncio.new_event_loop()
        w = watch.InotifyWatcher(loop, asyncio.Event(), inotify.init())
        try:
            w.watch([InputConfig(paths=tuple(os.path.join(root, p) for p in patterns))])
            got = watched(w)
            assert got == _expected(root, patterns), patterns
            assert kernel_watches(w) == len(w._dirs) and w.incomplete is None
            sc = Scanner()
            sc.begin()
            for p in patterns:
                for f in sc.iglob(os.path.join(root, p), "owner"):
                    if os.path.isfile(f):
                        assert os.path.dirname(os.path.normpath(f)) in got, (f, p)
            sc.end()
        finally:
            loop.close()
            w.stop()


# ---------------------------------------------------------------- trees another user makes

@needs_root
def test_a_deep_tree_is_watched_to_eight_levels_below_the_fixed_part(open_tmp: Path, loop_watcher: tuple) -> None:
    """`mkdir -p` of 300 levels by `nobody`: the ** glob's base and 8 levels below it are watched
    (9 watches), not 301; a `*/*` glob's 3. On b19ade4..fa8a28f every directory was (os.walk)."""
    _loop, w = loop_watcher
    logs = nobodys_dir(open_tmp)
    as_nobody("for i in $(seq 300); do mkdir l; cd l; done", logs)
    w.watch([InputConfig(paths=(f"{logs}/**/*.log",))])
    assert w.watches == kernel_watches(w) == 1 + MAX_DEPTH
    deepest = max(watched(w), key=len)
    assert deepest == os.path.join(logs, *["l"] * MAX_DEPTH)
    other = nobodys_dir(open_tmp, "other")
    as_nobody("mkdir -p m" + "/m" * 49, other)
    w.watch([InputConfig(paths=(f"{logs}/**/*.log", f"{other}/*/*/app.log"))])
    assert w.watches == kernel_watches(w) == 1 + MAX_DEPTH + 3


@needs_root
def test_a_wide_tree_past_the_bound_is_incomplete_naming_the_directory_and_the_bound(open_tmp: Path) -> None:
    """200 sibling directories by `nobody` under a watcher bounded at 50: 50 watches, `incomplete`
    names a directory and the bound (the reader then reads every open file each round); once they
    are removed, the next watch() watches all there is and is complete again."""
    loop = asyncio.new_event_loop()
    w = watch.InotifyWatcher(loop, asyncio.Event(), inotify.init(), max_watches=50)
    try:
        logs = nobodys_dir(open_tmp)
        as_nobody("mkdir w{0..199}", logs)
        inp = InputConfig(paths=(f"{logs}/**/*.log",))
        w.watch([inp])
        assert w.watches == kernel_watches(w) == 50
        assert w.incomplete is not None and "more than 50 directories" in w.incomplete
        assert w.incomplete.startswith(str(logs) + "/w"), w.incomplete
        as_nobody("rmdir w{10..199}", logs)
        # the removals' IN_IGNORED, read: room again, the next watch() walks again
        def read() -> bool:
            w.poll()
            return w.watches == kernel_watches(w) <= 11

        wait_until(read, "the removals to be read", timeout_s=5)
        assert w.scan_wanted
        w.watch([inp])
        assert w.incomplete is None and w.watches == kernel_watches(w) == 11
    finally:
        loop.close()
        w.stop()


def test_the_default_bound_is_8192_or_a_quarter_of_the_hosts_limit(tmp_path: Path) -> None:
    limit = tmp_path / "max_user_watches"
    limit.write_text("8192\n")
    assert watch.watch_limit(str(limit)) == 2048
    limit.write_text("524288\n")
    assert watch.watch_limit(str(limit)) == watch.MAX_WATCHES == 8192
    assert watch.watch_limit(str(tmp_path / "none")) == 8192


@needs_root
async def test_the_loop_walks_nothing_a_directory_made_is_watched_by_the_next_watch(open_tmp: Path) -> None:
    """A tree of 2,000 directories moved in at once (one event): reading that event the loop adds no
    watch and lists nothing (on fa8a28f it walked the tree and added 2,000 watches right there); the
    next watch() (the rescan's, in a thread) watches what the glob can match in, and a file written
    in the tree is then named."""
    wake = asyncio.Event()
    w = watch.make_watcher(asyncio.get_running_loop(), wake)
    assert isinstance(w, watch.InotifyWatcher)
    logs = nobodys_dir(open_tmp)
    inp = InputConfig(paths=(f"{logs}/*/*/*.log",))
    await asyncio.to_thread(w.watch, [inp])
    try:
        assert w.watches == 1
        spare = nobodys_dir(open_tmp, "spare")
        as_nobody("mkdir -p t/a{0..39}/b{0..49}", spare)
        os.rename(spare / "t", logs / "t")
        await async_wait_until(lambda: w.scan_wanted, "the moved-in tree to ask for a rescan", timeout_s=5)
        w.poll()
        assert w.watches == kernel_watches(w) == 1, "the loop added watches itself"
        await asyncio.to_thread(w.watch, [inp])
        assert w.watches == kernel_watches(w) == 1 + 1 + 40      # logs, t, t/a*: no b* (the glob's depth)
        w.take_modified()
        with open(logs / "t" / "a7" / "app.log", "ab") as f:
            f.write(b"x\n")
        await async_wait_until(lambda: str(logs / "t" / "a7" / "app.log") in w.take_modified(),
                               "a write in the moved-in tree to be named", timeout_s=5)
    finally:
        await asyncio.to_thread(w.stop)


@needs_root
def test_links_to_directories_are_watched_as_symlinks_says(open_tmp: Path) -> None:
    """Under a ** glob: `nobody`'s link into a root-only directory is not entered (`owner`), root's
    link is; `symlinks: false` enters neither, `true` both. Each directory once, by every path."""
    logs = nobodys_dir(open_tmp)
    secret = open_tmp / "root-only"
    (secret / "inner").mkdir(parents=True, mode=0o700)
    mine = open_tmp / "roots"
    mine.mkdir()
    for name, target, owner in (("evil", secret, NOBODY), ("kube", mine, 0)):
        os.symlink(target, logs / name)
        os.lchown(logs / name, owner, owner)
    os.symlink(mine, logs / "kube2")          # the same directory again, by another path
    expect = {"owner": {str(logs), str(logs / "kube"), str(logs / "kube2")}, "none": {str(logs)},
              "all": {str(logs), str(logs / "kube"), str(logs / "kube2"), str(logs / "evil"),
                      str(logs / "evil" / "inner")}}
    for rule, want in expect.items():
        loop = asyncio.new_event_loop()
        w = watch.InotifyWatcher(loop, asyncio.Event(), inotify.init())
        try:
            w.watch([InputConfig(paths=(f"{logs}/**/*.log",), symlinks=rule)])  # type: ignore[arg-type]
            assert watched(w) == want, rule
            assert kernel_watches(w) == len({os.path.realpath(p) for p in want}), rule
        finally:
            loop.close()
            w.stop()


async def test_names_made_and_gone_before_the_rescan_leave_the_watcher_complete(tmp_path: Path) -> None:
    """Files and directories made under a ** glob and removed before the rescan's watch() (a
    short-lived temp file, say) are nothing to watch, and no reason to read every file every round."""
    wake = asyncio.Event()
    w = watch.make_watcher(asyncio.get_running_loop(), wake)
    assert isinstance(w, watch.InotifyWatcher)
    inp = InputConfig(paths=(f"{tmp_path}/**/*.log",))
    await asyncio.to_thread(w.watch, [inp])
    try:
        for i in range(20):
            (tmp_path / f"t{i}.log").write_bytes(b"x\n")
            (tmp_path / f"d{i}").mkdir()
        (tmp_path / "kept").mkdir()
        await async_wait_until(lambda: w.scan_wanted, "the names made to ask for a rescan", timeout_s=5)
        w.poll()
        for i in range(20):
            (tmp_path / f"t{i}.log").unlink()
            (tmp_path / f"d{i}").rmdir()
        await asyncio.to_thread(w.watch, [inp])
        assert w.incomplete is None
        assert watched(w) == {str(tmp_path), str(tmp_path / "kept")} and kernel_watches(w) == 2
    finally:
        await asyncio.to_thread(w.stop)


@needs_root
def test_a_directory_swapped_for_a_link_meanwhile_is_never_watched_through_it(open_tmp: Path) -> None:
    """While `nobody` swaps a directory under the glob with a link of theirs into a root-only
    directory (RENAME_EXCHANGE, again and again), walk after walk never watches the root-only
    directory: what is watched is what was opened without following a link, never a path looked
    at before (the kernel's fdinfo lists each watch's inode)."""
    logs = nobodys_dir(open_tmp)
    secret = open_tmp / "root-only"
    secret.mkdir(mode=0o700)
    spare = open_tmp / "spare"
    spare.mkdir()
    (logs / "d").mkdir()
    os.chown(logs / "d", NOBODY, NOBODY)
    os.symlink(secret, spare / "d")
    os.lchown(spare / "d", NOBODY, NOBODY)
    a, b = os.fsencode(logs / "d"), os.fsencode(spare / "d")
    libc = ctypes.CDLL(None, use_errno=True)
    stop = threading.Event()
    swaps = 0

    def swapper() -> None:
        nonlocal swaps
        while not stop.is_set():
            if libc.renameat2(-100, a, -100, b, 2) != 0:       # AT_FDCWD, RENAME_EXCHANGE
                raise OSError(ctypes.get_errno(), "renameat2")
            swaps += 1

    t = threading.Thread(target=swapper, daemon=True)
    t.start()
    secret_ino = f"ino:{os.stat(secret).st_ino:x} "
    try:
        for _ in range(300):
            loop = asyncio.new_event_loop()
            w = watch.InotifyWatcher(loop, asyncio.Event(), inotify.init())
            try:
                w.watch([InputConfig(paths=(f"{logs}/*/*.log",))])
                with open(f"/proc/self/fdinfo/{w._fd}") as f:
                    inos = [line for line in f if line.startswith("inotify wd:")]
                assert not any(secret_ino in line for line in inos), inos
            finally:
                loop.close()
                w.stop()
    finally:
        stop.set()
        t.join()
    assert swaps > 300
