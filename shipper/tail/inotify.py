"""inotify(7) through libc's own calls (no thread of its own: the event loop polls the fd): the
instance, watches added and removed, the event format. No policy: tail/watch.py decides what to
watch and what an event means."""

from __future__ import annotations

import ctypes
import errno
import os
import struct
import sys

IN_MODIFY, IN_ATTRIB, IN_MOVED_FROM, IN_MOVED_TO, IN_CREATE, IN_DELETE = 0x2, 0x4, 0x40, 0x80, 0x100, 0x200
IN_MOVE_SELF, IN_Q_OVERFLOW, IN_IGNORED, IN_ONLYDIR, IN_ISDIR = 0x800, 0x4000, 0x8000, 0x01000000, 0x40000000
IN_NONBLOCK, IN_CLOEXEC = os.O_NONBLOCK, os.O_CLOEXEC
NAMED = IN_MODIFY | IN_ATTRIB | IN_MOVED_FROM | IN_DELETE     # events that name a file to look at
WATCH_MASK = NAMED | IN_MOVED_TO | IN_CREATE | IN_MOVE_SELF | IN_ONLYDIR
EVENT = struct.Struct("iIII")       # wd, mask, cookie, len (then len bytes of NUL-padded name)
EVENT_HEAD = EVENT.size
READ_BYTES = 64 * 1024
_libc: ctypes.CDLL | None = None


def init() -> int:
    """A new inotify instance (non-blocking, close-on-exec): its fd. OSError where there is none."""
    global _libc
    if _libc is None:
        if not sys.platform.startswith("linux"):
            raise OSError(errno.ENOSYS, "inotify is Linux only")
        lib = ctypes.CDLL(None, use_errno=True)
        if not hasattr(lib, "inotify_init1"):
            raise OSError(errno.ENOSYS, "no inotify in libc")
        lib.inotify_init1.argtypes = [ctypes.c_int]
        lib.inotify_add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
        lib.inotify_rm_watch.argtypes = [ctypes.c_int, ctypes.c_int]
        _libc = lib
    fd = _libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
    if fd < 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))
    return int(fd)


def rm_watch(fd: int, wd: int) -> None:
    assert _libc is not None             # set by init, before any watch
    _libc.inotify_rm_watch(fd, wd)     # EINVAL when the kernel removed it already: nothing to do


def add_watch(fd: int, path: str) -> int:
    assert _libc is not None
    wd = _libc.inotify_add_watch(fd, os.fsencode(path), WATCH_MASK)
    if wd < 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e), path)
    return int(wd)
