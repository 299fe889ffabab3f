"""The one file-opening policy (SPEC, Trust boundaries): every log file shipper reads is opened here,
never looked at first: opened non-blocking, walked one component at a time below the directory the
admin named, then the descriptor is judged. Returns fds or refusals; decides nothing else."""

from __future__ import annotations

import ctypes
import errno
import os
import stat as stat_mod
import sys
from dataclasses import dataclass
from typing import Any

from shipper.config import Symlinks

RULE_TEXT = {"owner": "symlinks: owner", "all": "symlinks: true", "none": "symlinks: false"}

MAX_LINK_HOPS = 40                               # as the kernel's own limit on nested links (ELOOP)
O_PATH = getattr(os, "O_PATH", 0)                # Linux only: 0 elsewhere
_DIR_FLAGS = (O_PATH or os.O_RDONLY) | os.O_DIRECTORY | os.O_CLOEXEC
_LINK_FLAGS = O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC
# O_NONBLOCK: a FIFO opened for reading does not wait for a writer; regular files ignore the flag
_READ_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOFOLLOW
_NOATIME = getattr(os, "O_NOATIME", 0)
_IS_LINK_ERRNOS = (errno.ELOOP, errno.EMLINK)    # O_NOFOLLOW met a link (Linux: ELOOP, FreeBSD: EMLINK)

# statfs(2) magics of the kernel's own filesystems, wherever they are mounted: never log files
_PSEUDO_MAGIC = frozenset({
    0x9FA0,        # proc
    0x62656572,    # sysfs
    0x1CD1,        # devpts
    0x64626720,    # debugfs
    0x74726163,    # tracefs
    0x73636673,    # securityfs
    0x27E0EB,      # cgroup
    0x63677270,    # cgroup2
    0x62656570,    # configfs
    0xCAFE4A11,    # bpf
    0x6165676C,    # pstore
    0xDE5E81E4,    # efivarfs
    0xF97CFF8C,    # selinuxfs
    0x43415D53,    # smackfs
    0x42494E4D,    # binfmt_misc
    0x65735543,    # fusectl
    0x19800202,    # mqueue
    0x6E736673,    # nsfs
})
_PSEUDO_TYPES = frozenset({"proc", "sysfs", "devtmpfs", "devpts", "debugfs", "tracefs", "securityfs", "cgroup",
                           "cgroup2", "configfs", "bpf", "pstore", "efivarfs", "selinuxfs", "smackfs",
                           "binfmt_misc", "fusectl", "mqueue", "nsfs", "hugetlbfs"})
_PSEUDO_ROOTS = ("/proc", "/sys", "/dev")


@dataclass(frozen=True, slots=True)
class Rule:
    """How one path may be opened. `base`: a directory above it that the admin named (a glob's
    fixed part): the links in it are followed as they are; every link below it is judged by
    `symlinks`. `copy`: a file no glob matches (a rotated copy found by content): the file itself
    may not be a link, and it must be owned by `owner` (the owner of the file it is a copy of,
    when known) or by root."""

    symlinks: Symlinks = "owner"
    base: str = "/"
    copy: bool = False
    owner: int | None = None


@dataclass(frozen=True, slots=True)
class Refused:
    """A path shipper will not read, and why (a fixed phrase); `link` is the symbolic link not
    followed when a link is the reason, `rule` the rule that says so."""

    path: str
    reason: str
    link: str | None = None
    rule: str = ""


def glob_rule(path: str, bases: list[str], symlinks: Symlinks) -> Rule:
    """The rule of a file a glob matched: its input's `symlinks` below the longest of the globs'
    fixed parts (`bases`, longest first) that holds it."""
    return Rule(symlinks, next((b for b in bases if is_under(path, b)), "/"))


def copy_rule(path: str, owner: int | None, symlinks: Symlinks = "none") -> Rule:
    """The rule of a rotated copy beside `path`'s directory (no links at all by default)."""
    return Rule(symlinks, os.path.dirname(path) or "/", True, owner)


def is_under(path: str, base: str) -> bool:
    return base == "/" or path == base or path.startswith(base + "/")


def open_log(path: str, rule: Rule) -> tuple[int, os.stat_result] | Refused | None:
    """Open `path` for reading under `rule` and judge what was opened: (fd, its fstat) when it may
    be read (the caller owns the fd); `Refused` when it may not; None when nothing is there or it
    cannot be opened now (vanished, permission denied, a loop of links)."""
    base = os.path.normpath(rule.base) if rule.base else "/"
    if not path.startswith("/") or not is_under(path, base):
        base = "/"
    walk = _Walk(path, rule)
    try:
        return walk.run(base)
    except OSError:
        return None
    finally:
        walk.close()


def reopen(path: str, key: tuple[int, int]) -> int | None:
    """An fd of the known file (dev, inode) `key` at `path`, or None when something else is there
    now. For comparing bytes of a file already judged (its identity is the judgment)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if (st.st_dev, st.st_ino) == key and stat_mod.S_ISREG(st.st_mode):
            fd, out = -1, fd
            return out
        return None
    except OSError:
        return None
    finally:
        if fd >= 0:
            os.close(fd)


def open_directory(path: str) -> int | Refused | None:
    """An fd (O_RDONLY, no O_PATH: a child process may list it) of the directory at `path`, judged:
    a directory, not on /proc, /sys or /dev. The path is the admin's: its links are followed."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat_mod.S_ISDIR(st.st_mode):
            return Refused(path, "not a directory")
        if is_pseudo(st.st_dev) or _magic(fd) in _PSEUDO_MAGIC:
            return Refused(path, "on /proc, /sys or /dev")
        fd, out = -1, fd
        return out
    except OSError:
        return None
    finally:
        if fd >= 0:
            os.close(fd)


def judge_stat(path: str, lst: os.stat_result, st: os.stat_result, symlinks: Symlinks) -> Refused | None:
    """The scan's cheap look at a matched path (its lstat, and its stat when it is a link): why it
    will not be read, or None. Not the judgment (that is `open_log`'s, on what it opened): it keeps
    files that would be refused from being queued for opening at every rescan. A link to a
    directory is not judged here (the `**` walk's); a FIFO, socket or device (or a link to one) is
    never read, and said so."""
    if stat_mod.S_ISLNK(lst.st_mode) and stat_mod.S_ISREG(st.st_mode):
        if symlinks == "none":
            return Refused(path, "a symbolic link", path, RULE_TEXT["none"])
        if symlinks == "owner" and lst.st_uid != 0 and lst.st_uid != st.st_uid:
            return owner_refusal(path, path, lst.st_uid, st.st_uid)
    if stat_mod.S_ISREG(st.st_mode) and is_pseudo(st.st_dev):
        return Refused(path, "on /proc, /sys or /dev")
    kind = _NOT_FILES.get(stat_mod.S_IFMT(st.st_mode))
    if kind is not None:
        return Refused(path, f"not a regular file ({kind})")      # never opened; said once why
    return None


# What a glob may match that is never read (a directory is the `**` walk's, and is not said)
_NOT_FILES = {stat_mod.S_IFIFO: "a FIFO", stat_mod.S_IFSOCK: "a socket", stat_mod.S_IFCHR: "a character device",
              stat_mod.S_IFBLK: "a block device"}


def follows_dir_link(link_uid: int, target_uid: int, symlinks: Symlinks) -> bool:
    """May a `**` walk descend through a link (owned by `link_uid`) to a directory of `target_uid`?"""
    return symlinks == "all" or (symlinks == "owner" and link_uid in (0, target_uid))


def owner_refusal(path: str, link: str, link_uid: int, target_uid: int) -> Refused:
    return Refused(path, f"a symbolic link owned by uid {link_uid}, its target by uid {target_uid}", link,
                   RULE_TEXT["owner"])


@dataclass(frozen=True, slots=True)
class _Link:
    """On the walk's stack after a link's target: when popped, the target is resolved and judged."""

    path: str
    uid: int


class _Walk:
    """One `open_log`: a directory fd moved down the path one component at a time (O_PATH,
    O_NOFOLLOW), so every link below the base is seen, read from the link itself (its own fd) and
    judged against the inode it resolved to. Owns its fds until `run` hands the file's over."""

    def __init__(self, path: str, rule: Rule) -> None:
        self.path = path
        self.rule = rule
        self.cur = -1        # the directory reached so far
        self.fd = -1         # the file, once opened
        self.lfd = -1        # a link being read

    def close(self) -> None:
        for fd in (self.cur, self.fd, self.lfd):
            if fd >= 0:
                os.close(fd)
        self.cur = self.fd = self.lfd = -1

    def _cd(self, fd: int) -> None:
        if self.cur >= 0:
            os.close(self.cur)
        self.cur = fd

    def run(self, base: str) -> tuple[int, os.stat_result] | Refused | None:
        rule = self.rule
        self._cd(os.open(base, _DIR_FLAGS))
        where = base
        stack: list[str | _Link] = [c for c in reversed(self.path[len(base):].split("/")) if c and c != "."]
        names = len(stack)
        hops = 0
        st: os.stat_result | None = None
        while stack:
            item = stack.pop()
            if isinstance(item, _Link):
                target = st if st is not None else os.fstat(self.cur)
                if rule.symlinks == "owner" and item.uid != 0 and item.uid != target.st_uid:
                    return owner_refusal(self.path, item.path, item.uid, target.st_uid)
                continue
            names -= 1
            if item == "..":
                self._cd(os.open("..", _DIR_FLAGS, dir_fd=self.cur))
                where = os.path.dirname(where) or "/"
                continue
            link = os.path.join(where, item)
            if names == 0:
                try:
                    self.fd = _open_file(item, self.cur)
                except OSError as e:
                    if e.errno not in _IS_LINK_ERRNOS:
                        raise
                else:
                    st = os.fstat(self.fd)
                    continue
                if rule.copy:
                    return Refused(self.path, "a rotated copy that is a symbolic link", link, "rotated copies")
                if O_PATH:
                    self.lfd = os.open(item, _LINK_FLAGS, dir_fd=self.cur)
            else:
                if O_PATH:
                    nfd = os.open(item, _LINK_FLAGS, dir_fd=self.cur)
                    nst = os.fstat(nfd)
                else:                            # no O_PATH (not Linux): a look, then the open
                    nst = os.stat(item, dir_fd=self.cur, follow_symlinks=False)
                    nfd = os.open(item, _DIR_FLAGS | os.O_NOFOLLOW, dir_fd=self.cur) if stat_mod.S_ISDIR(nst.st_mode) else -1
                if stat_mod.S_ISDIR(nst.st_mode):
                    self._cd(nfd)
                    where = link
                    continue
                if nfd >= 0:
                    self.lfd = nfd
                if not stat_mod.S_ISLNK(nst.st_mode):
                    return None                  # not a directory: nothing is there
            if rule.symlinks == "none":
                return Refused(self.path, "a symbolic link", link, RULE_TEXT["none"])
            hops += 1
            if hops > MAX_LINK_HOPS:
                return None
            uid, dest = self._read_link(item)
            stack.append(_Link(link, uid))
            parts = [c for c in dest.split("/") if c and c != "."]
            stack.extend(reversed(parts))
            names += len(parts)
            if dest.startswith("/"):
                self._cd(os.open("/", _DIR_FLAGS))
                where = "/"
        if st is None:
            return None                          # the path ends at a directory
        why = self._judge(st)
        if why is not None:
            return why
        fd, self.fd = self.fd, -1
        return fd, st

    def _read_link(self, name: str) -> tuple[int, str]:
        """The owner and the target of the link `name` in the current directory: both read from
        the link's own fd (O_PATH) where there is one, so a link swapped meanwhile cannot pair one
        link's owner with another's target."""
        lfd, self.lfd = self.lfd, -1
        if lfd < 0:
            return os.stat(name, dir_fd=self.cur, follow_symlinks=False).st_uid, os.readlink(name, dir_fd=self.cur)
        try:
            return os.fstat(lfd).st_uid, os.readlink("", dir_fd=lfd)
        finally:
            os.close(lfd)

    def _judge(self, st: os.stat_result) -> Refused | None:
        rule = self.rule
        if not stat_mod.S_ISREG(st.st_mode):
            return Refused(self.path, "not a regular file")
        if is_pseudo(st.st_dev) or _magic(self.fd) in _PSEUDO_MAGIC:
            return Refused(self.path, "on /proc, /sys or /dev")
        if rule.copy and rule.owner is not None and st.st_uid not in (0, rule.owner):
            return Refused(self.path, f"a rotated copy owned by uid {st.st_uid}, not by the owner of the file it "
                                      f"copies (uid {rule.owner}) or root", None, "rotated copies")
        return None


def _open_file(name: str, dir_fd: int) -> int:
    """open(2) of a file for reading, not through a link; O_NOATIME where we may (owner or CAP_FOWNER)."""
    if _NOATIME:
        try:
            return os.open(name, _READ_FLAGS | _NOATIME, dir_fd=dir_fd)
        except PermissionError as e:
            if e.errno != errno.EPERM:
                raise
    return os.open(name, _READ_FLAGS, dir_fd=dir_fd)


# ---------------------------------------------------------------- the kernel's own filesystems

_libc: Any = None
_pseudo_devs: frozenset[int] | None = None


def _magic(fd: int) -> int:
    """fstatfs(2)'s f_type of an fd (0 where it cannot be asked: not Linux)."""
    global _libc
    if not sys.platform.startswith("linux"):
        return 0
    if _libc is None:
        lib = ctypes.CDLL(None, use_errno=True)
        lib.fstatfs.argtypes = [ctypes.c_int, ctypes.c_void_p]
        _libc = lib
    buf = ctypes.create_string_buffer(256)         # struct statfs: f_type (a long) comes first
    if _libc.fstatfs(fd, buf) != 0:
        return 0
    return int(ctypes.c_ulong.from_buffer(buf).value) & 0xFFFFFFFF


def is_pseudo(dev: int) -> bool:
    """Is `dev` (a st_dev) one of the mounts at or under /proc, /sys, /dev, or of the kernel's own
    filesystems? (Read from /proc/self/mountinfo once, then at each `refresh_mounts`.)"""
    devs = _pseudo_devs
    if devs is None:
        devs = refresh_mounts()
    return dev in devs


def refresh_mounts() -> frozenset[int]:
    """Read the mount table again (a mount may come after the start): the rescan calls this."""
    global _pseudo_devs
    devs: set[int] = set()
    try:
        with open("/proc/self/mountinfo", "rb") as f:
            table = f.read(4 * 1024 * 1024)
    except OSError:
        table = b""
    for line in table.splitlines():
        fields = line.split(b" ")
        try:
            sep = fields.index(b"-", 6)
            major, minor = fields[2].split(b":")
            point = fields[4].decode("unicode_escape", "replace") if b"\\" in fields[4] else fields[4].decode()
            fstype = fields[sep + 1].decode()
        except (ValueError, IndexError, UnicodeDecodeError):
            continue
        if fstype in _PSEUDO_TYPES or any(point == r or point.startswith(r + "/") for r in _PSEUDO_ROOTS):
            devs.add(os.makedev(int(major), int(minor)))
    if not table:
        for root in _PSEUDO_ROOTS:
            try:
                devs.add(os.stat(root).st_dev)
            except OSError:
                pass
    _pseudo_devs = frozenset(devs)
    return _pseudo_devs
