"""The journal's one-shot journalctl runs: its head (the newest matching entry, for lag and
`shipper status`), `shipper check`'s look, and the environment and directory every child gets.
Never follows the journal or keeps anything (reader.py follows it)."""

from __future__ import annotations

import asyncio
import os
import subprocess
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import orjson

from shipper.sources.journald.cursor import Cursor, classify_exit, count_argv, head_argv, is_partial_view, parse_cursor
from shipper.tail import opening

JOURNALCTL = "journalctl"

# journalctl's own output: no colours, no pager, whatever the environment says
_CHILD_ENV = {"SYSTEMD_COLORS": "0", "SYSTEMD_PAGER": "", "PAGER": "cat"}


def child_env() -> dict[str, str]:
    """The environment of every journalctl child: ours, with no colours and no pager."""
    env = dict(os.environ)
    env.update(_CHILD_ENV)
    return env


def cursor_of(line: bytes) -> Cursor | None:
    """The cursor of one JSON line journalctl printed (None: blank, not JSON, or no valid __CURSOR)."""
    if not line.strip():
        return None
    try:
        obj = orjson.loads(line)
    except orjson.JSONDecodeError:
        return None
    raw = obj.get("__CURSOR") if isinstance(obj, dict) else None
    return parse_cursor(raw) if isinstance(raw, str) else None


class JournalDirRefused(OSError):
    """The configured journal directory is not one shipper reads (not a directory; on /proc, /sys, /dev)."""


@contextmanager
def journal_directory(directory: str | None) -> Iterator[tuple[str | None, tuple[int, ...]]]:
    """The journal directory for one journalctl child, opened and judged first (`tail/opening.py`):
    (the path to give journalctl, the fds the child must inherit). The child reads the very
    directory judged, as /proc/self/fd/N, whatever is renamed over its path meanwhile; one that
    cannot be opened is named as it is (journalctl says what is wrong). Raises JournalDirRefused."""
    if directory is None:
        yield None, ()
        return
    got = opening.open_directory(directory)
    if isinstance(got, opening.Refused):
        raise JournalDirRefused(f"{directory}: not read: {got.reason}")
    if got is None:
        yield directory, ()
        return
    try:
        yield f"/proc/self/fd/{got}", (got,)
    finally:
        os.close(got)


def last_cursor(out: bytes) -> Cursor | None:
    lines = out.strip().splitlines()
    return cursor_of(lines[-1]) if lines else None


async def read_head(executable: str, directory: str | None, units: Sequence[str]) -> Cursor | None:
    """The newest entry matching `units` in the journal (None: none, or unreadable)."""
    try:
        with journal_directory(directory) as (where, fds):
            proc = await asyncio.create_subprocess_exec(
                *head_argv(executable, where, units), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL, env=child_env(), pass_fds=fds)
    except JournalDirRefused:
        return None
    try:
        out, _ = await proc.communicate()
    except asyncio.CancelledError:
        if proc.returncode is None:
            proc.kill()
        await asyncio.shield(proc.wait())        # reaped, not left running behind a closed loop
        raise
    return last_cursor(out)


def read_head_sync(executable: str, directory: str | None, units: Sequence[str],
                   timeout_s: float = 10.0) -> Cursor | None:
    """`read_head` for commands without a loop (`shipper status`)."""
    try:
        with journal_directory(directory) as (where, fds):
            done = subprocess.run(head_argv(executable, where, units), stdin=subprocess.DEVNULL, capture_output=True,
                                  timeout=timeout_s, env=child_env(), check=False, pass_fds=fds)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return last_cursor(done.stdout)


# ---------------------------------------------------------------- shipper check

@dataclass(frozen=True, slots=True)
class JournalCheck:
    """What `shipper check` says of a journald input. `entries` counts matching entries up to
    `max_entries` (`is_capped`: there are at least that many)."""

    is_readable: bool
    entries: int
    is_capped: bool
    detail: str


def check_journal(directory: str | None, units: Sequence[str], executable: str = JOURNALCTL,
                  max_entries: int = 100_000, timeout_s: float = 10.0) -> JournalCheck:
    """Is the journal readable, and how many entries match? Reads at most `max_entries` short
    lines within `timeout_s` (then counts what it got)."""
    if directory is not None and not os.path.isdir(directory):
        return JournalCheck(False, 0, False, f"{directory}: no such directory")
    try:
        with journal_directory(directory) as (where, fds):
            proc = subprocess.Popen(count_argv(executable, where, units, max_entries), stdin=subprocess.DEVNULL,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=child_env(), pass_fds=fds)
    except JournalDirRefused as e:
        return JournalCheck(False, 0, False, str(e))
    except OSError as e:
        return JournalCheck(False, 0, False, f"{executable}: {e.strerror or e}")
    try:
        out, err = proc.communicate(timeout=timeout_s)
        timed_out = False
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        timed_out = True
    n = out.count(b"\n")
    text = err.decode("utf-8", "replace").strip()
    capped = n >= max_entries or timed_out
    if proc.returncode not in (0, None) and not timed_out:
        kind = classify_exit(proc.returncode, text)
        detail = {"no_permission": "no permission to read the journal (the service user needs group "
                                   "systemd-journal)"}.get(kind, text.splitlines()[-1] if text else f"exit {proc.returncode}")
        return JournalCheck(False, n, False, detail)
    if is_partial_view(text):
        return JournalCheck(False, n, capped, "only this user's own entries are visible (the service user needs "
                                              "group systemd-journal)")
    return JournalCheck(True, n, capped, "timed out counting" if timed_out else "")
