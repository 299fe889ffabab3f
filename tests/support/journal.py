"""Real systemd journal files for tests, written by systemd-journal-remote from the export format.

`systemd-journal-remote -o DIR/NAME.journal -` reads journal export text on stdin and appends
the entries to that file (creating it), and `journalctl -D DIR` reads them. What the helper does:
  append:   one journal-remote run per call; entries get strictly increasing realtime (never
            below the wall clock) and monotonic timestamps, a boot id, host, unit, PID, PRIORITY
  rotate:   as journald does it: the file is archived (`NAME@<seqnum id>-<head seqnum>-<head
            realtime>.journal`) and a new NAME.journal continues the same sequence numbers. No
            tool asks journal-remote to rotate, but it rotates before a write when the file's
            field hash table is over 75% full (journal_file_rotate_suggested); an entry with
            `ROTATE_PAD_FIELDS` distinct field names fills it. `append(..., then_rotate=True)`
            puts those fields on the batch's last entry (no extra entry; journalctl
            --output-fields hides them), `rotate()` writes one marker entry carrying them.
  new_file: later appends go to another file: a new sequence-number id, seqnums from 1
  vacuum:   deletes the oldest archived file, as journald's vacuum does
  new_boot: a new _BOOT_ID (monotonic time restarts), as after a reboot
  append_caught: a run whose last entry a `journalctl --follow` with a match looks at in the middle
            of its write: the entry counted in the file, not yet listed under its fields. systemd's
            reader then never prints it (until another entry lands in that file): issue 41
Binary values (bytes that are not UTF-8, or with a newline or control character) use the
export format's binary form: NAME, newline, little-endian 64-bit length, the bytes, newline.
Each run's entries are reported to the test's promptness timeline (by the pino `seq` in MESSAGE)
once journal-remote has written them. journal-remote (systemd 252) silently drops an entry without __REALTIME_TIMESTAMP when the stream
gave none before it, and after one gives it the previous entry's time: every entry gets its own.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import struct
import subprocess
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.support import promptness
from tests.support.wait import wait_until

REMOTE_CANDIDATES = ("/lib/systemd/systemd-journal-remote", "/usr/lib/systemd/systemd-journal-remote")
JOURNALCTL = "journalctl"
ROTATE_PAD_FIELDS = 300        # the field hash table holds 333; rotation is suggested past 75%
ROTATE_MARKER = "-- shipper test: journal rotated --"

Value = str | bytes | int


def journal_remote() -> str | None:
    """The systemd-journal-remote binary, or None when it is not installed."""
    for c in REMOTE_CANDIDATES:
        if os.access(c, os.X_OK):
            return c
    return shutil.which("systemd-journal-remote")


def export_field(name: str, value: Value) -> bytes:
    """One field in the journal export format: text form, or binary form when needed."""
    if isinstance(value, int):
        value = str(value)
    data = value.encode("utf-8") if isinstance(value, str) else value
    is_text = b"\n" not in data
    if is_text:
        try:
            data.decode("utf-8")
        except UnicodeDecodeError:
            is_text = False
    if is_text:
        return name.encode() + b"=" + data + b"\n"
    return name.encode() + b"\n" + struct.pack("<Q", len(data)) + data + b"\n"


def export_entry(fields: Iterable[tuple[str, Value]]) -> bytes:
    return b"".join(export_field(k, v) for k, v in fields) + b"\n"


@dataclass
class Written:
    """An entry as the helper wrote it: its fields (MESSAGE as given) and where it went."""

    message: Value
    fields: dict[str, Value]
    file: str
    realtime_us: int
    boot_id: str
    is_marker: bool = False


@dataclass
class Journal:
    """A directory of journal files. `hostname`, `unit`, `pid` are defaults for entries."""

    directory: Path
    name: str = "system"
    hostname: str = "testhost"
    unit: str | None = "app.service"
    pid: int | None = 4242
    boot_id: str = field(default_factory=lambda: secrets.token_hex(16))
    written: list[Written] = field(default_factory=list)
    _realtime_us: int = 0
    _monotonic_us: int = 1_000_000

    def __post_init__(self) -> None:
        self.directory = Path(self.directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        remote = journal_remote()
        if remote is None:
            raise RuntimeError("systemd-journal-remote is not installed (apt-get install systemd-journal-remote)")
        self.remote = remote

    # ------------------------------------------------------------ entries

    @property
    def path(self) -> Path:
        """The active file appends go to."""
        return self.directory / f"{self.name}.journal"

    def entry(self, message: Value, *, unit: str | None = "", pid: int | None = -1, priority: int | None = 6,
              hostname: str | None = "", identifier: str | None = None,
              fields: Mapping[str, Value] | None = None, realtime_us: int | None = None) -> list[tuple[str, Value]]:
        """The fields of one entry (defaults from the Journal; None leaves a field out)."""
        unit = self.unit if unit == "" else unit
        pid = self.pid if pid == -1 else pid
        hostname = self.hostname if hostname == "" else hostname
        out: list[tuple[str, Value]] = []
        if realtime_us is not None:
            out.append(("__REALTIME_TIMESTAMP", realtime_us))
        if hostname is not None:
            out.append(("_HOSTNAME", hostname))
        if unit is not None:
            out.append(("_SYSTEMD_UNIT", unit))
        if pid is not None:
            out.append(("_PID", pid))
        if priority is not None:
            out.append(("PRIORITY", priority))
        if identifier is not None:
            out.append(("SYSLOG_IDENTIFIER", identifier))
        out.append(("MESSAGE", message))
        for k, v in (fields or {}).items():
            out.append((k, v))
        return out

    def append(self, *entries: Value | list[tuple[str, Value]], then_rotate: bool = False) -> list[Written]:
        """Write entries (a message, or the fields `entry()` made) in one journal-remote run.
        `then_rotate`: the next append starts a new file, journald-style (see the module doc)."""
        batch = [self.entry(e) if isinstance(e, (str, bytes, int)) else e for e in entries]
        if then_rotate:
            if not batch:
                raise ValueError("then_rotate needs at least one entry; use rotate()")
            batch[-1] = batch[-1] + _pad_fields()
        return self._write(batch, marker=False)

    def rotate(self) -> Written:
        """Write a marker entry that makes the next append start a new file (journald-style)."""
        return self._write([self.entry(ROTATE_MARKER, unit=None, pid=None) + _pad_fields()], marker=True)[0]

    def _stamp(self, e: list[tuple[str, Value]]) -> list[tuple[str, Value]]:
        """Timestamps and boot id at writing time, in writing order (an entry made earlier with
        `entry()` and written later is still later in the journal)."""
        names = {k for k, _ in e}
        head: list[tuple[str, Value]] = []
        if "__REALTIME_TIMESTAMP" not in names:
            rt = max(self._realtime_us + 1, int(time.time() * 1e6))
            self._realtime_us = rt
            head.append(("__REALTIME_TIMESTAMP", rt))
        if "__MONOTONIC_TIMESTAMP" not in names:
            self._monotonic_us += 1000
            head.append(("__MONOTONIC_TIMESTAMP", self._monotonic_us))
        if "_BOOT_ID" not in names:
            head.append(("_BOOT_ID", self.boot_id))
        return head + e

    def _write(self, batch: list[list[tuple[str, Value]]], marker: bool) -> list[Written]:
        if not batch:
            return []
        batch = [self._stamp(e) for e in batch]
        data = b"".join(export_entry(e) for e in batch)
        done = subprocess.run([self.remote, "-o", str(self.path), "-"], input=data, capture_output=True,
                              timeout=120, check=False)
        err = done.stderr.decode("utf-8", "replace")
        if done.returncode != 0 or f"writing {len(batch)} entries" not in err:
            raise RuntimeError(f"systemd-journal-remote wrote less than asked ({len(batch)} entries): {err.strip()}")
        promptness.note_written(data)
        out = []
        for e in batch:
            fields = {k: v for k, v in e if not k.startswith("ROTATE_PAD_")}
            rt = fields["__REALTIME_TIMESTAMP"]
            out.append(Written(fields["MESSAGE"], fields, self.path.name, int(rt), str(fields["_BOOT_ID"]), marker))
        self.written.extend(out)
        return out

    def append_caught(self, follower: int, *entries: Value | list[tuple[str, Value]],
                      field: str = "_SYSTEMD_UNIT=app.service") -> list[Written]:
        """`append`, with the `journalctl --follow` at pid `follower` looking at the file at the worst
        instant: journal-remote (as journald) links a new entry into the file's entry array (the
        header's n_entries counts it) before it links it into the entry list of each of its fields'
        DATA objects. A reader matching `field` that looks in between finds nothing new, notes the
        count, and skips the file at every wake-up until the count changes. The follower is stopped,
        the run written, the last entry unlisted from `field`'s DATA object (its n_entries one lower)
        and the file's IN_MODIFY made, the follower let look (until it read its inotify events and
        waits in ppoll again), then the write completed: the count restored and another IN_MODIFY."""
        # past its start: journalctl lists the directory before it watches it (sd_journal_get_fd), so a
        # file made in between is never seen by that child (shipper's header watch restarts it: not
        # what this harness is for)
        _wait_for(lambda: _in_poll(follower), f"journalctl {follower} waiting for changes")
        os.kill(follower, signal.SIGSTOP)
        try:
            _wait_for(lambda: _proc_state(follower) in ("T", "t"), f"journalctl {follower} stopped")
            out = self.append(*entries)
            at = data_object(self.path, field.encode()) + DATA_N_ENTRIES_AT
            fd = os.open(self.path, os.O_RDWR)
            try:
                (n,) = struct.unpack("<Q", os.pread(fd, 8, at))
                os.pwrite(fd, struct.pack("<Q", n - 1), at)
                # a wake-up of our own while it is stopped (the writer's post-change: ftruncate to the
                # same size is an IN_MODIFY): journal-remote's own may not come before it exits
                os.ftruncate(fd, os.fstat(fd).st_size)
                reads = _syscalls_read(follower)
                os.kill(follower, signal.SIGCONT)
                _wait_for(lambda: _syscalls_read(follower) > reads and _in_poll(follower),
                          lambda: (f"journalctl {follower} looked at the file and waits again (reads {reads} -> "
                                   f"{_syscalls_read(follower)}, state {_proc_state(follower)}, syscall "
                                   f"{Path(f'/proc/{follower}/syscall').read_text().split()[:3]}, "
                                   f"wchan {Path(f'/proc/{follower}/wchan').read_text()}, "
                                   f"{_watches(follower)}, files {sorted(os.listdir(self.directory))}, {self.path})"))
                os.pwrite(fd, struct.pack("<Q", n), at)
                os.ftruncate(fd, os.fstat(fd).st_size)
            finally:
                os.close(fd)
        finally:
            os.kill(follower, signal.SIGCONT)
        return out

    def new_file(self, name: str) -> None:
        """Later appends go to DIR/<name>.journal: another sequence-number id."""
        self.name = name

    def new_boot(self) -> str:
        """Later entries belong to a new boot (new _BOOT_ID, monotonic time from the start)."""
        self.boot_id = secrets.token_hex(16)
        self._monotonic_us = 1_000_000
        return self.boot_id

    # ------------------------------------------------------------ files

    def files(self) -> list[Path]:
        return sorted(self.directory.glob("*.journal"))

    def archived(self) -> list[Path]:
        """Archived files, oldest first (by the head realtime their name carries)."""
        def head_realtime(p: Path) -> int:
            return int(p.stem.rsplit("-", 1)[-1], 16)
        return sorted((p for p in self.directory.glob("*@*.journal")), key=head_realtime)

    def vacuum(self) -> Path:
        """Delete the oldest archived file, as `journalctl --vacuum-files` / journald do."""
        files = self.archived()
        if not files:
            raise RuntimeError(f"no archived journal file in {self.directory} to vacuum")
        files[0].unlink()
        return files[0]

    # ------------------------------------------------------------ reading back

    def read(self, *matches: str, all_fields: bool = True) -> list[dict[str, Any]]:
        """What `journalctl -D DIR --merge --output=json [--all]` reads, one dict per entry."""
        return self.read_dir(self.directory, *matches, all_fields=all_fields)

    @staticmethod
    def read_dir(directory: Path, *matches: str, all_fields: bool = True) -> list[dict[str, Any]]:
        argv = [JOURNALCTL, f"--directory={directory}", "--merge", "--no-pager", "--output=json"]
        if all_fields:
            argv.append("--all")
        done = subprocess.run([*argv, *matches], capture_output=True, timeout=120, check=True)
        return [json.loads(line) for line in done.stdout.splitlines() if line.strip()]

    def messages(self) -> list[Value]:
        """MESSAGE of every entry written, markers left out, in writing order."""
        return [w.message for w in self.written if not w.is_marker]


# ---------------------------------------------------------------- the file format, for append_caught

DATA_N_ENTRIES_AT = 56        # DataObject: object header (16), hash, next_hash, next_field, entry_offset, entry_array_offset
_OBJECT_DATA = 1
_INCOMPATIBLE_COMPACT = 16


def data_object(path: Path, payload: bytes) -> int:
    """The offset of the DATA object holding `payload` (uncompressed) in a journal file: the objects
    walked from the header's end to the tail object (systemd's JOURNAL_FILE_FORMAT)."""
    data = path.read_bytes()
    (incompatible,) = struct.unpack_from("<I", data, 12)
    (header_size,) = struct.unpack_from("<Q", data, 88)
    (tail,) = struct.unpack_from("<Q", data, 136)
    payload_at = 72 if incompatible & _INCOMPATIBLE_COMPACT else 64
    off = header_size
    while off <= tail:
        (size,) = struct.unpack_from("<Q", data, off + 8)
        if data[off] == _OBJECT_DATA and data[off + payload_at:off + size] == payload:
            return off
        off += (size + 7) & ~7
    raise LookupError(f"{path}: no DATA object {payload!r}")


def follower_of(pid: int) -> int:
    """The pid of the `journalctl --follow` child of process `pid` (a daemon's journald reader)."""
    def find() -> int | None:
        for task in Path(f"/proc/{pid}/task").iterdir():
            for child in (task / "children").read_text().split():
                try:
                    argv = Path(f"/proc/{child}/cmdline").read_bytes().split(b"\0")
                except OSError:
                    continue
                if b"--follow" in argv and argv[0].endswith(b"journalctl"):
                    return int(child)
        return None
    return int(_wait_for(find, f"a journalctl --follow child of {pid}"))


def _watches(pid: int) -> list[str]:
    out = []
    for fd in os.listdir(f"/proc/{pid}/fdinfo"):
        try:
            text = Path(f"/proc/{pid}/fdinfo/{fd}").read_text()
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        out.append(f"{fd}->{target}: " + " | ".join(line for line in text.splitlines() if line.startswith("inotify")))
    return out


def _proc_state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def _syscalls_read(pid: int) -> int:
    for line in Path(f"/proc/{pid}/io").read_text().splitlines():
        if line.startswith("syscr:"):
            return int(line.split()[1])
    raise LookupError(f"/proc/{pid}/io has no syscr")


def _in_poll(pid: int) -> bool:
    """Blocked in ppoll(2) (x86_64: 271; aarch64: 73), as journalctl waits for a change."""
    nr = Path(f"/proc/{pid}/syscall").read_text().split()[0]
    return _proc_state(pid) == "S" and nr == {"x86_64": "271", "aarch64": "73"}.get(os.uname().machine, nr)


def _wait_for(cond: Callable[[], Any], what: str | Callable[[], str]) -> Any:
    return wait_until(cond, what, interval_s=0.002)


def _pad_fields() -> list[tuple[str, Value]]:
    return [(f"ROTATE_PAD_{i:03d}", "1") for i in range(ROTATE_PAD_FIELDS)]


def message_bytes(value: Any) -> bytes | None:
    """MESSAGE as journalctl's JSON gives it (text, or an array of bytes) -> bytes."""
    if value is None:
        return None
    if isinstance(value, str):
        return value.encode()
    return bytes(value)
