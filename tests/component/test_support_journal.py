"""tests/support/journal.py writes real journal files: journalctl -D reads what it wrote."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.support.journal import (
    ROTATE_MARKER,
    Journal,
    export_entry,
    journal_remote,
    message_bytes,
)


def _cursor_parts(entry: dict) -> dict[str, str]:
    return dict(p.split("=", 1) for p in entry["__CURSOR"].split(";"))


def test_appended_entries_are_read_back_with_their_fields(tmp_path: Path) -> None:
    j = Journal(tmp_path / "j")
    j.append("one", j.entry("two", unit="web.service", pid=7, priority=3, hostname="h2", identifier="web"))
    j.append("three")
    got = j.read()
    assert [e["MESSAGE"] for e in got] == ["one", "two", "three"]
    assert got[0]["_SYSTEMD_UNIT"] == "app.service" and got[0]["_PID"] == "4242" and got[0]["_HOSTNAME"] == "testhost"
    assert (got[1]["_SYSTEMD_UNIT"], got[1]["_PID"], got[1]["PRIORITY"], got[1]["_HOSTNAME"],
            got[1]["SYSLOG_IDENTIFIER"]) == ("web.service", "7", "3", "h2", "web")
    assert [int(e["__REALTIME_TIMESTAMP"]) for e in got] == [w.realtime_us for w in j.written]
    seq = [_cursor_parts(e) for e in got]
    assert len({s["s"] for s in seq}) == 1 and [int(s["i"], 16) for s in seq] == [1, 2, 3]
    assert [e["MESSAGE"] for e in j.read("_SYSTEMD_UNIT=web.service")] == ["two"]


def test_binary_and_oversized_messages(tmp_path: Path) -> None:
    j = Journal(tmp_path / "j")
    big5k, big100k = "x" * 5000, "y" * (100 * 1024)
    msgs: list[bytes] = [b"two\nlines", b"bad \xff\xfe utf8", b"tab\tand \x1b[31mescape", big5k.encode(), big100k.encode(),
                         "üñí ✓".encode()]
    j.append(*msgs)
    got = j.read()
    assert [message_bytes(e["MESSAGE"]) for e in got] == msgs
    assert isinstance(got[1]["MESSAGE"], list) and isinstance(got[0]["MESSAGE"], str)
    # without --all, fields over 4 KiB come out as null
    assert [e["MESSAGE"] is None for e in j.read(all_fields=False)] == [False, False, False, True, True, False]


def test_rotation_archives_the_file_and_continues_the_sequence_numbers(tmp_path: Path) -> None:
    j = Journal(tmp_path / "j")
    j.append("a1", "a2", then_rotate=True)
    assert j.archived() == []                  # journal-remote rotates before its next write
    j.append("b1")
    assert len(j.archived()) == 1 and j.path.exists()
    j.rotate()
    j.append("c1")
    assert len(j.archived()) == 2
    got = j.read()
    assert [e["MESSAGE"] for e in got] == ["a1", "a2", "b1", ROTATE_MARKER, "c1"]
    seq = [_cursor_parts(e) for e in got]
    assert len({s["s"] for s in seq}) == 1 and [int(s["i"], 16) for s in seq] == [1, 2, 3, 4, 5]
    assert j.messages() == ["a1", "a2", "b1", "c1"]


def test_vacuum_deletes_the_oldest_archived_file(tmp_path: Path) -> None:
    j = Journal(tmp_path / "j")
    j.append("a1", then_rotate=True)
    j.append("b1", then_rotate=True)
    j.append("c1")
    first, second = j.archived()
    assert j.vacuum() == first and j.archived() == [second]
    assert [e["MESSAGE"] for e in j.read()] == ["b1", "c1"]


def test_boots_and_files_with_other_sequence_number_ids(tmp_path: Path) -> None:
    j = Journal(tmp_path / "j")
    j.append("boot1")
    b2 = j.new_boot()
    j.append("boot2")
    j.new_file("remote-host")
    j.append("other file")
    got = j.read()
    assert [e["MESSAGE"] for e in got] == ["boot1", "boot2", "other file"]
    assert got[1]["_BOOT_ID"] == b2 != got[0]["_BOOT_ID"]
    seq = [_cursor_parts(e) for e in got]
    assert seq[0]["s"] == seq[1]["s"] != seq[2]["s"] and int(seq[2]["i"], 16) == 1
    boots = subprocess.run(["journalctl", f"--directory={j.directory}", "--list-boots", "--no-pager"],
                           capture_output=True, text=True, check=True).stdout
    assert b2 in boots and got[0]["_BOOT_ID"] in boots


def test_journal_remote_drops_an_entry_without_realtime(tmp_path: Path) -> None:
    """The fact the helper works around (systemd 252): an entry without __REALTIME_TIMESTAMP is
    dropped when the stream gave none before it; after one, it silently takes the previous
    entry's time. So every entry the helper writes has its own."""
    remote = journal_remote()
    assert remote is not None
    out = tmp_path / "x.journal"
    boot = ("_BOOT_ID", "1" * 32)
    dropped = subprocess.run([remote, "-o", str(out), "-"], input=export_entry([boot, ("MESSAGE", "dropped")]),
                             capture_output=True, check=True)
    assert b"writing 0 entries" in dropped.stderr
    data = export_entry([("__REALTIME_TIMESTAMP", 1_700_000_000_000_000), boot, ("MESSAGE", "kept")])
    data += export_entry([boot, ("MESSAGE", "inherits")])
    subprocess.run([remote, "-o", str(out), "-"], input=data, capture_output=True, check=True)
    got = Journal.read_dir(tmp_path)
    assert [(e["MESSAGE"], e["__REALTIME_TIMESTAMP"]) for e in got] == [
        ("kept", "1700000000000000"), ("inherits", "1700000000000000")]


def _systemd_version() -> int:
    out = subprocess.run(["journalctl", "--version"], capture_output=True, text=True, check=True).stdout
    return int(out.split()[1])


def _follow(j: Journal, *argv: str) -> list[str]:
    """The non-sentinel MESSAGEs `journalctl --follow ...` prints: a new sentinel entry appended
    once it runs marks the end of what it printed of the stored ones (no sleeping)."""
    import json
    import select
    import time
    proc = subprocess.Popen(["journalctl", "--follow", "--output=json", *argv], stdout=subprocess.PIPE)
    assert proc.stdout is not None
    sentinel = f"sentinel {len(j.written)}"
    j.append(sentinel)
    got: list[str] = []
    buf = b""
    deadline = time.monotonic() + 10
    try:
        while sentinel not in got:
            left = deadline - time.monotonic()
            assert left > 0, f"timed out waiting for the sentinel after {got}"
            if select.select([proc.stdout], [], [], left)[0]:
                data = os.read(proc.stdout.fileno(), 65536)
                assert data, f"journalctl exited after {got}"
                buf += data
                *lines, buf = buf.split(b"\n")
                got += [json.loads(line)["MESSAGE"] for line in lines if line]
    finally:
        proc.kill()
        proc.communicate()
    return [m for m in got if not m.startswith("sentinel")]


@pytest.mark.skipif(_systemd_version() != 252, reason="facts measured on systemd 252")
def test_the_systemd_252_facts_the_reader_works_around(tmp_path: Path) -> None:
    j = Journal(tmp_path / "j")
    j.append("boot1 a", "boot1 b", then_rotate=True)
    j.new_boot()
    j.append("boot2 a", "boot2 b")
    d = f"--directory={j.directory}"
    c1 = j.read()[0]["__CURSOR"]
    # without --merge, --follow reads only the latest boot, and --after-cursor then skips its first entry
    assert _follow(j, d, "--no-tail") == ["boot2 a", "boot2 b"]
    assert _follow(j, d, f"--after-cursor={c1}") == ["boot2 b"]
    assert _follow(j, d, "--merge", f"--cursor={c1}") == ["boot1 a", "boot1 b", "boot2 a", "boot2 b"]
    # a vacuumed cursor: --after-cursor skips the first entry that is left, --cursor starts at it
    j.vacuum()
    assert _follow(j, d, "--merge", f"--after-cursor={c1}") == ["boot2 b"]
    assert _follow(j, d, "--merge", f"--cursor={c1}") == ["boot2 a", "boot2 b"]
