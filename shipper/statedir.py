"""The state dir's own files: made 0700/0600 whatever the umask, opened without following links, read
as data; root's commands on a state dir another user could write act as that user (`as_owner`), so
SQLite's own opens reach nothing that user could not (SPEC, Trust boundaries). Owns no format."""

from __future__ import annotations

import contextlib
import errno
import os
import pwd
import stat
from collections.abc import Iterator

from shipper.errors import ShipperError

DIR_MODE = 0o700
FILE_MODE = 0o600
MARKER = ".shipper-state-dir"        # in a state dir shipper made: shipper-setup may own and purge it
MARKER_TEXT = b"made by shipper; shipper-setup --uninstall --purge removes this directory\n"
# what shipper itself puts in a state dir: a dir holding only these (and a lock or spool) is one
OWN_NAMES = ("lock", "status.json", "status.json.tmp", "spool", "reserve", "dlq.request", "dlq.request.tmp",
             "dlq.request.claimed", "dlq.answer", "dlq.answer.tmp", MARKER)
OWN_PREFIXES = ("spool.damaged-", ".repair-")
_NOFOLLOW = os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
SQLITE_FILES = ("cache.db", "cache.db-wal", "cache.db-shm", "cache.db-journal")


# `/` and the top-level directories of a Linux system: never a state dir (shipper-setup would chown
# it, a repair would rename things in it)
SYSTEM_TOP_DIRS = frozenset({
    "bin", "boot", "dev", "etc", "home", "lib", "lib32", "lib64", "libx32", "media", "mnt", "opt", "proc",
    "root", "run", "sbin", "snap", "srv", "sys", "tmp", "usr", "var",
})


def state_dir_problem(path: str) -> str | None:
    """Why `path` cannot be a state dir (for the config error naming `state_dir`), or None: it
    must be a directory or absent, and neither `/` nor a top-level system directory (as written
    or where its links lead)."""
    for p in dict.fromkeys((os.path.abspath(path), os.path.realpath(path))):
        if p == os.sep:
            return "is the root directory (/): give shipper a directory of its own, such as /var/lib/shipper"
        parent, name = os.path.split(p)
        if parent == os.sep and name in SYSTEM_TOP_DIRS:
            return f"is a system directory ({p}): give shipper a directory of its own, such as /var/lib/shipper"
    if os.path.lexists(path) and not os.path.isdir(path):
        return f"{path} exists and is not a directory"
    return None


class UnsafeStateDir(ShipperError, OSError):
    """A state dir, or a file in it, that shipper does not open: a link, not a regular file, or
    writable by users root cannot act as. An OSError too: where a path is opened, this is one more
    way for the open to fail."""


def make_dir(path: str) -> None:
    """`path` as a directory: created 0700 (whatever the umask) when absent; an existing one is
    kept as it is (its owner's choice). The parents are made as `mkdir -p` makes them."""
    parent = os.path.dirname(os.path.abspath(path))
    os.makedirs(parent, exist_ok=True)
    try:
        os.mkdir(path, DIR_MODE)
        created = True
    except FileExistsError:
        created = False
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC | (os.O_NOFOLLOW if created else 0)
    try:
        fd = os.open(path, flags)
    except NotADirectoryError:
        raise UnsafeStateDir(f"{path} is not a directory") from None
    try:
        if created:
            os.fchmod(fd, DIR_MODE)           # the umask may have taken bits off: exactly 0700
            mark(path)
    finally:
        os.close(fd)


def mark(path: str) -> None:
    """Leave the marker that says shipper made this directory (shipper-setup's --state-dir and
    --purge go by it)."""
    with contextlib.suppress(FileExistsError):
        fd = os.open(os.path.join(path, MARKER), os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW, FILE_MODE)
        try:
            os.write(fd, MARKER_TEXT)
        finally:
            os.close(fd)


def foreign_entries(path: str) -> list[str] | None:
    """None when `path` is a directory shipper made or may take: absent, empty, marked, or holding
    only shipper's own files (a state dir of a version before the marker). Else some of the names
    in it that are not shipper's (a directory like /var/lib, which must never be chowned or purged)."""
    try:
        names = os.listdir(path)
    except FileNotFoundError:
        return None
    if not names or MARKER in names:
        return None
    foreign = [n for n in names if n not in OWN_NAMES and not n.startswith(OWN_PREFIXES)]
    if not foreign and ("lock" in names or "spool" in names):
        return None
    return sorted(foreign)[:5] or sorted(names)[:5]


def make_subdir(path: str) -> None:
    """A directory inside the state dir (spool/): created 0700, and never a link."""
    try:
        os.mkdir(path, DIR_MODE)
        created = True
    except FileExistsError:
        created = False
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENOTDIR):
            raise UnsafeStateDir(f"{path} is a symbolic link or not a directory: not followed") from None
        raise
    try:
        if created:
            os.fchmod(fd, DIR_MODE)
    finally:
        os.close(fd)


def _judge(fd: int, path: str) -> os.stat_result:
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise UnsafeStateDir(f"{path} is not a regular file: not used")
    return st


def open_file(path: str, flags: int) -> int:
    """Open (or, with O_CREAT, create 0600) a file of the state dir: never through a symbolic
    link, never blocking on a FIFO, and only a regular file. A file of ours with wider modes (an
    older version, another umask) is narrowed to 0600. Raises UnsafeStateDir or OSError."""
    try:
        fd = os.open(path, flags | _NOFOLLOW, FILE_MODE)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise UnsafeStateDir(f"{path} is a symbolic link: not followed") from None
        raise
    st = _judge(fd, path)
    if st.st_uid == os.geteuid() and stat.S_IMODE(st.st_mode) != FILE_MODE and flags & (os.O_WRONLY | os.O_RDWR):
        os.fchmod(fd, FILE_MODE)
    return fd


def read_file(path: str, max_bytes: int) -> bytes | None:
    """A small file of the state dir (status.json, a dlq request or answer), read as data: None
    when it is not there. Raises UnsafeStateDir for a link or a file that is not regular."""
    try:
        fd = open_file(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        chunks = []
        left = max_bytes
        while left > 0:
            b = os.read(fd, min(left, 1 << 20))
            if not b:
                break
            chunks.append(b)
            left -= len(b)
        return b"".join(chunks)
    finally:
        os.close(fd)


def write_atomically(path: str, data: bytes) -> None:
    """Replace `path` with `data`: written to `path`.tmp, made anew (whatever was there, a link
    included, is unlinked first; O_EXCL, 0600: nothing planted under that name is written through),
    then renamed over `path`."""
    tmp = path + ".tmp"
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, FILE_MODE)
    try:
        try:
            os.fchmod(fd, FILE_MODE)
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def private_sqlite_files(spool_dir: str) -> None:
    """SQLite makes its files with 0644 less the umask; the spool's are narrowed to 0600 (the -wal
    and -shm files SQLite makes later copy the database file's mode). By path, never by opening
    them: closing any descriptor of a file drops every POSIX lock this process holds on it, SQLite's
    included, and another process would then take the -shm for its own and truncate it under our
    mapping (SIGBUS). The spool dir is the daemon's own (0700), so nobody swaps a name between the
    look and the chmod."""
    for name in SQLITE_FILES:
        path = os.path.join(spool_dir, name)
        try:
            st = os.lstat(path)
            if stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid() and stat.S_IMODE(st.st_mode) != FILE_MODE:
                os.chmod(path, FILE_MODE)
        except OSError:
            continue


def refuse_links(state_dir: str) -> None:
    """Raise UnsafeStateDir when the spool dir or a SQLite file in it is a symbolic link (or the
    database not a regular file): SQLite would follow it. Under `as_owner` a link swapped in after
    this look reaches only what the owner can."""
    spool = os.path.join(state_dir, "spool")
    for path in (spool, *(os.path.join(spool, n) for n in SQLITE_FILES)):
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            continue
        if stat.S_ISLNK(st.st_mode):
            raise UnsafeStateDir(f"{path} is a symbolic link: not followed")
        if path != spool and not stat.S_ISREG(st.st_mode):
            raise UnsafeStateDir(f"{path} is not a regular file: not used")


# ---------------------------------------------------------------- root on another user's state dir

def _chain(path: str) -> list[str]:
    """Every directory and link a lookup of `path` passes: its components as written, and those of
    the path the links lead to."""
    out: list[str] = []
    for p in (os.path.abspath(path), os.path.realpath(path)):
        parts = p.split(os.sep)
        for i in range(1, len(parts) + 1):
            c = os.sep.join(parts[:i]) or os.sep
            if c not in out:
                out.append(c)
    return out


def owner_of(state_dir: str) -> tuple[int, int] | None:
    """Whom a root command acts as on `state_dir`: None when only root can change anything on the
    way to it and in it; else (uid, gid) of the one other user who can. Raises UnsafeStateDir when
    a directory on the way is writable by a group or by everyone (and not sticky), or when two
    users other than root own parts of it: no one user bounds what they could plant."""
    owners: set[int] = set()
    for c in _chain(state_dir):
        try:
            st = os.lstat(c)
        except FileNotFoundError:
            break
        if st.st_uid != 0:
            owners.add(st.st_uid)
        if stat.S_ISDIR(st.st_mode) and st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
            raise UnsafeStateDir(f"{c} is writable by users other than its owner (mode "
                                 f"{stat.S_IMODE(st.st_mode):04o}): the state dir is not read as root there; "
                                 "run the command as the state dir's owner")
    if not owners:
        return None
    if len(owners) > 1:
        raise UnsafeStateDir(f"{state_dir} and the directories above it belong to several users "
                             f"({', '.join(str(u) for u in sorted(owners))}): not read as root; "
                             "run the command as the state dir's owner")
    uid = owners.pop()
    try:
        gid = pwd.getpwuid(uid).pw_gid
    except KeyError:
        gid = os.lstat(os.path.realpath(state_dir)).st_gid if os.path.lexists(state_dir) else uid
    return uid, gid


@contextlib.contextmanager
def as_owner(state_dir: str) -> Iterator[None]:
    """Run the block with the effective uid and gid of the state dir's owner when root runs it on a
    state dir another user owns (`owner_of`), so no link or file that user planted gives them
    more than they have; root again after. A link where SQLite's files are is refused first
    (`refuse_links`). The real uid stays root, so that user cannot signal
    or trace the process meanwhile. Not for the daemon (its state dir is its own)."""
    if os.geteuid() != 0:
        yield
        return
    who = owner_of(state_dir)
    if who is None:
        refuse_links(state_dir)
        yield
        return
    uid, gid = who
    groups, egid = os.getgroups(), os.getegid()
    os.setgroups([gid])
    os.setegid(gid)
    os.seteuid(uid)
    try:
        refuse_links(state_dir)
        yield
    except PermissionError as e:
        raise UnsafeStateDir(f"acting as the owner of {state_dir} (uid {uid}): {e}") from e
    finally:
        os.seteuid(0)
        os.setegid(egid)
        os.setgroups(groups)
