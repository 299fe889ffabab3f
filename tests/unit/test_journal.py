"""The journal's pure parts: cursors, entries -> documents per SPEC, multiline per unit and PID with
the position safe to commit, gaps, lag, journalctl's argv, JSON lines from chunks."""

from __future__ import annotations

import re
from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from shipper.config import InputConfig, JournaldConfig, MultilineConfig
from shipper.model import FLAG_MULTILINE_CAPPED, FLAG_TRUNCATED
from shipper.parse.document import DocBuilder
from shipper.sources.journald.cursor import (
    Cursor,
    JournalLag,
    SeqnumTracker,
    classify_exit,
    doc_id,
    follow_argv,
    head_argv,
    journal_key,
    journal_lag,
    parse_cursor,
    probe_argv,
    resume_gap,
    same_entry,
)
from shipper.sources.journald.entries import (
    JournalAssembler,
    JournalEntry,
    LineSplitter,
    decode_entry,
    field_bytes,
    source_event,
)
from tests.support.fake_clock import FakeClock

SID = "53009120234d4672bbf678dbbf1c7cda"
BOOT = "11111111111111111111111111111111"


def cursor_text(i: int, sid: str = SID, t: int = 1_790_000_000_000_000) -> str:
    return f"s={sid};i={i:x};b={BOOT};m={1000 + i:x};t={t + i:x};x=1f2912a946bd0ae0"


def cur(i: int, sid: str = SID, t: int = 1_790_000_000_000_000) -> Cursor:
    c = parse_cursor(cursor_text(i, sid, t))
    assert c is not None
    return c


def raw_entry(i: int, message: Any = "hello", **fields: Any) -> dict[str, Any]:
    c = cursor_text(i)
    e = {"__CURSOR": c, "__REALTIME_TIMESTAMP": str(1_790_000_000_000_000 + i), "__MONOTONIC_TIMESTAMP": "5",
         "_BOOT_ID": BOOT, "MESSAGE": message}
    e.update(fields)
    return e


def entry(i: int, message: Any = "hello", max_bytes: int = 1 << 20, **fields: Any) -> JournalEntry:
    e = decode_entry(raw_entry(i, message, **fields), max_bytes)
    assert isinstance(e, JournalEntry)
    return e


# ---------------------------------------------------------------- cursors

def test_a_cursor_journalctl_prints_is_parsed() -> None:
    text = "s=53009120234d4672bbf678dbbf1c7cda;i=2a;b=11111111111111111111111111111111;m=7d0;t=60a24182d8240;x=2e756eadcfd36944"
    c = parse_cursor(text)
    assert c == Cursor(text, SID, 42, BOOT, 2000, 0x60a24182d8240)


@pytest.mark.parametrize("text", ["", "garbage", "s=abc", "i=1", "s=zz;i=1", "s=ab;i=xyz", "s=ab;i=1;t=nothex",
                                  "s=ab;;i=1", "s=ab;i=1;longkey=1", "s=ab;i=" + "1" * 600])
def test_what_is_no_cursor_is_none(text: str) -> None:
    assert parse_cursor(text) is None


def test_identity_is_the_sequence_number_id_and_number() -> None:
    a = cur(5)
    b = parse_cursor(f"s={SID};i=5")
    assert b is not None and same_entry(a, b)
    assert not same_entry(a, cur(6)) and not same_entry(a, cur(5, sid="ab" * 16))


def test_doc_ids_are_deterministic_and_never_file_ids() -> None:
    assert doc_id(cur(42)) == f"j-{SID}-42" == doc_id(cur(42))
    assert doc_id(cur(42)) != doc_id(cur(42, sid="ab" * 16))
    assert not re.fullmatch(r"[0-9a-f]{12}-\d+", doc_id(cur(42)))   # the shape of a file's _id


def test_journal_key_names_the_journal_and_the_units() -> None:
    assert journal_key(None, ()) == "journald:system"
    assert journal_key("/var/log/journal", ("b.service", "a.service")) == "journald:/var/log/journal?a.service,b.service"


# ---------------------------------------------------------------- entries

def test_field_values_in_every_form_journalctl_prints() -> None:
    assert field_bytes("text ✓") == "text ✓".encode()
    assert field_bytes([98, 255, 10]) == b"b\xff\n"                     # a binary field
    assert field_bytes(["a", [1, 2], "b"]) == b"a\n\x01\x02\nb"          # a repeated field
    assert field_bytes(None) is None and field_bytes(7) == b"7"
    assert field_bytes([300]) == b"300"                                  # not bytes: never raises


def test_an_entry_is_decoded_with_its_fields() -> None:
    e = entry(3, "msg", _HOSTNAME="h1", _SYSTEMD_UNIT="app.service", _PID="42", PRIORITY="3",
              SYSLOG_IDENTIFIER="app", SYSLOG_FACILITY="3")
    assert (e.cursor, e.realtime_us, e.message, e.flags) == (cur(3), 1_790_000_000_000_003, b"msg", 0)
    assert (e.hostname, e.unit, e.pid, e.priority, e.identifier, e.facility) == ("h1", "app.service", 42, 3, "app", 3)


def test_bad_values_are_left_out_and_no_cursor_is_a_reason() -> None:
    e = entry(1, None, _PID="x", PRIORITY="9", _SYSTEMD_UNIT=["a.service", "b.service"])
    assert (e.message, e.pid, e.priority, e.unit) == (b"", None, None, "a.service")
    assert decode_entry([1, 2], 100) == "not a JSON object"
    assert decode_entry({"MESSAGE": "x"}, 100) == "no valid __CURSOR"
    assert decode_entry({"__CURSOR": "junk", "MESSAGE": "x"}, 100) == "no valid __CURSOR"


def test_realtime_falls_back_to_the_cursor() -> None:
    raw = raw_entry(1)
    del raw["__REALTIME_TIMESTAMP"]
    e = decode_entry(raw, 100)
    assert isinstance(e, JournalEntry) and e.realtime_us == 1_790_000_000_000_001


def test_a_message_over_max_line_bytes_is_cut_and_flagged() -> None:
    e = entry(1, "x" * 100, max_bytes=16)
    assert (e.message, e.flags) == (b"x" * 16, FLAG_TRUNCATED)


# ---------------------------------------------------------------- documents

def jbuilder(**inp: Any) -> DocBuilder:
    inp.setdefault("paths", ())
    inp.setdefault("journald", JournaldConfig())
    return DocBuilder(InputConfig(**inp), "logs-%Y.%m.%d", "shipper-host")


def jdoc(e: JournalEntry, **inp: Any) -> dict[str, Any]:
    r = jbuilder(**inp).source_doc(source_event(e))
    assert r is not None
    orjson.dumps(r[0])
    return r[0]


PINO = '{"level":40,"time":1790000000123,"pid":7,"hostname":"h","msg":"disk almost full","seq":3}'


def test_a_pino_message_gives_the_file_document_plus_the_journal_fields() -> None:
    e = entry(9, PINO, _HOSTNAME="node-1", _SYSTEMD_UNIT="app.service", _PID="7", PRIORITY="6")
    d = jdoc(e, fields={"env": "prod"})
    fr = jbuilder(paths=("/x/*.log",), journald=None, fields={"env": "prod"}).to_doc(PINO.encode(), 0, "/x/a.log", 0, 1.0)
    assert fr is not None
    file_doc = fr[0]
    del file_doc["log"]["file"], file_doc["log"]["offset"]
    file_doc["host"]["name"] = "node-1"
    file_doc["systemd"] = {"unit": "app.service"}
    file_doc["process"] = {"pid": 7}
    file_doc["log"]["syslog"] = {"priority": 6}
    assert d == file_doc
    assert d["@timestamp"] == "2026-09-21T14:13:20.123Z"       # pino's time, not the journal's
    assert d["log"]["level"] == "warn" and d["message"] == "disk almost full"


def test_a_text_message_takes_the_journal_time_and_priority() -> None:
    e = entry(1, "plain text", _HOSTNAME="node-1", _SYSTEMD_UNIT="web.service", _PID="12", PRIORITY="3",
              SYSLOG_IDENTIFIER="web")
    d = jdoc(e)
    assert d == {"message": "plain text", "@timestamp": "2026-09-21T14:13:20.000Z",
                 "log": {"level": "err", "syslog": {"priority": 3, "appname": "web"}},
                 "host": {"name": "node-1"}, "systemd": {"unit": "web.service"}, "process": {"pid": 12}}


@pytest.mark.parametrize("prio, name", list(enumerate(["emerg", "alert", "crit", "err", "warning", "notice", "info", "debug"])))
def test_priorities_name_the_level(prio: int, name: str) -> None:
    assert jdoc(entry(1, "x", PRIORITY=str(prio)))["log"]["level"] == name


def test_without_a_hostname_the_shippers_host_and_no_fields_invented() -> None:
    d = jdoc(entry(1, "x"))
    assert d["host"] == {"name": "shipper-host"} and "systemd" not in d and "process" not in d
    assert "log" not in d              # no empty object either


def test_fields_the_line_already_has_are_kept() -> None:
    line = '{"msg":"m","process":{"pid":1,"name":"node"},"systemd":"str","log":{"level":"custom"}}'
    d = jdoc(entry(1, line, _PID="7", _SYSTEMD_UNIT="a.service", PRIORITY="3"))
    assert d["process"] == {"pid": 1, "name": "node"}
    assert d["systemd"] == {"unit": "a.service", "original": "str"}
    assert d["log"]["level"] == "custom" and d["log"]["syslog"] == {"priority": 3}


def test_binary_and_oversized_messages_become_documents() -> None:
    d = jdoc(entry(1, list(b"bad \xff utf8\ttab")))
    assert d["message"] == "bad \ufffd utf8\ttab"
    d = jdoc(entry(2, "y" * 100_000, max_bytes=1024), max_line_bytes=1024)
    assert d["message"] == "y" * 1024 and d["log"]["flags"] == ["truncated"]


def test_build_source_writes_create_pairs_with_the_journal_ids() -> None:
    out: list[bytes] = []
    b = jbuilder()
    n = b.build_source([source_event(entry(1, "a")), source_event(entry(2, PINO))], out, 0.0)
    assert n == sum(map(len, out)) and len(out) == 2
    action, body = out[0].split(b"\n")[:2]
    assert orjson.loads(action) == {"create": {"_index": "logs-2026.09.21", "_id": f"j-{SID}-1"}}
    assert orjson.loads(body)["message"] == "a"
    assert orjson.loads(out[1].split(b"\n")[0])["create"]["_id"] == f"j-{SID}-2"


def test_build_source_ships_json_too_deep_to_serialise_as_text() -> None:
    deep = "{\"a\":" * 300 + "1" + "}" * 300
    out: list[bytes] = []
    jbuilder().build_source([source_event(entry(1, deep))], out, 0.0)
    body = orjson.loads(out[0].split(b"\n")[1])
    assert body["message"] == deep and body["log"]["flags"] == ["json_parse_failed"]


# ---------------------------------------------------------------- multiline per unit and PID

ML = MultilineConfig(start=r"^\S", max_lines=3, timeout_s=1.0)


def ml_entry(i: int, message: str, pid: int, unit: str = "app.service", t_s: float = 0.0) -> JournalEntry:
    return JournalEntry(cur(i), 1_790_000_000_000_000 + int(t_s * 1e6), message.encode(), 0, "h", unit, pid, 6)


def test_without_multiline_every_entry_is_an_event_and_the_position_follows() -> None:
    a = JournalAssembler(None)
    es = [entry(1), entry(2)]
    assert a.feed(es, 0.0) == es and a.position == cur(2)


def test_groups_form_per_unit_and_pid_and_the_position_waits_for_held_groups() -> None:
    a = JournalAssembler(ML)
    out = a.feed([ml_entry(1, "Error A", 10), ml_entry(2, "Error B", 20), ml_entry(3, "  at a1", 10),
                  ml_entry(4, "  at b1", 20), ml_entry(5, "next A", 10)], 0.0)
    assert [(e.cursor.seqnum, e.message) for e in out] == [(1, b"Error A\n  at a1")]
    assert a.position == cur(1)              # entry 2 starts a held group: nothing after 1 is safe
    out = a.feed([ml_entry(6, "next B", 20)], 0.0)
    assert [(e.cursor.seqnum, e.message, e.pid) for e in out] == [(2, b"Error B\n  at b1", 20)]
    assert a.position == cur(4)              # 5 (held) starts the oldest group
    assert [e.cursor.seqnum for e in a.flush()] == [5, 6] and a.position == cur(6)


def test_a_quiet_group_completes_at_its_timeout_on_the_shippers_clock() -> None:
    clock = FakeClock()
    a = JournalAssembler(ML)
    a.feed([ml_entry(1, "Error", 10, t_s=0.0)], clock.monotonic())
    clock.advance(0.5)
    a.feed([ml_entry(2, "  at x", 10, t_s=0.5)], clock.monotonic())
    assert a.next_deadline == pytest.approx(clock.monotonic() + 1.0)    # 1 s after the last was read
    clock.advance(0.9)
    assert a.flush_due(clock.monotonic()) == [] and a.position is None
    clock.advance(0.1)
    done = a.flush_due(clock.monotonic())
    assert [e.message for e in done] == [b"Error\n  at x"] and a.position == cur(2)
    assert a.next_deadline is None


def test_entries_stamped_an_hour_ahead_complete_at_the_timeout_after_they_were_read() -> None:
    """A host whose clock was stepped back, or a skewed sender via journal-remote: the stamps say
    nothing about when the group went quiet here, so they never hold it (issue 41)."""
    clock = FakeClock()
    a = JournalAssembler(ML)
    ahead_s = 3600.0 + clock.time() - 1_790_000_000
    a.feed([ml_entry(1, "Error", 10, t_s=ahead_s), ml_entry(2, "  at x", 10, t_s=ahead_s + 0.1)],
           clock.monotonic())
    assert a.next_deadline == pytest.approx(clock.monotonic() + 1.0)
    clock.advance(1.0)
    done = a.flush_due(clock.monotonic())
    assert [e.message for e in done] == [b"Error\n  at x"] and a.position == cur(2)
    # and one stamped an hour behind the group before it neither joins late nor is held
    a.feed([ml_entry(3, "Error", 10, t_s=ahead_s + 0.2), ml_entry(4, "  at y", 10, t_s=0.0)],
           clock.monotonic())
    clock.advance(1.0)
    assert [e.message for e in a.flush_due(clock.monotonic())] == [b"Error\n  at y"] and a.position == cur(4)


def test_a_continuation_read_after_the_timeout_starts_its_own_event() -> None:
    """As for a file: a line read `timeout` after the last one ends the group before it even when
    flush_due did not run in between (its stamp says it came at once)."""
    clock = FakeClock()
    a = JournalAssembler(ML)
    a.feed([ml_entry(1, "Error", 10, t_s=0.0)], clock.monotonic())
    clock.advance(1.0)
    done = a.feed([ml_entry(2, "  at x", 10, t_s=0.1)], clock.monotonic())
    assert [e.message for e in done] == [b"Error"] and a.position == cur(1)


def test_entry_times_decide_the_timeout_so_a_reread_groups_the_same() -> None:
    es = [ml_entry(1, "Error", 10, t_s=0.0), ml_entry(2, "  late", 10, t_s=5.0), ml_entry(3, "  at", 10, t_s=5.1),
          ml_entry(4, "Other", 10, t_s=5.2)]
    first = JournalAssembler(ML).feed(es, 0.0)
    again = JournalAssembler(ML)
    got = again.feed(es[:2], 0.0) + again.feed(es[2:], 0.0)
    assert [e.message for e in first] == [e.message for e in got] == [b"Error", b"  late\n  at"]


def test_a_group_at_max_lines_is_emitted_capped() -> None:
    a = JournalAssembler(ML)
    out = a.feed([ml_entry(i, "E" if i == 1 else "  x", 10) for i in range(1, 6)], 0.0)
    assert [(e.message, e.flags) for e in out] == [(b"E\n  x\n  x", FLAG_MULTILINE_CAPPED)]
    assert [(e.cursor.seqnum, e.message, e.flags) for e in a.flush()] == [(4, b"  x\n  x", FLAG_MULTILINE_CAPPED)]


# ---------------------------------------------------------------- gaps and lag

def test_resume_gap_decisions() -> None:
    assert resume_gap(cur(5), cur(5)) is None                 # the stored entry is there
    assert resume_gap(cur(5), cur(6)) is None                 # only the stored entry itself was vacuumed
    g = resume_gap(cur(5), cur(50))
    assert g is not None and (g.reason, g.lost_entries, g.after, g.resumed_at) == ("vacuumed", 44, cur(5).text, cur(50).text)
    assert g.seconds == pytest.approx(45e-6)
    other = resume_gap(cur(5), cur(1, sid="ab" * 16))
    assert other is not None and other.lost_entries is None
    empty = resume_gap(cur(5), None)
    assert empty is not None and empty.resumed_at is None


def test_the_tracker_sees_jumps_within_one_sequence_number_id() -> None:
    t = SeqnumTracker()
    t.seed(cur(1))
    assert t.observe(cur(2)) is None and t.observe(cur(1, sid="ab" * 16)) is None
    g = t.observe(cur(10))
    assert g is not None and (g.reason, g.lost_entries) == ("seqnum_jump", 7)
    assert t.observe(cur(11)) is None


def test_lag() -> None:
    assert journal_lag(cur(100), cur(40)).entries == 60
    assert journal_lag(cur(100), cur(40)).seconds == pytest.approx(60e-6)
    assert journal_lag(cur(1), cur(1)) == JournalLag(0, 0.0)
    assert journal_lag(cur(3, sid="ab" * 16), cur(1)).entries is None
    assert journal_lag(None, cur(1)).entries == 0 and journal_lag(cur(1), None).entries is None


# ---------------------------------------------------------------- argv

def test_follow_argv_resumes_inclusively_and_always_merges() -> None:
    argv = follow_argv("journalctl", "/j", ("app", "web.service", "getty@tty1"), "s=1;i=2", "beginning")
    assert argv[:5] == ["journalctl", "--merge", "--no-pager", "--output=json", "--directory=/j"]
    assert "--all" in argv and "--follow" in argv and "--cursor=s=1;i=2" in argv
    assert "--no-tail" in argv         # --follow implies --lines=10: only ten entries from the cursor
    assert argv[-3:] == ["_SYSTEMD_UNIT=app.service", "_SYSTEMD_UNIT=web.service", "_SYSTEMD_UNIT=getty@tty1.service"]
    assert not any(a.startswith(("--after-cursor", "--boot", "-b")) for a in argv)
    assert "--no-tail" in follow_argv("journalctl", None, (), None, "beginning")
    assert "--lines=0" in follow_argv("journalctl", None, (), None, "end")
    assert not any(a.startswith("--directory") for a in follow_argv("journalctl", None, (), None, "end"))


def test_probe_and_head_argv() -> None:
    assert "--lines=1" in head_argv("journalctl", None, ("a",)) and head_argv("journalctl", None, ("a",))[-1] == "_SYSTEMD_UNIT=a.service"
    p = probe_argv("journalctl", "/j", "s=1;i=2")
    assert "--cursor=s=1;i=2" in p and not any(a.startswith("_SYSTEMD_UNIT") for a in p) and "--follow" not in p


def test_exit_kinds() -> None:
    assert classify_exit(1, "Failed to seek to cursor: Invalid argument") == "cursor_invalid"
    assert classify_exit(1, "No journal files were opened due to insufficient permissions.") == "no_permission"
    assert classify_exit(1, "Failed to open /x: No such file or directory") == "no_directory"
    assert classify_exit(137, "") == "failed"


# ---------------------------------------------------------------- lines from chunks

@given(st.lists(st.binary(max_size=40).map(lambda b: b.replace(b"\n", b"")), max_size=30),
       st.lists(st.integers(min_value=1, max_value=50), min_size=1, max_size=20))
def test_lines_come_out_whole_whatever_the_chunking(lines: list[bytes], cuts: list[int]) -> None:
    data = b"".join(line + b"\n" for line in lines)
    sp = LineSplitter(max_bytes=1000)
    got: list[bytes] = []
    pos = 0
    k = 0
    while pos < len(data):
        n = cuts[k % len(cuts)]
        k += 1
        out, dropped = sp.feed(data[pos:pos + n])
        assert dropped == 0
        got.extend(out)
        pos += n
    assert got == lines and sp.pending_bytes == 0


@given(st.lists(st.integers(min_value=0, max_value=40), min_size=1, max_size=20),
       st.integers(min_value=1, max_value=25))
def test_lines_over_the_limit_are_dropped_and_counted(sizes: list[int], chunk: int) -> None:
    lines = [bytes([65 + i % 26]) * n for i, n in enumerate(sizes)]
    data = b"".join(line + b"\n" for line in lines)
    sp = LineSplitter(max_bytes=20)
    got: list[bytes] = []
    dropped = 0
    for pos in range(0, len(data), chunk):
        out, d = sp.feed(data[pos:pos + chunk])
        got.extend(out)
        dropped += d
    assert got == [line for line in lines if len(line) <= 20]
    assert dropped == sum(1 for line in lines if len(line) > 20)


def test_the_status_item_spec_names() -> None:
    from shipper.sources.journald.cursor import status_entry
    assert status_entry("/j", ("a.service",), cursor_text(40), cur(100)) == {
        "directory": "/j", "units": ["a.service"], "cursor": cursor_text(40), "lag_entries": 60,
        "lag_seconds": pytest.approx(60e-6)}
    assert status_entry(None, (), None, cur(1))["lag_entries"] is None
    # queued up to 40, acknowledged up to 30: the lag counts from what is acknowledged
    row = status_entry("/j", (), cursor_text(40), cur(100), shipped_seqnum=30)
    assert (row["cursor"], row["lag_entries"], row["lag_seconds"]) == (cursor_text(40), 70, None)


def test_the_assemblers_aggregators_keep_no_cuts() -> None:
    """Groups cut by their entries' stamps, by time and at shutdown: nothing is kept for the file
    input's cut records (parse/multiline.py), whose offsets an entry's local number is not."""
    asm = JournalAssembler(MultilineConfig(start=r"^K", timeout_s=1.0))
    asm.feed([ml_entry(i, "K head" if i % 2 == 0 else "  more", 7, t_s=i * 0.8) for i in range(40)], 0.0)
    held = list(asm._aggs.values())
    asm.flush_due(5.0)
    asm.feed([ml_entry(40, "K last", 7, t_s=100.0)], 6.0)
    held += list(asm._aggs.values())
    asm.flush()
    assert held and all(not agg.made_cuts for agg in held)
