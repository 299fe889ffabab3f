"""Every line, promptly (issue 41): what once made a line wait for an event nothing would send.

A line longer than one read (a pino line with a large object or a long stack trace) between
ordinary lines, written once and then nothing more: every line arrives within the promptness
bound, the one over `max_line_bytes` cut and flagged, the next one in time too. A journald input
of one unit, entries written in runs among other units' ones: the last entry of each run arrives
without waiting for the next run. The daemon is a subprocess, osmem the destination; the oracle
is each line exactly once and within the bound.
"""

from __future__ import annotations

import json
import random
import time
from pathlib import Path
from typing import Any

import pytest

from tests.support.daemon import write_config
from tests.support.es import ES
from tests.support.journal import Journal, follower_of, journal_remote
from tests.support.promptness import Timeline
from tests.support.wait import wait_until
from tests.support.writer import append_bytes, pino_line

pytestmark = pytest.mark.slow

INDEX = "prompt"
PATTERN = INDEX + "*"
MAX_LINE = 1024 * 1024          # max_line_bytes' default


def _stack(n: int) -> str:
    """`n` characters of a Node.js stack trace, as pino's err serializer writes it."""
    frame = "\n    at Object.handler (/srv/app/node_modules/some-framework/lib/router/layer.js:95:5)"
    return ("Error: upstream timed out" + frame * (n // len(frame) + 1))[:n]


def six_lines(long_bytes: int) -> list[bytes]:
    """The issue's file: a pino line, invalid UTF-8, one long pino line, NUL bytes inside a line,
    broken JSON, a pino line."""
    pad = long_bytes
    for _ in range(3):          # JSON escapes the stack's newlines: fit the length by trying
        long_line = pino_line(2, msg="request failed", err={"type": "Error", "stack": _stack(pad)})
        pad -= len(long_line) - long_bytes
    return [pino_line(0), b"caf\xe9 \xff\xfe not utf-8\n", long_line, b"nul \x00\x00 inside\n",
            b'{"broken": json\n', pino_line(5)]


@pytest.mark.parametrize("long_bytes", [70_000, 900_000, 2_000_000, 3_000_000])
def test_a_long_line_does_not_stall_the_lines_after_it(tmp_path: Path, es: ES, osmem_clone: Any,
                                                       daemon_factory: Any, timeline: Timeline,
                                                       long_bytes: int) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    cfg = write_config(tmp_path, es_url=osmem_clone.url, paths=[logs / "*.log"],
                       extra_yaml={"output": {"elasticsearch": {"index": INDEX}}})
    d = daemon_factory(cfg)
    d.wait_ready()
    log = logs / "app.log"
    append_bytes(log, pino_line(-1))                # the file is known and read to its end first
    wait_until(lambda: es.count(PATTERN) >= 1, lambda: f"the first line\n{d.tail(20)}")
    lines = six_lines(long_bytes)
    assert abs(len(lines[2]) - long_bytes) < 200
    base = log.stat().st_size
    append_bytes(log, b"".join(lines))              # written once, then nothing more
    written_at = timeline.now()
    offsets, pos = [], base
    for ln in lines:
        offsets.append(pos)
        pos += len(ln)
    wait_until(lambda: es.count(PATTERN) >= 7, lambda: f"7 documents (have {es.count(PATTERN)})\n{d.tail(20)}",
               timeout_s=60)
    docs = es.assert_exactly_once([0, *offsets], key_fn=lambda h: h["_source"]["log"]["offset"], index=PATTERN,
                                  written={0: timeline.written[-1], **{o: written_at for o in offsets}})
    by = {h["_source"]["log"]["offset"]: h["_source"] for h in docs}
    long_doc = by[offsets[2]]
    if len(lines[2]) - 1 > MAX_LINE:
        # cut, the pino line is no JSON any more: shipped as text, flagged both ways
        assert sorted(long_doc["log"]["flags"]) == ["json_parse_failed", "truncated"]
        assert len(long_doc["message"].encode()) <= MAX_LINE and long_doc["message"].startswith('{"level":30')
    else:
        assert long_doc["seq"] == 2 and long_doc["err"]["stack"] == json.loads(lines[2])["err"]["stack"]
        assert "flags" not in long_doc["log"]
    assert by[offsets[5]]["seq"] == 5 and by[offsets[0]]["seq"] == 0
    assert by[offsets[3]]["message"] == "nul \x00\x00 inside"
    assert by[offsets[4]]["log"]["flags"] == ["json_parse_failed"]
    assert d.alive, d.tail()


# ---------------------------------------------------------------- journald: the last entry of a run

def _journal_key(h: dict[str, Any]) -> Any:
    src = h["_source"]
    return src["seq"] if "seq" in src else src["message"]


@pytest.mark.skipif(journal_remote() is None, reason="systemd-journal-remote is not installed")
def test_every_journal_entry_of_a_unit_arrives_promptly(tmp_path: Path, es: ES, osmem_clone: Any,
                                                        daemon_factory: Any, timeline: Timeline) -> None:
    """The issue's run: `units: [app.service]`, 2,000 pino entries and 10 text ones (two of several
    lines) of the unit with other units' entries between them, half written before the start and
    the rest in six runs while running; each one arrives, once, within the bound (the last entry
    of a run included: nothing written after it)."""
    rng = random.Random(41)
    j = Journal(tmp_path / "journal")
    written: dict[Any, float] = {}
    entries: list[tuple[Any, list[tuple[str, Any]]]] = []
    texts = 0
    for seq in range(2000):
        if seq % 200 == 99:
            msg = f"worker {texts} finished" if texts % 5 else \
                f"Error: job {texts} failed\n    at run (/srv/worker.js:12:9)\n    at process (node:internal/timers:1:1)"
            entries.append((msg, j.entry(msg, unit="app.service", pid=777)))
            texts += 1
        line = json.dumps({"level": 30, "time": 1_790_000_000_000 + seq, "pid": 4242, "seq": seq, "msg": "request completed"})
        entries.append((seq, j.entry(line, unit="app.service")))
        for _ in range(rng.randint(0, 2)):
            entries.append((None, j.entry(f"other unit {rng.random()}", unit=rng.choice(["db.service", "cron.service"]))))

    def append(part: list[tuple[Any, list[tuple[str, Any]]]]) -> None:
        j.append(*[e for _, e in part])
        t = timeline.now()
        written.update((k, t) for k, _ in part if k is not None)

    half = len(entries) // 2
    append(entries[:half])
    cfg = write_config(tmp_path, es_url=osmem_clone.url, paths=[tmp_path / "unused.log"],
                       extra_yaml={"inputs": [{"journald": {"directory": str(j.directory), "units": ["app.service"]}}],
                                   "output": {"elasticsearch": {"index": INDEX}}})
    d = daemon_factory(cfg)
    d.wait_ready()
    rest = entries[half:]
    cuts = sorted(rng.sample(range(1, len(rest)), 5))
    for a, b in zip([0, *cuts], [*cuts, len(rest)], strict=True):
        append(rest[a:b])
        time.sleep(rng.uniform(0.2, 1.5))        # pacing, not synchronisation: runs apart, as an app writes
    keys = [k for k, _ in entries if k is not None]
    assert len(keys) == 2010
    wait_until(lambda: es.count(PATTERN) >= len(keys),
               lambda: f"{len(keys)} documents (have {es.count(PATTERN)})\n{d.tail(20)}", timeout_s=60)
    docs = es.assert_exactly_once(keys, key_fn=_journal_key, index=PATTERN, written=written)
    assert {h["_source"]["systemd"]["unit"] for h in docs} == {"app.service"}
    assert d.alive, d.tail()


@pytest.mark.skipif(journal_remote() is None, reason="systemd-journal-remote is not installed")
def test_an_entry_journalctl_looked_at_mid_write_arrives_promptly(tmp_path: Path, es: ES, osmem_clone: Any,
                                                                  daemon_factory: Any, timeline: Timeline) -> None:
    """The cause of the issue's lagging entry: the daemon's `journalctl --follow` looks at the file
    while the run's last entry is counted in its header but not yet listed under its unit, and from
    then on skips the file (its count unchanged) until another entry lands in it. Each run here ends
    that way and nothing is written after it: the entry arrives within the bound all the same (the
    source sees the files settle past what journalctl printed and asks it again), once."""
    j = Journal(tmp_path / "journal")
    cfg = write_config(tmp_path, es_url=osmem_clone.url, paths=[tmp_path / "unused.log"],
                       extra_yaml={"inputs": [{"journald": {"directory": str(j.directory), "units": ["app.service"]}}],
                                   "output": {"elasticsearch": {"index": INDEX}}})
    j.append(j.entry("before the start", unit="db.service"))
    d = daemon_factory(cfg)
    d.wait_ready()
    written: dict[Any, float] = {}
    keys: list[int] = []
    for run in range(3):
        part = []
        for i in range(20):
            seq = run * 100 + i
            line = json.dumps({"level": 30, "time": 1_790_000_000_000 + seq, "pid": 4242, "seq": seq, "msg": "ok"})
            part.append(j.entry(line, unit="app.service"))
            part.append(j.entry(f"other {seq}", unit="db.service"))
            keys.append(seq)
        part.pop()                                  # the run ends with the unit's entry
        j.append_caught(follower_of(d.pid), *part)
        t = timeline.now()
        written.update((k, t) for k in keys if k not in written)
        wait_until(lambda: es.count(PATTERN) >= len(keys),
                   lambda: f"{len(keys)} documents (have {es.count(PATTERN)})\n{d.tail(20)}", timeout_s=30)
    es.assert_exactly_once(keys, key_fn=_journal_key, index=PATTERN, written=written)
    assert d.metric("shipper_journal_reader_restarts_total") >= 3, d.tail()
    assert "journal reader missed an entry" in d.output()
    assert d.alive, d.tail()
