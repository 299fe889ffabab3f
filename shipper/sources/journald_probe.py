"""The journal's one-shot journalctl runs: its head (newest matching entry, for lag and `shipper status`)
and `shipper check`'s readability and entry count, plus the environment every journalctl child gets.
Must not follow the journal or keep anything: the reader is sources/journald.py; decisions are sources/journal*.py.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass

import orjson

from shipper.sources.journal_cursor import (
    Cursor,
    classify_exit,
    count_argv,
    head_argv,
    is_partial_view,
    parse_cursor,
)

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


def last_cursor(out: bytes) -> Cursor | None:
    lines = out.strip().splitlines()
    return cursor_of(lines[-1]) if lines else None


async def read_head(executable: str, directory: str | None, units: Sequence[str]) -> Cursor | None:
    """The newest entry matching `units` in the journal (None: none, or unreadable)."""
    proc = await asyncio.create_subprocess_exec(
        *head_argv(executable, directory, units), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL, env=child_env())
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
        done = subprocess.run(head_argv(executable, directory, units), stdin=subprocess.DEVNULL,
                              capture_output=True, timeout=timeout_s, env=child_env(), check=False)
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
    argv = count_argv(executable, directory, units, max_entries)
    try:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                env=child_env())
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
