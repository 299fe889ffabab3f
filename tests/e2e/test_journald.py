"""The journald input end to end: `shipper run` as a subprocess reading real journal files
(systemd-journal-remote writes them, the daemon's journalctl child reads them), osmem-server as
Elasticsearch.

Every test ends with the oracle: each entry written is in Elasticsearch exactly once (by the
pino `seq` in its MESSAGE, or by its `_id`), or is known lost (vacuumed before it was read), and
the daemon is alive. `_id`s come from the entry's cursor (`j-<seqnum id>-<seqnum>`).
"""

from __future__ import annotations

import os
import random
import signal
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson
import pytest

from shipper.sources.journald.cursor import journal_key, parse_cursor
from tests.support.daemon import Daemon, write_config
from tests.support.es import ES
from tests.support.journal import Journal, journal_remote
from tests.support.promptness import Timeline
from tests.support.wait import wait_until

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(journal_remote() is None, reason="systemd-journal-remote is not installed")]

INDEX = "journal"
T0_MS = 1_790_000_000_000


def pino(seq: int, msg: str = "request completed", **extra: Any) -> str:
    return orjson.dumps({"level": 30, "time": T0_MS + seq, "pid": 4242, "hostname": "testhost", "seq": seq,
                         "msg": msg, **extra}).decode()


def config(tmp_path: Path, es_url: str, journal: Journal, *, units: list[str] | None = None,
           input_extra: dict[str, Any] | None = None, more_inputs: list[dict[str, Any]] | None = None,
           **extra: Any) -> Path:
    the_input: dict[str, Any] = {"journald": {"directory": str(journal.directory), "units": units or []}}
    the_input.update(input_extra or {})
    es_extra = extra.pop("es", {})
    return write_config(tmp_path, es_url=es_url, paths=[tmp_path / "unused.log"],
                        extra_yaml={"inputs": [the_input, *(more_inputs or [])],
                                    "output": {"elasticsearch": {"index": INDEX, **es_extra}}, **extra})


def count(es: ES) -> int:
    return es.count(INDEX + "*")


def wait_count(es: ES, n: int, daemon: Daemon, timeout_s: float = 30.0) -> None:
    wait_until(lambda: count(es) >= n, lambda: f"{n} documents in {INDEX} (have {count(es)})\n{daemon.tail(30)}",
               timeout_s=timeout_s, interval_s=0.1)


def key_of(journal: Journal, units: list[str] | None = None) -> str:
    return journal_key(str(journal.directory), units or [])


def journald_row(d: Daemon) -> dict[str, Any]:
    (row,) = d.status_json()["journald"]
    return row


def iso_ms(epoch_ms: int) -> str:
    return datetime.fromtimestamp(epoch_ms / 1000, tz=UTC).strftime("%Y-%m-%dT%H:%M:%S.") + \
        f"{epoch_ms % 1000:03d}Z"


def cursors_by_seq(journal: Journal) -> dict[int, str]:
    """seq (from the pino MESSAGE) -> the entry's cursor, as journalctl reads the files back."""
    out = {}
    for e in journal.read():
        msg = e.get("MESSAGE")
        if isinstance(msg, str) and msg.startswith("{"):
            out[orjson.loads(msg)["seq"]] = e["__CURSOR"]
    return out


def id_of(cursor: str) -> str:
    c = parse_cursor(cursor)
    assert c is not None
    return f"j-{c.seqnum_id}-{c.seqnum}"


def assert_clean(d: Daemon) -> None:
    assert d.alive, d.tail()
    assert "Traceback" not in d.output(), d.tail(80)


# ---------------------------------------------------------------- entries while running, the fields, status

def test_entries_appended_while_running_arrive_once_with_the_journal_fields(
        tmp_path: Path, es: ES, osmem_clone: Any, daemon_factory: Any) -> None:
    j = Journal(tmp_path / "journal")
    j.append(*[pino(i) for i in range(20)])                 # there before the start
    d = daemon_factory(config(tmp_path, osmem_clone.url, j))
    d.wait_ready()
    for start in range(20, 220, 50):                        # and appended while running
        j.append(*[j.entry(pino(i), priority=3 if i % 2 else 6) for i in range(start, start + 50)])
        wait_count(es, start + 50, d)
    docs = es.assert_exactly_once(range(220), index=INDEX)
    cursors = cursors_by_seq(j)
    for hit in docs:
        src = hit["_source"]
        seq = src["seq"]
        assert hit["_id"] == id_of(cursors[seq])
        assert src["@timestamp"] == iso_ms(T0_MS + seq)
        assert src["message"] == "request completed"
        assert src["host"] == {"name": "testhost", "hostname": "testhost"}     # _HOSTNAME; the line's (ecs)
        assert src["systemd"] == {"unit": "app.service"} and src["process"] == {"pid": 4242}
        # pino's level wins over PRIORITY for log.level; the priority is kept as a number
        assert src["log"] == {"level": "info", "syslog": {"priority": 3 if seq >= 20 and seq % 2 else 6}}
    key = key_of(j)
    wait_until(lambda: journald_row(d)["lag_entries"] == 0, lambda: f"no lag: {journald_row(d)}")
    row = journald_row(d)
    assert row["directory"] == str(j.directory) and row["units"] == [] and row["cursor"] == cursors[219]
    assert d.status_json()["files"] == []
    # the gauges are sampled apart from status.json (every couple of seconds): wait for them too
    lag = f'shipper_journal_lag_entries{{input="{key}"}}'
    wait_until(lambda: d.metrics().get(lag) == 0, lambda: f"{lag} == 0: {d.metrics().get(lag)}")
    m = d.metrics()
    assert m[f'shipper_journal_gaps_total{{input="{key}"}}'] == 0
    assert m["shipper_events_read_total"] >= 220
    assert_clean(d)


# ---------------------------------------------------------------- kill -9 while entries arrive

class EntryWriter(threading.Thread):
    """Appends pino entries in small batches (each batch one journal-remote run) until stopped."""

    def __init__(self, journal: Journal, batch: int = 20, pause_s: float = 0.02) -> None:
        super().__init__(daemon=True)
        self.journal = journal
        self.batch = batch
        self.pause_s = pause_s
        self.count = 0
        self.error: BaseException | None = None
        self._halt = threading.Event()

    def run(self) -> None:
        try:
            while not self._halt.is_set():
                self.journal.append(*[pino(i) for i in range(self.count, self.count + self.batch)])
                self.count += self.batch
                self._halt.wait(self.pause_s)          # pacing, not synchronisation
        except BaseException as e:  # noqa: BLE001 - reported by stop()
            self.error = e

    def wait_more(self, n: int, what: str) -> None:
        target = self.count + n
        wait_until(lambda: self.count >= target, what)

    def stop(self) -> int:
        self._halt.set()
        self.join(30)
        if self.error is not None:
            raise self.error
        return self.count


def wait_progress(es: ES, d: Daemon, before: int) -> None:
    wait_until(lambda: count(es) > before, lambda: f"progress since the last kill ({before})\n{d.tail(20)}",
               timeout_s=30, interval_s=0.05)


def test_kill9_at_random_moments_while_entries_arrive(tmp_path: Path, es: ES, osmem_clone: Any,
                                                      daemon_factory: Any) -> None:
    rng = random.Random(int(os.environ.get("JOURNALD_KILL_SEED", "15")))
    j = Journal(tmp_path / "journal")
    j.append(pino(-1, "before the start"))
    d = daemon_factory(config(tmp_path, osmem_clone.url, j, es={"bulk_max_events": 200}))
    d.wait_ready()
    w = EntryWriter(j)
    w.start()
    kills = 0
    try:
        for _ in range(int(os.environ.get("JOURNALD_KILLS", "4"))):
            wait_progress(es, d, count(es))
            time.sleep(rng.uniform(0.0, 0.4))           # not synchronisation: a random instant mid-stream
            d.kill9()
            kills += 1
            w.wait_more(40, "entries written while the daemon is down")
            d.start()
            d.wait_ready()
    finally:
        written = w.stop()
    wait_count(es, written + 1, d, timeout_s=60)
    docs = es.assert_exactly_once(range(-1, written), index=INDEX)
    assert len({h["_id"] for h in docs}) == written + 1
    print(f"\njournald kill -9: {written + 1} entries written, {len(docs)} documents arrived, "
          f"0 duplicates, after {kills} kill -9s")
    wait_until(lambda: journald_row(d)["lag_entries"] == 0, lambda: f"no lag: {journald_row(d)}")
    assert_clean(d)


def journalctl_children(pid: int) -> list[int]:
    """The journalctl processes whose parent is `pid` (from /proc)."""
    out = []
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            stat = (p / "stat").read_text()
            comm = (p / "comm").read_text().strip()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        if ppid == pid and comm == "journalctl":
            out.append(int(p.name))
    return out


def test_the_journalctl_child_dies_with_a_daemon_killed_alone(tmp_path: Path, es: ES, osmem_clone: Any,
                                                              daemon_factory: Any) -> None:
    """kill -9 of the daemon's pid only (the OOM killer's way, not the process group): its
    following journalctl must not linger (systemd's journalctl ends when its stdout hangs up,
    even with no entry to write), and the next start resumes exactly once."""
    j = Journal(tmp_path / "journal")
    j.append(*[pino(i) for i in range(50)])
    d = daemon_factory(config(tmp_path, osmem_clone.url, j))
    d.wait_ready()
    wait_count(es, 50, d)
    assert d.pid is not None
    main_pid = d.pid
    wait_until(lambda: journalctl_children(main_pid), lambda: "a journalctl child of the daemon")
    (child,) = journalctl_children(main_pid)
    os.kill(main_pid, signal.SIGKILL)
    assert d.proc is not None
    d.proc.wait(timeout=10)

    def child_gone() -> bool:
        try:
            return (Path("/proc") / str(child) / "stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
        except OSError:
            return True
    wait_until(child_gone, lambda: f"journalctl {child} ended after the daemon's kill -9", timeout_s=10)
    j.append(*[pino(i) for i in range(50, 80)])
    d.start()
    d.wait_ready()
    wait_count(es, 80, d)
    es.assert_exactly_once(range(80), index=INDEX)
    assert_clean(d)


# ---------------------------------------------------------------- entries written while stopped

def test_entries_written_while_stopped_arrive_at_the_next_start(tmp_path: Path, es: ES, osmem_clone: Any,
                                                                daemon_factory: Any) -> None:
    j = Journal(tmp_path / "journal")
    j.append(*[pino(i) for i in range(100)])
    d = daemon_factory(config(tmp_path, osmem_clone.url, j))
    d.wait_ready()
    wait_count(es, 100, d)
    wait_until(lambda: journald_row(d)["lag_entries"] == 0, lambda: f"no lag: {journald_row(d)}")
    assert d.terminate() == 0
    j.new_boot()                                            # as after a reboot: the old boot must still be read
    j.append(*[pino(i) for i in range(100, 250)])
    cursors = cursors_by_seq(j)
    stopped = d.status_json()                               # read from the spool: the stored cursor
    assert stopped["daemon"] == "stopped"
    (row,) = stopped["journald"]
    assert row["cursor"] == cursors[99] and row["lag_entries"] == 150
    assert stopped["files"] == []
    assert "journal:" in d.cli("status").stdout
    d.start()
    d.wait_ready()
    wait_count(es, 250, d)
    es.assert_exactly_once(range(250), index=INDEX)
    wait_until(lambda: journald_row(d)["cursor"] == cursors[249], lambda: f"the newest cursor: {journald_row(d)}")
    assert_clean(d)


# ---------------------------------------------------------------- rotation

def test_journal_file_rotation_while_running_and_while_stopped(tmp_path: Path, es: ES, osmem_clone: Any,
                                                               daemon_factory: Any) -> None:
    j = Journal(tmp_path / "journal")
    j.append(*[pino(i) for i in range(50)], then_rotate=True)
    d = daemon_factory(config(tmp_path, osmem_clone.url, j))
    d.wait_ready()
    wait_count(es, 50, d)
    j.append(*[pino(i) for i in range(50, 100)], then_rotate=True)     # a new file: the next ones go there
    j.append(*[pino(i) for i in range(100, 150)])
    assert len(j.archived()) == 2
    wait_count(es, 150, d)
    assert d.terminate() == 0
    j.append(*[pino(i) for i in range(150, 200)], then_rotate=True)    # rotated while stopped
    j.append(*[pino(i) for i in range(200, 250)])
    assert len(j.archived()) == 3
    d.start()
    d.wait_ready()
    wait_count(es, 250, d)
    es.assert_exactly_once(range(250), index=INDEX)
    assert d.metric("shipper_journal_gaps_total") == 0
    assert_clean(d)


# ---------------------------------------------------------------- a vacuumed gap

def test_a_vacuumed_gap_is_logged_once_counted_and_reading_continues(tmp_path: Path, es: ES, osmem_clone: Any,
                                                                     daemon_factory: Any) -> None:
    j = Journal(tmp_path / "journal")
    j.append(*[pino(i) for i in range(30)])
    d = daemon_factory(config(tmp_path, osmem_clone.url, j))
    d.wait_ready()
    wait_count(es, 30, d)
    assert d.terminate() == 0
    # while stopped: 40 more entries in the file the cursor is in, which is then archived and vacuumed
    j.append(*[pino(i) for i in range(30, 70)], then_rotate=True)
    j.append(*[pino(i) for i in range(70, 100)])
    j.vacuum()
    d.start()
    d.wait_ready()
    wait_count(es, 60, d)
    j.append(*[pino(i) for i in range(100, 120)])           # it goes on
    wait_count(es, 80, d)
    expected = [*range(30), *range(70, 120)]
    es.assert_exactly_once(expected, index=INDEX)
    key = key_of(j)
    assert d.metric("shipper_journal_gaps_total", input=key) == 1
    assert d.metric("shipper_journal_entries_lost_total", input=key) == 40
    assert d.output().count("journal entries lost before they were read") == 1
    assert_clean(d)


# ---------------------------------------------------------------- unit filter

def test_only_the_configured_units_are_shipped(tmp_path: Path, es: ES, osmem_clone: Any,
                                               daemon_factory: Any) -> None:
    j = Journal(tmp_path / "journal")
    units = ["app.service", "worker.service", "other.service", "app-canary.service"]
    entries = [j.entry(pino(i), unit=units[i % 4]) for i in range(200)]
    j.append(*entries[:100])
    d = daemon_factory(config(tmp_path, osmem_clone.url, j, units=["app", "worker.service"]))
    d.wait_ready()
    j.append(*entries[100:])
    expected = [i for i in range(200) if i % 4 in (0, 1)]
    wait_count(es, len(expected), d)
    docs = es.assert_exactly_once(expected, index=INDEX)
    assert {h["_source"]["systemd"]["unit"] for h in docs} == {"app.service", "worker.service"}
    row = journald_row(d)
    assert row["units"] == ["app", "worker.service"]
    assert_clean(d)


# ---------------------------------------------------------------- pino MESSAGE = the file's document

def test_a_pino_message_gives_the_same_document_as_the_same_line_in_a_file(
        tmp_path: Path, es: ES, osmem_clone: Any, daemon_factory: Any, timeline: Timeline) -> None:
    line = pino(1, "hello", req={"method": "GET", "url": "/x"}, responseTime=12)
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "app.log").write_text(line + "\n")
    j = Journal(tmp_path / "journal")
    j.append(j.entry(line, unit="node.service", pid=31337, priority=6, hostname="node-1"))
    written_at = timeline.now()             # both before the start: they count from it
    file_input = {"paths": [str(logs / "*.log")], "scan_interval": "500ms"}
    d = daemon_factory(config(tmp_path, osmem_clone.url, j, more_inputs=[file_input]))
    d.wait_ready()
    wait_count(es, 2, d)
    docs = es.all_docs(INDEX)
    (from_file,) = [h["_source"] for h in docs if "file" in h["_source"]["log"]]
    (from_journal,) = [h["_source"] for h in docs if "systemd" in h["_source"]]
    es.assert_prompt(docs, key_fn=lambda h: h["_id"], written=lambda h: written_at)
    expected = dict(from_file)
    expected["log"] = {k: v for k, v in from_file["log"].items() if k not in ("file", "offset")}
    expected["log"]["syslog"] = {"priority": 6}
    # the journal's _HOSTNAME and _PID win over the line's hostname and pid; host.hostname stays the line's (ecs)
    expected.update(host={"name": "node-1", "hostname": "testhost"}, systemd={"unit": "node.service"},
                    process={"pid": 31337})
    assert from_journal == expected
    status = d.status_json()
    assert [f["path"] for f in status["files"]] == [str(logs / "app.log")] and len(status["journald"]) == 1
    assert_clean(d)


# ---------------------------------------------------------------- binary and oversized fields

def test_binary_and_oversized_fields(tmp_path: Path, es: ES, osmem_clone: Any, daemon_factory: Any,
                                    timeline: Timeline) -> None:
    j = Journal(tmp_path / "journal")
    big = "b" * (64 * 1024)                                 # over 4 KiB: null without --all
    too_big = "t" * (300 * 1024)                            # over max_line_bytes: cut and flagged
    sent: list[tuple[str, Any]] = [
        ("binary", j.entry(b"bin \xff\xfe tail", priority=3)),
        ("newline", j.entry(b"two\nlines", priority=4)),
        ("big", j.entry(big)),
        ("too_big", j.entry(too_big)),
        ("big_other_field", j.entry("small message", fields={"BLOB": os.urandom(200 * 1024)})),
        ("after", j.entry("after")),
    ]
    j.append(*[e for _, e in sent])
    written_at = timeline.now()
    d = daemon_factory(config(tmp_path, osmem_clone.url, j, input_extra={"max_line_bytes": "256KiB"}))
    d.wait_ready()
    wait_count(es, len(sent), d)
    cursors = [e["__CURSOR"] for e in j.read()]
    hits = es.all_docs(INDEX)
    es.assert_prompt(hits, key_fn=lambda h: h["_id"], written=lambda h: written_at)
    by_id = {h["_id"]: h["_source"] for h in hits}
    assert len(by_id) == len(sent)
    docs = {name: by_id[id_of(c)] for (name, _), c in zip(sent, cursors)}
    assert docs["binary"]["message"].startswith("bin ") and docs["binary"]["message"].endswith(" tail")
    assert docs["binary"]["log"]["level"] == "err"
    assert docs["newline"]["message"] == "two\nlines" and docs["newline"]["log"]["level"] == "warning"
    assert docs["big"]["message"] == big
    assert docs["too_big"]["message"] == too_big[:256 * 1024] and "truncated" in docs["too_big"]["log"]["flags"]
    assert docs["big_other_field"]["message"] == "small message" and "BLOB" not in docs["big_other_field"]
    assert docs["after"]["message"] == "after"
    assert_clean(d)


# ---------------------------------------------------------------- SIGHUP keeps the position

def test_reload_resumes_from_the_committed_cursor(tmp_path: Path, es: ES, osmem_clone: Any,
                                                  daemon_factory: Any) -> None:
    j = Journal(tmp_path / "journal")
    j.append(*[pino(i) for i in range(50)])
    d = daemon_factory(config(tmp_path, osmem_clone.url, j))
    d.wait_ready()
    wait_count(es, 50, d)
    d.send(signal.SIGHUP)
    wait_until(lambda: "config reloaded" in d.output(), "the reload")
    j.append(*[pino(i) for i in range(50, 100)])
    wait_count(es, 100, d)
    es.assert_exactly_once(range(100), index=INDEX)
    assert_clean(d)


# ---------------------------------------------------------------- multiline on shipper's clock

def test_a_multiline_group_stamped_an_hour_ahead_arrives_within_the_bound(
        tmp_path: Path, es: ES, osmem_clone: Any, daemon_factory: Any, timeline: Timeline) -> None:
    """A host whose clock was stepped back, or a sender with a skewed clock via journal-remote:
    the entries are stamped an hour ahead of this host. The multiline timeout counts from when
    shipper read the group's last entry, so the last group of the run goes `timeout` after it was
    read, not an hour later (SPEC: multiline, `timeout`; issue 41)."""
    j = Journal(tmp_path / "journal")
    ahead_us = int((time.time() + 3600) * 1e6)
    d = daemon_factory(config(tmp_path, osmem_clone.url, j,
                              input_extra={"format": "text", "multiline": {"start": r"^\S", "timeout": "300ms"}}))
    d.wait_ready()
    groups = {f"Error {g}": [f"Error {g}", f"    at handler{g} (app.js:{g})", f"    at next (app.js:{g + 1})"]
              for g in range(3)}
    entries = []
    for n, lines in enumerate(groups.values()):
        for k, line in enumerate(lines):
            entries.append(j.entry(line, realtime_us=ahead_us + 1000 * (10 * n + k)))
            entries.append(j.entry(f"other {n} {k}", pid=999, realtime_us=ahead_us + 1000 * (10 * n + k) + 1))
    j.append(*entries)
    written_at = timeline.now()                     # each group complete once this run is written
    wait_count(es, 3 + 9, d)
    hits = es.assert_exactly_once([*groups, *(f"other {n} {k}" for n in range(3) for k in range(3))],
                                  key_fn=lambda h: h["_source"]["message"].split("\n")[0], index=INDEX,
                                  written=lambda h: written_at)
    by_first = {h["_source"]["message"].split("\n")[0]: h["_source"] for h in hits}
    for first, lines in groups.items():
        assert by_first[first]["message"] == "\n".join(lines)
    assert_clean(d)
