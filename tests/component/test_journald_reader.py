"""JournalReader against real journal files (systemd-journal-remote writes, journalctl reads):
appends while running, inclusive resume (no duplicate, no loss), rotation, vacuumed gaps, unit
filters, boots, pino and binary/oversized MESSAGEs, a killed child, malformed output, check."""

from __future__ import annotations

import asyncio
import os
import signal
import stat
from pathlib import Path
from typing import Any

import pytest

from shipper.config import InputConfig, JournaldConfig, MultilineConfig
from shipper.parse.document import DocBuilder
from shipper.sources.journald.cursor import Gap, doc_id, parse_cursor
from shipper.sources.journald.entries import JournalAssembler, JournalEntry, source_event
from shipper.sources.journald.probe import check_journal, read_head, read_head_sync
from shipper.sources.journald.reader import JournalReader, JournalReaderConfig
from tests.support.fake_clock import FakeClock, RecordingEvents
from tests.support.journal import Journal
from tests.support.wait import async_wait_until

TIMEOUT_S = 10.0


def starts(rec: RecordingEvents) -> list[str | None]:
    """The cursor each journalctl child was started after (None: from the start)."""
    return [cursor for _, cursor, _ in rec.of("journal_started")]


def gaps(rec: RecordingEvents) -> list[Gap]:
    return [gap for _, gap in rec.of("journal_gap")]


def exits(rec: RecordingEvents) -> list[tuple[int | None, str, str]]:
    """(returncode, kind, error) of each journalctl child that exited."""
    return [(code, kind, error) for _, code, kind, error, _, _ in rec.of("journal_reader_exited")]


def skipped(rec: RecordingEvents) -> list[str]:
    return [reason for _, reason in rec.of("journal_entry_skipped")]


def make_reader(j: Journal, position: str | None = None, **cfg: Any) -> tuple[JournalReader, RecordingEvents, FakeClock]:
    rec, clock = RecordingEvents(), FakeClock(wall=1_000.0)
    cfg.setdefault("directory", str(j.directory))
    return JournalReader(JournalReaderConfig(**cfg), position=position, clock=clock, events=rec), rec, clock


async def take(reader: JournalReader, n: int, what: str = "") -> list[JournalEntry]:
    """Read until n entries arrived (fails naming what was awaited), never more than asked for in a batch's worth."""
    got: list[JournalEntry] = []

    async def loop() -> None:
        while len(got) < n:
            got.extend(await reader.read())

    try:
        await asyncio.wait_for(loop(), TIMEOUT_S)
    except TimeoutError:
        raise AssertionError(f"timed out after {TIMEOUT_S}s waiting for {n} entries {what}; got "
                             f"{[e.message for e in got]}") from None
    return got


def msgs(entries: list[JournalEntry]) -> list[bytes]:
    return [e.message for e in entries]


async def test_existing_entries_then_entries_appended_while_running(tmp_path: Path) -> None:
    j = Journal(tmp_path / "j")
    j.append("a", "b")
    reader, rec, _ = make_reader(j)
    try:
        assert msgs(await take(reader, 2)) == [b"a", b"b"]
        j.append("c")
        j.append("d", "e")
        got = await take(reader, 3, "appended while running")
        assert msgs(got) == [b"c", b"d", b"e"]
        assert [e.cursor.seqnum for e in got] == [3, 4, 5] and reader.last_cursor == got[-1].cursor
        assert gaps(rec) == [] and exits(rec) == [] and skipped(rec) == []
    finally:
        await reader.close()


async def test_a_restart_from_a_stored_cursor_has_no_duplicate_and_no_loss(tmp_path: Path) -> None:
    j = Journal(tmp_path / "j")
    j.append(*[f"m{i}" for i in range(1, 6)])
    first, _, _ = make_reader(j)
    got = await take(first, 5)
    await first.close()
    committed = got[2].cursor.text                 # the pipeline committed up to m3
    j.append("m6", "m7")                           # written while stopped
    again, rec, _ = make_reader(j, position=committed)
    try:
        got = await take(again, 4)
        assert msgs(got) == [b"m4", b"m5", b"m6", b"m7"]
        assert starts(rec) == [committed] and gaps(rec) == []
    finally:
        await again.close()


async def test_a_resume_reads_every_entry_after_the_cursor_not_ten(tmp_path: Path) -> None:
    """systemd 252: `--follow --cursor` without --no-tail prints ten entries, then waits."""
    j = Journal(tmp_path / "j")
    j.append(*[f"m{i}" for i in range(5)])
    first, _, _ = make_reader(j)
    committed = (await take(first, 5))[-1].cursor.text
    await first.close()
    j.append(*[f"m{i}" for i in range(5, 40)])
    again, _, _ = make_reader(j, position=committed)
    try:
        assert msgs(await take(again, 35, "after the cursor")) == [f"m{i}".encode() for i in range(5, 40)]
    finally:
        await again.close()


async def test_entries_of_an_earlier_boot_are_read_after_a_restart(tmp_path: Path) -> None:
    """systemd 252's `journalctl -D --follow` without --merge reads only the latest boot."""
    j = Journal(tmp_path / "j")
    j.append("boot1 a", "boot1 b")
    first, _, _ = make_reader(j)
    stored = (await take(first, 1))[0].cursor.text
    await first.close()
    j.new_boot()
    j.append("boot2 a")
    again, rec, _ = make_reader(j, position=stored)
    try:
        assert msgs(await take(again, 2)) == [b"boot1 b", b"boot2 a"]
        j.new_boot()
        j.append("boot3 a")
        assert msgs(await take(again, 1)) == [b"boot3 a"]
        assert gaps(rec) == []
    finally:
        await again.close()


async def test_start_at_end_reads_only_new_entries(tmp_path: Path) -> None:
    j = Journal(tmp_path / "j")
    j.append("old1", "old2")
    reader, rec, _ = make_reader(j, start_at="end")
    try:
        pending = asyncio.ensure_future(take(reader, 1))
        await async_wait_until(lambda: starts(rec), "journalctl to start", TIMEOUT_S, interval_s=0.01)
        j.append("new")
        assert msgs(await pending) == [b"new"]
        c = parse_cursor(starts(rec)[0] or "")
        assert starts(rec)[0] is not None and c is not None and c.seqnum == 2
        assert reader.start_position is not None and reader.start_position.seqnum == 2
    finally:
        await reader.close()


async def test_start_at_end_survives_a_child_restart_before_the_first_entry(tmp_path: Path) -> None:
    j = Journal(tmp_path / "j")
    j.append("old1", "old2")
    reader, rec, _ = make_reader(j, start_at="end")
    try:
        pending = asyncio.ensure_future(take(reader, 1))
        await async_wait_until(lambda: starts(rec), "journalctl to start", TIMEOUT_S, interval_s=0.01)
        pid = reader.pid
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        j.append("new")
        assert msgs(await pending) == [b"new"]
        assert len(starts(rec)) == 2 and starts(rec)[0] == starts(rec)[1]
    finally:
        await reader.close()


async def test_rotation_while_running_loses_nothing(tmp_path: Path) -> None:
    j = Journal(tmp_path / "j")
    j.append("a1", "a2", then_rotate=True)
    reader, rec, _ = make_reader(j)
    try:
        assert msgs(await take(reader, 2)) == [b"a1", b"a2"]
        j.append("b1", "b2")
        assert len(j.archived()) == 1
        j.new_file("other")                       # a file with another sequence-number id appears
        j.append("o1")
        got = await take(reader, 3, "after rotation")
        assert msgs(got) == [b"b1", b"b2", b"o1"]
        assert [e.cursor.seqnum for e in got[:2]] == [3, 4]
        assert gaps(rec) == []
    finally:
        await reader.close()


async def test_a_vacuumed_stored_cursor_is_reported_once_with_the_entries_lost(tmp_path: Path) -> None:
    j = Journal(tmp_path / "j")
    j.append("a1", "a2", "a3", "a4", then_rotate=True)
    j.append("b1", "b2")
    first, _, _ = make_reader(j)
    stored = (await take(first, 2))[1].cursor.text      # committed up to a2; a3, a4 not yet
    await first.close()
    j.vacuum()                                          # a1..a4 are gone
    again, rec, _ = make_reader(j, position=stored)
    try:
        assert msgs(await take(again, 2)) == [b"b1", b"b2"]
        assert len(gaps(rec)) == 1
        g = gaps(rec)[0]
        assert (g.reason, g.after, g.lost_entries) == ("vacuumed", stored, 2)
        assert g.resumed_at is not None and parse_cursor(g.resumed_at).seqnum == 5  # type: ignore[union-attr]
        assert again.gaps == 1 and again.entries_lost == 2
        j.append("b3")
        assert msgs(await take(again, 1)) == [b"b3"] and len(gaps(rec)) == 1
    finally:
        await again.close()


async def test_a_vacuumed_cursor_that_was_the_files_last_entry_loses_nothing(tmp_path: Path) -> None:
    j = Journal(tmp_path / "j")
    j.append("a1", "a2", then_rotate=True)
    j.append("b1")
    first, _, _ = make_reader(j)
    stored = (await take(first, 2))[1].cursor.text
    await first.close()
    j.vacuum()
    again, rec, _ = make_reader(j, position=stored)
    try:
        assert msgs(await take(again, 1)) == [b"b1"] and gaps(rec) == []
    finally:
        await again.close()


async def test_with_a_unit_filter_the_gap_is_measured_on_the_whole_journal(tmp_path: Path) -> None:
    j = Journal(tmp_path / "j")
    j.append("app1", j.entry("other1", unit="other.service"), "app2", j.entry("other2", unit="other.service"),
             then_rotate=True)
    j.append(j.entry("other3", unit="other.service"), "app3")
    first, _, _ = make_reader(j, units=("app",))
    stored = (await take(first, 1))[0].cursor.text     # app1 (seqnum 1)
    await first.close()
    j.vacuum()
    again, rec, _ = make_reader(j, position=stored, units=("app",))
    try:
        assert msgs(await take(again, 1)) == [b"app3"]
        assert [(g.reason, g.lost_entries) for g in gaps(rec)] == [("vacuumed", 3)]   # seqnums 2, 3, 4
    finally:
        await again.close()


async def test_with_a_unit_filter_a_present_cursor_is_no_gap(tmp_path: Path) -> None:
    j = Journal(tmp_path / "j")
    j.append("app1", j.entry("other", unit="other.service"))
    first, _, _ = make_reader(j)
    stored = (await take(first, 2))[1].cursor.text     # read without a filter up to "other"
    await first.close()
    j.append("app2")
    again, rec, _ = make_reader(j, position=stored, units=("app.service",))   # then the filter came
    try:
        assert msgs(await take(again, 1)) == [b"app2"] and gaps(rec) == []
    finally:
        await again.close()


async def test_the_unit_filter(tmp_path: Path) -> None:
    j = Journal(tmp_path / "j")
    j.append("a", j.entry("w", unit="web.service"), j.entry("x", unit="cron.service"), j.entry("w2", unit="web.service"))
    reader, _, _ = make_reader(j, units=("web", "app.service"))
    try:
        got = await take(reader, 3)
        assert msgs(got) == [b"a", b"w", b"w2"] and [e.unit for e in got] == ["app.service", "web.service", "web.service"]
    finally:
        await reader.close()


async def test_an_unusable_stored_cursor_is_a_gap_and_reading_starts_at_the_oldest(tmp_path: Path) -> None:
    j = Journal(tmp_path / "j")
    j.append("a", "b")
    for bad in ("garbage", "s=00000000000000000000000000000000;i=zz"):
        reader, rec, _ = make_reader(j, position=bad)
        try:
            assert msgs(await take(reader, 2)) == [b"a", b"b"]
            assert [(g.reason, g.after) for g in gaps(rec)] == [("cursor_invalid", bad)]
        finally:
            await reader.close()


async def test_a_cursor_journalctl_refuses_is_a_gap_then_the_oldest(tmp_path: Path) -> None:
    j = Journal(tmp_path / "j")
    j.append("a")
    bad = "s=abc;i=1;b=nothex-boot"           # parses here, journalctl cannot seek to it
    reader, rec, clock = make_reader(j, position=bad)
    try:
        assert msgs(await take(reader, 1)) == [b"a"]
        assert [g.reason for g in gaps(rec)] == ["cursor_invalid"]
        assert [kind for _, kind, _ in exits(rec)] == ["cursor_invalid"] and clock.slept == [0.5]
    finally:
        await reader.close()


async def test_a_killed_child_is_restarted_with_backoff_without_duplicates(tmp_path: Path) -> None:
    j = Journal(tmp_path / "j")
    j.append("a", "b")
    reader, rec, clock = make_reader(j, restart_initial_s=0.25, restart_max_s=4.0)
    try:
        assert msgs(await take(reader, 2)) == [b"a", b"b"]
        pid = reader.pid
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        j.append("c")
        assert msgs(await take(reader, 1, "after the kill")) == [b"c"]
        assert exits(rec) and exits(rec)[0][0] == -signal.SIGKILL and clock.slept == [0.25]
        assert len(starts(rec)) == 2
        c = parse_cursor(starts(rec)[1] or "")
        assert starts(rec)[1] is not None and c is not None and c.seqnum == 2
    finally:
        await reader.close()


async def test_a_failing_journalctl_backs_off_exponentially(tmp_path: Path) -> None:
    j = Journal(tmp_path / "j")
    reader, rec, clock = make_reader(j, directory=str(tmp_path / "missing"), restart_initial_s=1.0, restart_max_s=4.0)

    task = asyncio.ensure_future(reader.read())
    try:
        await async_wait_until(lambda: len(exits(rec)) >= 4, lambda: f"four failed starts (exits: {exits(rec)})",
                               TIMEOUT_S, interval_s=0.001)
        assert {kind for _, kind, _ in exits(rec)} == {"no_directory"}
        assert clock.slept[0] == 1.0 and all(1.0 <= s <= 4.0 for s in clock.slept)
    finally:
        await reader.close()
        assert await asyncio.wait_for(task, TIMEOUT_S) == []


def _script(path: Path, body: str) -> str:
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


async def test_malformed_output_is_skipped_with_a_warning_never_a_stop(tmp_path: Path) -> None:
    j = Journal(tmp_path / "j")
    j.append("a")
    exe = _script(tmp_path / "jctl", "echo 'not json'\necho '[1,2]'\necho '{\"MESSAGE\":\"no cursor\"}'\n"
                                     "exec journalctl \"$@\"\n")
    reader, rec, _ = make_reader(j, executable=exe)
    try:
        assert msgs(await take(reader, 1)) == [b"a"]
        assert skipped(rec) == ["invalid JSON", "not a JSON object", "no valid __CURSOR"]
        j.append("b")
        assert msgs(await take(reader, 1)) == [b"b"]
    finally:
        await reader.close()


async def test_binary_and_oversized_messages(tmp_path: Path) -> None:
    j = Journal(tmp_path / "j")
    sent = [b"bin \xff\xfe\x00 nul", b"two\nlines", b"x" * 5000, b"y" * (100 * 1024), b"z" * (3 * 1024 * 1024), b"after"]
    j.append(*sent)
    reader, _, _ = make_reader(j, max_message_bytes=1024 * 1024, chunk_bytes=64 * 1024)
    try:
        got = await take(reader, 6)
        assert msgs(got)[:4] == sent[:4] and got[4].message == sent[4][:1024 * 1024] and got[5].message == b"after"
        assert [e.flags for e in got] == [0, 0, 0, 0, 1, 0]
    finally:
        await reader.close()


async def test_an_entry_over_max_entry_bytes_is_skipped_and_counted(tmp_path: Path) -> None:
    j = Journal(tmp_path / "j")
    j.append("small", "q" * (300 * 1024), "next")
    reader, rec, _ = make_reader(j, max_entry_bytes=200 * 1024, chunk_bytes=16 * 1024)
    try:
        assert msgs(await take(reader, 2)) == [b"small", b"next"]
        assert skipped(rec) == ["entry over 204800 bytes"] and reader.skipped == 1
    finally:
        await reader.close()


async def test_a_pino_message_gives_the_file_document(tmp_path: Path) -> None:
    line = '{"level":30,"time":1790000000123,"pid":7,"hostname":"h","msg":"hello","req":{"id":1}}'
    j = Journal(tmp_path / "j")
    j.append(j.entry(line, unit="node.service", pid=7, priority=6, hostname="node-1"))
    reader, _, _ = make_reader(j)
    try:
        (e,) = await take(reader, 1)
    finally:
        await reader.close()
    b = DocBuilder(InputConfig(paths=(), journald=JournaldConfig()), "logs", "shipper-host")
    r = b.source_doc(source_event(e))
    assert r is not None
    fr = b.to_doc(line.encode(), 0, "/var/log/app.log", 0, 0.0)
    assert fr is not None
    expected = fr[0]
    del expected["log"]["file"], expected["log"]["offset"]
    expected["host"]["name"] = "node-1"          # host.hostname stays the line's (ecs: add)
    expected.update(systemd={"unit": "node.service"}, process={"pid": 7})
    expected["log"]["syslog"] = {"priority": 6}
    assert r[0] == expected
    out: list[bytes] = []
    b.build_source([source_event(e)], out, 0.0)
    assert f'"_id":"{doc_id(e.cursor)}"'.encode() in out[0]


async def test_multiline_groups_per_unit_and_pid_from_a_real_journal(tmp_path: Path) -> None:
    j = Journal(tmp_path / "j")
    j.append(j.entry("Error: a", pid=1), j.entry("Error: b", pid=2), j.entry("    at a.js:1", pid=1),
             j.entry("    at b.js:2", pid=2), j.entry("Error: c", pid=1), j.entry("next b", pid=2))
    reader, _, _ = make_reader(j)
    asm = JournalAssembler(MultilineConfig(start=r"^\S", timeout_s=60.0))
    try:
        got = asm.feed(await take(reader, 6), 0.0)
    finally:
        await reader.close()
    assert [(e.pid, e.message) for e in got] == [(1, b"Error: a\n    at a.js:1"), (2, b"Error: b\n    at b.js:2")]
    assert asm.position is not None and asm.position.seqnum == 4      # entry 5 begins a held group
    assert [e.cursor.seqnum for e in asm.flush()] == [5, 6]


async def test_lag_from_the_head(tmp_path: Path) -> None:
    j = Journal(tmp_path / "j")
    j.append("a", "b", "c", j.entry("w", unit="web.service"))
    reader, _, _ = make_reader(j)
    try:
        got = await take(reader, 4)
        assert (await reader.lag(got[0].cursor)).entries == 3
        assert (await reader.lag(got[-1].cursor)).entries == 0
        lag = await reader.lag(got[0].cursor)
        assert lag.seconds is not None and lag.seconds > 0
        head = await read_head("journalctl", str(j.directory), ("app",))
        assert head is not None and head.seqnum == 3
        assert read_head_sync("journalctl", str(j.directory), ()) == got[-1].cursor
        assert await read_head("journalctl", str(tmp_path / "empty"), ()) is None
    finally:
        await reader.close()


def test_check_counts_matching_entries(tmp_path: Path) -> None:
    j = Journal(tmp_path / "j")
    j.append("a", "b", j.entry("w", unit="web.service"))
    assert check_journal(str(j.directory), ()).entries == 3
    c = check_journal(str(j.directory), ("web",))
    assert (c.is_readable, c.entries, c.is_capped) == (True, 1, False)
    c = check_journal(str(j.directory), (), max_entries=2)
    assert (c.entries, c.is_capped) == (2, True)
    c = check_journal(str(tmp_path / "nope"), ())
    assert not c.is_readable and "no such directory" in c.detail
    c = check_journal(str(j.directory), (), executable=str(tmp_path / "no-journalctl"))
    assert not c.is_readable


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to drop to another user")
def test_check_says_when_the_journal_is_not_readable(tmp_path: Path) -> None:
    j = Journal(tmp_path / "j")
    j.append("a")
    os.chmod(tmp_path, 0o755)
    exe = _script(tmp_path / "as-nobody", "exec setpriv --reuid=65534 --regid=65534 --clear-groups journalctl \"$@\"\n")
    c = check_journal(str(j.directory), (), executable=exe)
    assert not c.is_readable and "systemd-journal" in c.detail


def test_telemetry_logs_and_counts(caplog: pytest.LogCaptureFixture) -> None:
    from shipper.metrics import Metrics, TelemetryEvents
    m = Metrics()
    t = TelemetryEvents(m)
    t.journal_started("journald:system", None, ["journalctl"])   # per input: every journal counter at 0
    rendered = m.render()
    for name in ("gaps_total", "entries_lost_total", "reader_restarts_total", "entries_skipped_total"):
        assert f'shipper_journal_{name}{{input="journald:system"}} 0' in rendered
    assert "\nshipper_journal_gaps_total 0" not in rendered      # no unlabelled sample beside them
    caplog.clear()
    with caplog.at_level("DEBUG", logger="shipper"):
        t.journal_gap("journald:system", Gap("vacuumed", "s=a;i=1", "s=a;i=9", 7, 1.5))
        t.journal_reader_exited("journald:system", 1, "failed", "boom", 1, 0.5)
        t.journal_reader_exited("journald:system", 1, "failed", "boom", 2, 1.0)
        t.journal_entry_skipped("journald:system", "invalid JSON")
    assert m.get("shipper_journal_gaps_total", input="journald:system") == 1
    assert m.get("shipper_journal_entries_lost_total", input="journald:system") == 7
    assert m.get("shipper_journal_reader_restarts_total", input="journald:system") == 2
    assert m.get("shipper_journal_entries_skipped_total", input="journald:system") == 1
    levels = [(r.getMessage(), r.levelname) for r in caplog.records]
    assert levels == [("journal entries lost before they were read", "WARNING"), ("journal reader exited", "WARNING"),
                      ("journal reader exited", "DEBUG"), ("journal entry skipped", "WARNING")]
