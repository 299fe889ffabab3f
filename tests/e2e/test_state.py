"""State on a bad day (issue 19), the daemon as a subprocess: a spool damaged while it was stopped
(exit 3 naming the file, `state check`, `state repair`, then a start that ships), and a queued
record that turns to garbage while it runs (quarantined, never a crash).

Oracle: every line written is in Elasticsearch exactly once, or inside a range that `state
repair` (or the quarantine log line) named as lost; the daemon is alive or exited as expected."""

from __future__ import annotations

import json
import os
import random
import re
import sqlite3
from pathlib import Path
from typing import Any

from tests.support.daemon import Daemon, write_config
from tests.support.es import ES
from tests.support.proxy import FaultProxy
from tests.support.wait import wait_until
from tests.support.writer import pino_line, write_lines


def _line(seq: int) -> bytes:
    # random padding: gzip cannot shrink a batch below a page, so bodies take overflow pages
    return pino_line(seq, pad=random.Random(seq).randbytes(120).hex())


def _offsets(path: Path) -> dict[int, int]:
    """seq -> byte offset of its line in the file."""
    out, off = {}, 0
    with open(path, "rb") as f:
        for raw in f:
            out[int(json.loads(raw)["seq"])] = off
            off += len(raw)
    return out


def _setup(tmp_path: Path, url: str, daemon_factory: Any) -> tuple[Path, Daemon, Path]:
    logs = tmp_path / "logs"
    logs.mkdir()
    cfg = write_config(tmp_path, es_url=url, paths=str(logs / "*.log"),
                       extra_yaml={"output": {"elasticsearch": {"bulk_max_events": 40}}, "shutdown_timeout": "2s"})
    d = daemon_factory(cfg)
    d.wait_ready()
    return logs / "app.log", d, tmp_path / "state" / "spool" / "cache.db"


def _queued(d: Daemon, n: int) -> None:
    wait_until(lambda: d.status_json()["queue"]["events"] == n, f"{n} events queued")


def _ranges(text: str, heading: str) -> list[tuple[str, int, int | None]]:
    """The `path  offsets A-B` lines under `heading` in `shipper state repair`'s output."""
    out, inside = [], False
    for line in text.splitlines():
        if not line.startswith(" "):
            inside = line.startswith(heading)
            continue
        m = re.match(r"\s+(\S+)\s+offsets (\d+|\?)-(\d+|\?)", line)
        if inside and m:
            out.append((m.group(1), 0 if m.group(2) == "?" else int(m.group(2)),
                        None if m.group(3) == "?" else int(m.group(3))))
    return out


def test_a_spool_damaged_while_stopped_exits_3_then_repair_and_a_start_that_ships(
        tmp_path: Path, es: ES, fault_proxy: FaultProxy, daemon_factory: Any) -> None:
    fault_proxy.down()
    app, d, db = _setup(tmp_path, fault_proxy.url, daemon_factory)
    write_lines(app, range(2000), line_fn=_line)
    _queued(d, 2000)
    assert d.terminate() == 0
    size = db.stat().st_size
    assert size > 200_000, size
    with open(db, "r+b") as f:                 # 4 KiB of garbage in the middle
        f.seek(size // 2 - 2048)
        f.write(random.Random(19).randbytes(4096))

    d.start()
    assert d.wait_exit(20) == 3
    out = d.output(current_run=True)
    assert str(db) in out and "shipper state repair" in out and "damaged" in out
    assert "Traceback" not in out

    check = d.cli("state", "check")
    assert check.returncode == 3, check.stdout + check.stderr
    assert str(db) in check.stdout and "DAMAGED" in check.stdout

    rep = d.cli("state", "repair")
    assert rep.returncode == 0, rep.stdout + rep.stderr
    assert "repaired" in rep.stdout and "spool.damaged-" in rep.stdout
    aside = [p for p in (tmp_path / "state").iterdir() if p.name.startswith("spool.damaged-")]
    assert len(aside) == 1 and (aside[0] / "cache.db").exists()
    lost = _ranges(rep.stdout, "lost:")
    assert d.cli("state", "check").returncode == 0

    fault_proxy.up()
    d.start()
    d.wait_ready()
    write_lines(app, range(2000, 2300), line_fn=_line)
    offsets = _offsets(app)

    def is_lost(seq: int) -> bool:
        return any(p == str(app) and a <= offsets[seq] and (b is None or offsets[seq] < b) for p, a, b in lost)

    maybe_lost = {s for s in range(2300) if is_lost(s)}
    assert not maybe_lost & set(range(2000, 2300))
    assert len(maybe_lost) <= 300, (lost, rep.stdout)             # 4 KiB cost a few batches at most
    wait_until(lambda: d.status_json()["queue"]["events"] == 0 and es.count() >= 2300 - len(maybe_lost),
               lambda: f"the queue drained and {2300 - len(maybe_lost)} documents (have {es.count()})", timeout_s=60)
    docs = es.all_docs()
    seen = [h["_source"]["seq"] for h in docs]
    assert len(seen) == len(set(seen)), "a line indexed twice"
    es.assert_prompt(docs)
    missing = set(range(2300)) - set(seen)
    assert missing <= maybe_lost, f"lines missing that repair did not name: {sorted(missing - maybe_lost)[:10]}"
    assert missing, "the garbage cost nothing? then the test did not damage a record"
    assert d.alive


def test_a_record_that_turns_to_garbage_is_quarantined_and_the_rest_delivered(
        tmp_path: Path, es: ES, fault_proxy: FaultProxy, daemon_factory: Any) -> None:
    fault_proxy.down()
    app, d, db = _setup(tmp_path, fault_proxy.url, daemon_factory)
    write_lines(app, range(800), line_fn=_line)
    _queued(d, 800)
    con = sqlite3.connect(db, timeout=30)
    try:
        (seq, value), = con.execute("SELECT key, value FROM Cache WHERE typeof(key) = 'integer' "
                                    "ORDER BY key DESC LIMIT 1").fetchall()
        con.execute("UPDATE Cache SET value = ? WHERE key = ?", (bytes(value)[:-64] + os.urandom(64), seq))
        con.commit()
    finally:
        con.close()
    fault_proxy.up()
    wait_until(lambda: "corrupt queue record quarantined" in d.output(), "the quarantine log line", timeout_s=60)
    wait_until(lambda: d.status_json()["queue"]["events"] == 0, "the queue drained", timeout_s=60)
    line = next(json.loads(x) for x in d.output().splitlines() if "corrupt queue record quarantined" in x)
    assert line["seq"] == seq and line["level"] in ("warning", "WARNING")
    [r] = line["ranges"]
    assert r["path"] == str(app)
    offsets = _offsets(app)
    # the range is the commit's (every batch of a commit carries its covers): lines to look at
    held = {s for s in range(800) if r["from"] <= offsets[s] < r["to"]}
    docs = es.all_docs()
    seen = [h["_source"]["seq"] for h in docs]
    assert len(seen) == len(set(seen)), "a line indexed twice"
    es.assert_prompt(docs)
    missing = set(range(800)) - set(seen)
    assert missing and missing <= held and len(missing) <= 40, (sorted(missing), r)
    assert d.alive
    st = d.status_json()
    assert st.get("state_dir", {}).get("quarantined") == 1, st


# ---------------------------------------------------------------- state check beside a running daemon

def _files(state: Path) -> dict[str, bytes]:
    """Every file of the state dir and its bytes, but SQLite's -shm: the shared memory of the
    connections (each reader writes its read mark there by design), never data."""
    out = {}
    for root, _dirs, names in os.walk(state):
        for name in names:
            p = Path(root) / name
            if not name.endswith("-shm"):
                out[str(p.relative_to(state))] = p.read_bytes()
    return out


def test_state_check_reads_a_running_daemons_spool_while_it_queues_and_acks(
        tmp_path: Path, es: ES, fault_proxy: FaultProxy, daemon_factory: Any) -> None:
    """SPEC's `state check` checks and reports (0 sound, 3 damaged); a user runs it on a live host.
    It reads beside the running daemon, read-only and without its lock, while lines are written,
    queued in an outage and acked after it, and says the spool is sound each time; `state repair`
    (it rewrites the spool) refuses with exit 1, naming `state check`. The daemon is not disturbed:
    every line exactly once and within the bound."""
    fault_proxy.down()
    app, d, _db = _setup(tmp_path, fault_proxy.url, daemon_factory)
    n_lines = 0
    checks = []
    for k in range(8):
        write_lines(app, range(n_lines, n_lines + 150), line_fn=_line)
        n_lines += 150
        if k == 1:
            _queued(d, n_lines)                 # something queued on disk while it is read
        if k % 3 == 2:
            fault_proxy.up()                    # acks delete rows while the next checks read
        elif k % 3 == 0 and k:
            fault_proxy.down()
        checks.append(d.cli("state", "check"))
        assert d.alive, d.tail()
    for c in checks:
        assert c.returncode == 0, c.stdout + c.stderr
        assert "sound: SQLite quick_check ok, every record decodes" in c.stdout and "nothing to do" in c.stdout, c.stdout
    assert any(re.search(r"held: [1-9]\d* queued records", c.stdout) for c in checks), [c.stdout for c in checks]
    rep = d.cli("state", "repair")
    assert rep.returncode == 1, rep.stdout + rep.stderr
    assert "a daemon is running" in rep.stderr and "stop the daemon first" in rep.stderr \
        and "`shipper state check`" in rep.stderr, rep.stderr
    assert "repaired" not in rep.stdout and not any(p.name.startswith((".repair-", "spool.damaged-"))
                                                    for p in (tmp_path / "state").iterdir())
    fault_proxy.up()
    wait_until(lambda: es.count() >= n_lines, lambda: f"{n_lines} documents (have {es.count()})", timeout_s=60)
    es.assert_exactly_once(range(n_lines))
    assert d.alive and "Traceback" not in d.output(), d.tail(40)
    assert '"level":"error"' not in d.output(), d.tail(40)


def test_state_check_writes_nothing_in_a_killed_daemons_state_dir(
        tmp_path: Path, es: ES, fault_proxy: FaultProxy, daemon_factory: Any) -> None:
    """After kill -9 the WAL holds what was committed last. `state check` opens the spool read-only:
    it neither folds that WAL into the database file (the last read-write connection's close would)
    nor takes and rewrites the state lock; every file of the state dir keeps its bytes. The next
    start then ships everything once."""
    fault_proxy.down()
    app, d, db = _setup(tmp_path, fault_proxy.url, daemon_factory)
    write_lines(app, range(500), line_fn=_line)
    _queued(d, 500)
    d.kill9()
    state = tmp_path / "state"
    before = _files(state)
    assert before.get("spool/cache.db-wal"), "no WAL left by the kill: nothing to fold"
    check = d.cli("state", "check")
    assert check.returncode == 0, check.stdout + check.stderr
    assert "held: " in check.stdout and "nothing to do" in check.stdout, check.stdout
    after = _files(state)
    assert after.keys() == before.keys(), (sorted(before), sorted(after))
    assert [k for k in before if before[k] != after[k]] == []
    fault_proxy.up()
    d.start()
    d.wait_ready()
    wait_until(lambda: es.count() >= 500, lambda: f"500 documents (have {es.count()})", timeout_s=60)
    es.assert_exactly_once(range(500))
    assert d.alive
