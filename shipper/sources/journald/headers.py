"""The journal files a journalctl child reads, and what their headers say (systemd's JOURNAL_FILE_FORMAT:
the sequence-number id, the entry count, the newest entry's seqnum): a pread of each header, no mmap,
nothing parsed beyond it. Blocking (a directory listing, opens): run off the loop. quiet.py decides."""

from __future__ import annotations

import os
import stat as stat_mod
import struct
from dataclasses import dataclass

from shipper.tail import opening

# journalctl with no --directory (systemd 252, sd_journal_open without SD_JOURNAL_LOCAL_ONLY, as
# --merge asks): these roots, each with its files and its machine-id-named subdirectories' files
SYSTEM_ROOTS = ("/run/log/journal", "/var/log/journal", "/var/log/journal/remote")
SIGNATURE = b"LPKSHHRH"
STATE_ARCHIVED = 2                # offline for good: renamed by rotation, never written again
# state, seqnum_id, n_entries, tail_entry_seqnum: in every header since the format began
_FIELDS = struct.Struct("<16x B 55x 16s 64x QQ")


@dataclass(frozen=True, slots=True)
class FileMark:
    """One journal file as far as new entries go: a file with more entries, or a newer last one,
    has changed. `seqnum_id` names the sequence its seqnums count in (`s=` of a cursor)."""

    seqnum_id: str
    n_entries: int
    tail_seqnum: int
    is_archived: bool = False


Marks = dict[tuple[str, int], FileMark]       # (path, inode) -> its mark


def read_mark(fd: int) -> FileMark | None:
    """The mark of the journal file open at `fd`; None when it is not one (yet): too short, or no
    signature (journald writes the header before the file is linked in, journal-remote just after)."""
    head = os.pread(fd, _FIELDS.size, 0)
    if len(head) < _FIELDS.size or head[:8] != SIGNATURE:
        return None
    state, sid, n, tail = _FIELDS.unpack(head)
    return FileMark(sid.hex(), n, tail, state == STATE_ARCHIVED)


def _is_id(name: str) -> bool:
    return len(name) == 32 and all(c in "0123456789abcdef" for c in name)


class JournalFiles:
    """The journal files of one journald input (`directory`, or the system's), looked at on demand.
    An archived file's mark is kept by its inode and not read again."""

    def __init__(self, directory: str | None) -> None:
        self.roots = (directory,) if directory is not None else SYSTEM_ROOTS
        self._archived: Marks = {}

    def marks(self) -> Marks:
        """Every journal file's mark now. A root or file that cannot be opened is left out (journalctl
        cannot read it either); so is one that is not a regular file."""
        out: Marks = {}
        for root in self.roots:
            fd = opening.open_directory(root)
            if not isinstance(fd, int):
                continue
            try:
                self._look(root, fd, out, nested=True)
            finally:
                os.close(fd)
        self._archived = {k: m for k, m in out.items() if m.is_archived}
        return out

    def _look(self, path: str, dir_fd: int, out: Marks, nested: bool) -> None:
        try:
            listing = list(os.scandir(dir_fd))
        except OSError:
            return
        for e in listing:
            name = e.name
            if name.endswith(".journal") and e.is_file(follow_symlinks=False):
                key = (f"{path}/{name}", e.inode())
                known = self._archived.get(key)
                mark = known if known is not None else _mark_at(name, dir_fd)
                if mark is not None:
                    out[key] = mark
            elif nested and _is_id(name):
                try:
                    sub = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
                except OSError:
                    continue
                try:
                    self._look(f"{path}/{name}", sub, out, nested=False)
                finally:
                    os.close(sub)


def _mark_at(name: str, dir_fd: int) -> FileMark | None:
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_NOCTTY | os.O_CLOEXEC,
                     dir_fd=dir_fd)
    except OSError:
        return None
    try:
        if not stat_mod.S_ISREG(os.fstat(fd).st_mode):
            return None
        return read_mark(fd)
    except OSError:
        return None
    finally:
        os.close(fd)
