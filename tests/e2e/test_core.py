"""The core promise end to end: `shipper run` as a subprocess, osmem-server as Elasticsearch.

Every test ends with the oracle: each written line is in Elasticsearch exactly once (by its pino
`seq`), and the daemon is alive (or exited as expected). The figures printed by the 10k tests
(run with -s) are the figures quoted in docs/delivery.md ("Figures").
"""

from __future__ import annotations

import os
import random
import re
import socket
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.support.daemon import REPO_ROOT, Daemon, write_config
from tests.support.es import ES
from tests.support.proxy import FaultProxy
from tests.support.rotate import rotate_rename
from tests.support.wait import wait_until
from tests.support.writer import Writer, line_offsets, write_lines

pytestmark = pytest.mark.slow

INDEX = "core"


def setup_logs(tmp_path: Path) -> Path:
    logs = tmp_path / "logs"          # not tmp_path itself: the daemon's own output lands there
    logs.mkdir()
    return logs


def config(tmp_path: Path, es_url: str, paths: list[Path], **extra: Any) -> Path:
    es_extra = extra.pop("es", {})
    return write_config(tmp_path, es_url=es_url, paths=paths, input_extra=extra.pop("input", None),
                        extra_yaml={"output": {"elasticsearch": {"index": INDEX, **es_extra}}, **extra})


def count(es: ES) -> int:
    return es.count(INDEX + "*")


def wait_count(es: ES, n: int, timeout_s: float = 30.0, daemon: Daemon | None = None) -> None:
    def what() -> str:
        tail = daemon.tail(30) if daemon is not None else ""
        return f"{n} documents in {INDEX} (have {count(es)})\n{tail}"
    wait_until(lambda: count(es) >= n, what, timeout_s=timeout_s, interval_s=0.25)


def iso_ms(epoch_ms: int) -> str:
    return datetime.fromtimestamp(epoch_ms / 1000, tz=UTC).strftime("%Y-%m-%dT%H:%M:%S.") + f"{epoch_ms % 1000:03d}Z"


# ---------------------------------------------------------------- 1. 10,000 lines, every SPEC field

def test_10k_pino_lines_arrive_exactly_once_with_the_spec_fields(tmp_path: Path, es: ES, osmem_clone: Any,
                                                                  daemon_factory: Any) -> None:
    logs = setup_logs(tmp_path)
    log = logs / "app.log"
    write_lines(log, range(10_000))
    cfg = config(tmp_path, osmem_clone.url, [logs / "*.log"], input={"fields": {"env": "test", "team": {"name": "core"}}})
    d = daemon_factory(cfg)
    d.wait_ready()
    t0 = time.monotonic()
    wait_count(es, 10_000, timeout_s=90, daemon=d)
    seconds = time.monotonic() - t0
    print(f"\n10k pino lines -> osmem: {seconds:.1f}s, {10_000 / seconds:.0f} docs/s")

    docs = es.assert_exactly_once(range(10_000), index=INDEX + "*")
    offsets = line_offsets(log)
    source_lines = {orjson.loads(raw)["seq"]: orjson.loads(raw) for raw in log.read_bytes().splitlines()}
    status = d.status_json()
    (f,) = [f for f in status["files"] if f["path"] == str(log)]
    inc = f["incarnation"]
    assert re.fullmatch(r"[0-9a-f]{12}", inc)
    host = socket.gethostname()
    for hit in docs:
        src = hit["_source"]
        line = source_lines[src["seq"]]
        assert hit["_id"] == f"{inc}-{offsets[src['seq']]}"
        assert src["@timestamp"] == iso_ms(line["time"])
        assert src["message"] == line["msg"] and src["msg"] == line["msg"]
        assert src["log"] == {"level": "info", "file": {"path": str(log)}, "offset": offsets[src["seq"]]}
        # SPEC (ECS fields, `ecs: add` the default): host.hostname <- hostname, process.pid <- pid, ...
        assert src["host"] == {"name": host, "hostname": line["hostname"]}
        assert src["process"] == {"pid": line["pid"]} and src["url"]["original"] == line["req"]["url"]
        assert src["http"]["response"]["status_code"] == line["res"]["statusCode"]
        assert src["env"] == "test" and src["team"] == {"name": "core"}
        for k, v in line.items():                  # every field of the line, as it was
            assert src[k] == v, (k, src[k], v)
    # the queue is empty and the file fully shipped, as `shipper status` tells it
    wait_until(lambda: d.status_json()["queue"]["events"] == 0, "an empty queue")
    assert f["size"] == log.stat().st_size
    wait_until(lambda: [x for x in d.status_json()["files"] if x["path"] == str(log)][0]["lag_bytes"] == 0, "no lag")
    assert d.alive


def test_read_and_queue_rate_while_the_output_is_down_and_the_queue_survives_a_stop(
        tmp_path: Path, es: ES, fault_proxy: FaultProxy, daemon_factory: Any) -> None:
    """The shipper's own read+parse+queue rate (Elasticsearch out of the picture); then a SIGTERM
    with the output still down keeps every event durably queued (delivering them is test 1's job)."""
    logs = setup_logs(tmp_path)
    log = logs / "app.log"
    write_lines(log, range(10_000))
    fault_proxy.down()
    d = daemon_factory(config(tmp_path, fault_proxy.url, [logs / "*.log"], shutdown_timeout="500ms"))
    d.wait_ready()
    t0 = time.monotonic()
    wait_until(lambda: d.metric("shipper_queue_events") >= 10_000, "10,000 events queued", timeout_s=60, interval_s=0.01)
    read_s = time.monotonic() - t0
    wait_until(lambda: d.status_json()["queue"]["events"] == 10_000,
               lambda: f"status queue events 10000: {d.status_json()['queue']}", timeout_s=30)
    status_s = time.monotonic() - t0
    print(f"\n10k lines read+parsed+queued with the output down: {read_s:.2f}s after ready "
          f"(~{10_000 / read_s:.0f} events/s, upper bound: polled /metrics every 10 ms); "
          f"`status --json` showed queue.events == 10000 after {status_s:.2f}s")
    assert fault_proxy.forwarded == 0 and d.alive
    assert d.terminate() == 0
    status = d.status_json()                     # the daemon is stopped: read from the spool itself
    assert status["queue"]["events"] == 10_000
    (f,) = [f for f in status["files"] if f["path"] == str(log)]
    assert f["queued_offset"] == log.stat().st_size and f["offset"] == 0
    assert count(es) == 0


# ---------------------------------------------------------------- 2. rename rotation under a writer

def test_rename_rotation_five_times_while_a_writer_appends(tmp_path: Path, es: ES, osmem_clone: Any,
                                                           daemon_factory: Any) -> None:
    logs = setup_logs(tmp_path)
    log = logs / "app.log"
    d = daemon_factory(config(tmp_path, osmem_clone.url, [log]))
    d.wait_ready()
    with Writer(log, rate=400) as w:
        for _ in range(5):
            n = w.count
            wait_until(lambda: w.count >= n + 150, "the writer to append 150 lines to the current file")
            rotate_rename(log, keep=10)
        n = w.count
        wait_until(lambda: w.count >= n + 100, "lines in the newest file")
    written = w.written
    assert len(list(logs.glob("app.log.*"))) == 5
    wait_count(es, len(written), timeout_s=60, daemon=d)
    es.assert_exactly_once(written, index=INDEX + "*")
    assert d.alive


def test_a_writer_appending_line_by_line_loses_nothing_while_shipper_paces_itself(
        tmp_path: Path, es: ES, osmem_clone: Any, daemon_factory: Any) -> None:
    """pino's default destination writes each line on its own. Caught up, shipper sends at most
    one partial batch per flush_min_interval (40 ms) and does not read inotify meanwhile: every
    line written in those pauses is still read, once. (How few requests that makes is measured
    by bench/latency.py: osmem answers too slowly for batches to stay small here anyway.)"""
    logs = setup_logs(tmp_path)
    log = logs / "app.log"
    d = daemon_factory(config(tmp_path, osmem_clone.url, [log]))
    d.wait_ready()
    with Writer(log, rate=500, batch_interval_s=0.002, max_lines=600, keep_open=True) as w:
        wait_until(lambda: w.count >= 600, "the writer to append 600 lines, one write each", timeout_s=30)
    written = w.written
    wait_count(es, len(written), timeout_s=60, daemon=d)
    es.assert_exactly_once(written, index=INDEX + "*")
    assert d.alive


# ---------------------------------------------------------------- 3. kill -9 at random moments

def test_kill9_at_random_moments_while_a_writer_appends(tmp_path: Path, es: ES, osmem_clone: Any,
                                                       daemon_factory: Any) -> None:
    logs = setup_logs(tmp_path)
    log = logs / "app.log"
    rng = random.Random(int(os.environ.get("CORE_KILL_SEED", "7")))
    cfg = config(tmp_path, osmem_clone.url, [log], es={"bulk_max_events": 300})
    d = daemon_factory(cfg)
    d.wait_ready()
    kills = 0
    with Writer(log, rate=250) as w:
        for _ in range(4):
            before = count(es)
            wait_until(lambda: count(es) > before, lambda: f"progress since the last kill ({before})\n{d.tail(20)}",
                       timeout_s=30, interval_s=0.05)
            time.sleep(rng.uniform(0.0, 0.4))        # not synchronisation: a random instant mid-stream
            d.kill9()
            kills += 1
            assert not d.alive
            d.start()
            d.wait_ready()
    written = w.written
    assert kills >= 3
    wait_count(es, len(written), timeout_s=60, daemon=d)
    es.assert_exactly_once(written, index=INDEX + "*")
    assert d.alive
    out = d.output()
    assert "Traceback" not in out, d.tail(80)


# ---------------------------------------------------------------- 4. destination down, then back

def test_destination_down_for_a_while_then_back(tmp_path: Path, es: ES, fault_proxy: FaultProxy,
                                                daemon_factory: Any) -> None:
    logs = setup_logs(tmp_path)
    log = logs / "app.log"
    secret = "pw-" + os.urandom(6).hex()
    fault_proxy.require_basic_auth("shipper", secret)
    cfg = config(tmp_path, fault_proxy.url, [log], es={"username": "shipper", "password": secret})
    d = daemon_factory(cfg)
    d.wait_ready()
    with Writer(log, rate=300) as w:
        wait_until(lambda: count(es) > 100, "first documents through the proxy")
        fault_proxy.down()
        wait_until(lambda: d.metric("shipper_output_up") == 0, "the daemon to see the output down", timeout_s=20)
        n = w.count
        wait_until(lambda: w.count >= n + 600, "600 lines written while the output is down")
        wait_until(lambda: d.status_json()["queue"]["events"] > 0, "events queued while down")
        status = d.status_json()
        assert status["output"]["up"] is False and status["output"]["last_error"]
        assert d.alive and d.health() in (200, 503)
        fault_proxy.up()
        wait_until(lambda: d.metric("shipper_output_up") == 1, "the output up again", timeout_s=20)
    written = w.written
    wait_count(es, len(written), timeout_s=60, daemon=d)
    es.assert_exactly_once(written, index=INDEX + "*")
    wait_until(lambda: d.status_json()["queue"]["events"] == 0, "the queue drained")
    assert d.alive and d.health() == 200
    assert secret not in d.output() and secret not in str(d.status_json())


# ---------------------------------------------------------------- 5. truncation and a file recreated at the same path

def test_truncation_and_a_recreated_file_are_new_incarnations(tmp_path: Path, es: ES, osmem_clone: Any,
                                                              daemon_factory: Any) -> None:
    logs = setup_logs(tmp_path)
    log = logs / "app.log"
    write_lines(log, range(0, 300))
    d = daemon_factory(config(tmp_path, osmem_clone.url, [log]))
    d.wait_ready()
    wait_count(es, 300, daemon=d)
    ino_a = log.stat().st_ino

    # truncate in place (same inode), then fewer bytes than before: a new incarnation from 0
    os.truncate(log, 0)
    write_lines(log, range(1000, 1100))
    wait_count(es, 400, daemon=d)
    assert log.stat().st_ino == ino_a

    # delete and recreate at the same path: the inode is often the one just freed
    log.unlink()
    write_lines(log, range(2000, 2500))
    inode_reused = log.stat().st_ino == ino_a
    wait_count(es, 900, daemon=d)

    # truncate and grow back past the old offset before the daemon looks (the first bytes differ)
    size_before = log.stat().st_size
    with open(log, "r+b") as f:
        f.truncate(0)
    write_lines(log, range(3000, 3700))
    assert log.stat().st_size > size_before
    wait_count(es, 1600, daemon=d)

    expected = [*range(0, 300), *range(1000, 1100), *range(2000, 2500), *range(3000, 3700)]
    docs = es.assert_exactly_once(expected, index=INDEX + "*")
    incarnations = {h["_id"].rsplit("-", 1)[0] for h in docs}
    assert len(incarnations) == 4, (incarnations, inode_reused)
    by_seq = {h["_source"]["seq"]: h for h in docs}
    assert by_seq[1000]["_source"]["log"]["offset"] == 0 and by_seq[3000]["_source"]["log"]["offset"] == 0
    assert d.alive


def test_a_file_recreated_while_the_daemon_is_stopped(tmp_path: Path, es: ES, osmem_clone: Any,
                                                      daemon_factory: Any) -> None:
    """Stopped, the file is deleted and recreated (maybe on the same inode) with more bytes than the
    old checkpoint: the checkpoint's fingerprint no longer matches, so it starts at 0 as a new one."""
    logs = setup_logs(tmp_path)
    log = logs / "app.log"
    write_lines(log, range(0, 200))
    d = daemon_factory(config(tmp_path, osmem_clone.url, [log]))
    d.wait_ready()
    wait_count(es, 200, daemon=d)
    assert d.terminate() == 0
    log.unlink()
    write_lines(log, range(500, 900))
    d.start()
    d.wait_ready()
    wait_count(es, 600, daemon=d)
    es.assert_exactly_once([*range(0, 200), *range(500, 900)], index=INDEX + "*")
    assert d.alive


def fixed_line(seq: int) -> bytes:
    """Lines of one length, so two files with as many lines have the same size."""
    return b'{"level":30,"msg":"fixed width","seq":%d}\n' % seq


def test_inode_reuse_with_the_same_size_after_the_file_was_closed(tmp_path: Path, es: ES, osmem_clone: Any,
                                                                   daemon_factory: Any) -> None:
    """The daemon closed an idle file; it is deleted and a file of the very same size is created at
    the same path, on the inode just freed (ext4 and tmpfs hand it out again at once). Same path,
    same inode, same size: only the content tells, and the new content must be shipped."""
    logs = setup_logs(tmp_path)
    log = logs / "app.log"
    write_lines(log, range(100_000, 100_300), line_fn=fixed_line)
    d = daemon_factory(config(tmp_path, osmem_clone.url, [log], input={"close_inactive": "300ms"}, log_level="debug"))
    d.wait_ready()
    wait_count(es, 300, daemon=d)
    wait_until(lambda: "inactive" in d.output(), lambda: f"the idle file closed\n{d.tail(20)}", timeout_s=20)
    ino, size = log.stat().st_ino, log.stat().st_size
    log.unlink()
    write_lines(log, range(200_000, 200_300), line_fn=fixed_line)
    assert log.stat().st_size == size
    reused = log.stat().st_ino == ino
    wait_count(es, 600, daemon=d)
    docs = es.assert_exactly_once([*range(100_000, 100_300), *range(200_000, 200_300)], index=INDEX + "*")
    assert len({h["_id"].rsplit("-", 1)[0] for h in docs}) == 2, reused
    assert d.alive


# ---------------------------------------------------------------- 6. config errors: exit 2, key, file, line

BASE = """\
state_dir: {state}
inputs:
  - paths: ['{logs}/*.log']
output:
  elasticsearch:
    url: http://127.0.0.1:9
"""


@pytest.mark.parametrize("extra, key, line", [
    ("    colour: blue\n", "output.elasticsearch.colour", 7),
    ("queue:\n  max_bytes: 12 parsecs\n", "queue.max_bytes", 8),
    ("retry:\n  max_backoff: forever\n", "retry.max_backoff", 8),
    ("    bulk_max_events: [1, 2]\n", "output.elasticsearch.bulk_max_events", 7),
    ("    compression: 7z\n", "output.elasticsearch.compression", 7),
    ("  - exclude: ['*.gz']\n", "inputs[1].paths", 4),
    ("  - paths: ['/x/*.log']\n    format: regex\n    pattern: '(?P<a>[unclosed'\n", "inputs[1].pattern", 6),
    ("  - paths: ['/x/*.log']\n    multiline:\n      start: '*oops'\n", "inputs[1].multiline.start", 6),
    ("  - paths: '/x/*.log'\n    max_line_bytes: true\n", "inputs[1].max_line_bytes", 5),
    ("    bulk_max_events: ${NOT_SET_ANYWHERE_42}\n", "output.elasticsearch.bulk_max_events", 7),
])
def test_config_errors_exit_2_naming_key_file_and_line(tmp_path: Path, extra: str, key: str, line: int) -> None:
    logs = setup_logs(tmp_path)
    text = BASE.format(state=tmp_path / "state", logs=logs)
    # input items go after the first input (line 4 on), anything else at the end (line 7 on)
    if extra.startswith("  - "):
        head, tail = text.split("output:\n", 1)
        text = head + extra + "output:\n" + tail
    else:
        text += extra
    cfg = tmp_path / "shipper.yaml"
    cfg.write_text(text)
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    env.pop("NOT_SET_ANYWHERE_42", None)
    procs = {cmd: subprocess.Popen([sys.executable, "-m", "shipper", cmd, "-c", str(cfg)], stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, text=True, env=env, stdin=subprocess.DEVNULL)
             for cmd in ("run", "check")}
    for cmd, p in procs.items():
        out, err = p.communicate(timeout=30)
        assert p.returncode == 2, (cmd, p.returncode, out, err)
        assert key in err and str(cfg) in err and f"line {line}" in err, (cmd, err)
    assert not (tmp_path / "state").exists()         # nothing was started


def test_missing_config_file_exits_2(tmp_path: Path) -> None:
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    p = subprocess.run([sys.executable, "-m", "shipper", "run", "-c", str(tmp_path / "nope.yaml")],
                       capture_output=True, text=True, timeout=30, env=env, stdin=subprocess.DEVNULL)
    assert p.returncode == 2 and "nope.yaml" in p.stderr and "not found" in p.stderr
