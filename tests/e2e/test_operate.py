"""Operating the daemon: `shipper status` (JSON and table) while it runs and after it stops,
/metrics scraped and checked against what osmem received, /health turning 503 while the output
is down past `metrics.health_down_after`. Real daemon, real files, osmem behind the fault proxy.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from shipper import __version__
from tests.support.daemon import metric_key, write_config
from tests.support.es import ES
from tests.support.proxy import FaultProxy
from tests.support.wait import wait_until
from tests.support.writer import write_lines

pytestmark = pytest.mark.slow

INDEX = "ops"
SECRET = "s3cr3t-Pa55"


def _config(tmp_path: Path, url: str, log: Path, **extra: Any) -> Path:
    return write_config(tmp_path, es_url=url, paths=log,
                        extra_yaml={"output": {"elasticsearch": {"index": INDEX}}, **extra})


def _file_row(doc: dict[str, Any], path: Path) -> dict[str, Any]:
    rows = [f for f in doc["files"] if f["path"] == str(path)]
    assert len(rows) == 1, f"expected one row for {path}: {doc['files']}"
    return rows[0]


def ready_spool(d: Any) -> str:
    """queue.spool as the daemon's `pipeline ready` line says it."""
    ready = [json.loads(ln) for ln in d.output().splitlines() if '"pipeline ready"' in ln]
    return str(ready[-1]["spool"])


def test_status_while_running_and_after_stop(tmp_path: Path, es: ES, daemon_factory: Any) -> None:
    log = tmp_path / "app.log"
    write_lines(log, range(1000))
    d = daemon_factory(_config(tmp_path, es.url, log))
    d.wait_ready()
    wait_until(lambda: es.count(INDEX + "*") >= 1000, "1000 docs in osmem", timeout_s=20)
    size = log.stat().st_size

    def settled() -> dict[str, Any] | None:
        doc = d.status_json()
        row = _file_row(doc, log)
        return doc if row["offset"] == size and doc["queue"]["events"] == 0 else None

    doc = wait_until(settled, "status to show the file fully shipped", timeout_s=10)
    assert doc["running"] is True and doc["daemon"] == "running" and doc["source"] == "daemon"
    row = _file_row(doc, log)
    assert row["inode"] == log.stat().st_ino
    assert row["size"] == size and row["lag_bytes"] == 0
    # SPEC's {"events", "bytes"}, extended by what is in flight from memory and the mode (issue 46)
    spool = doc["queue"]["spool"]
    assert spool in ("when_behind", "always") and ready_spool(d) == spool
    assert doc["queue"] == {"events": 0, "bytes": 0, "in_memory": {"events": 0, "bytes": 0}, "spool": spool}
    assert doc["dead_letter"] == 0
    assert doc["output"]["up"] is True and doc["output"]["last_error"] is None
    assert doc["shipped_total"] == 1000 and doc["read_total"] == 1000
    assert doc["version"] == __version__                          # the daemon's own
    ready = [json.loads(ln) for ln in d.output().splitlines() if '"pipeline ready"' in ln]
    assert ready and ready[-1]["version"] == __version__          # the startup log line

    table = d.cli("status", check=True).stdout
    assert table.startswith("shipper: running (pid ")
    assert str(log) in table and "100.0%" in table

    # stopped: read from the state_dir (checkpoints, queue), the file's growth shows as lag
    assert d.terminate() == 0
    appended = write_lines(log, range(1000, 1300))
    doc = d.status_json()
    assert doc["running"] is False and doc["daemon"] == "stopped"
    row = _file_row(doc, log)
    assert row["offset"] == size and row["size"] == size + appended and row["lag_bytes"] == appended
    assert row["inode"] == log.stat().st_ino
    assert doc["queue"] == {"events": 0, "bytes": 0, "in_memory": {"events": 0, "bytes": 0}, "spool": spool}
    assert doc["dead_letter"] == 0
    assert isinstance(doc["output"]["up"], bool) and doc["output"]["last_error"] is None
    assert doc["version"] == __version__                          # this command's, when stopped
    table = d.cli("status", check=True).stdout
    assert table.startswith("shipper: stopped")
    row_text = next(ln for ln in table.splitlines() if ln.startswith(str(log)))
    assert f"{appended / 1024:.1f} KiB" in row_text, row_text     # the LAG column

    # restart: the lag is shipped, and each line is in osmem exactly once
    d.start()
    d.wait_ready()
    wait_until(lambda: es.count(INDEX + "*") >= 1300, "1300 docs in osmem", timeout_s=20)
    wait_until(lambda: _file_row(d.status_json(), log)["lag_bytes"] == 0, "status lag back to 0", timeout_s=10)
    es.assert_exactly_once(range(1300), index=INDEX)
    assert d.alive


def test_metrics_match_what_osmem_received(tmp_path: Path, es: ES, daemon_factory: Any) -> None:
    log = tmp_path / "app.log"
    n = 1500
    write_lines(log, range(n))
    d = daemon_factory(_config(tmp_path, es.url, log))
    d.wait_ready()
    wait_until(lambda: es.count(INDEX + "*") >= n, f"{n} docs in osmem", timeout_s=20)

    with urllib.request.urlopen(d.base_url + "/metrics", timeout=5) as resp:
        ctype = resp.headers["Content-Type"]
        text = resp.read().decode()
    assert ctype.startswith("text/plain") and "version=0.0.4" in ctype
    for name in ("process_cpu_seconds_total", "process_resident_memory_bytes", "process_open_fds"):
        assert f"# TYPE {name} " in text and f"\n{name} " in text         # prometheus_client's ProcessCollector
    assert f'shipper_build_info{{version="{__version__}"}} 1.0\n' in text
    for name, kind in (("shipper_events_read_total", "counter"), ("shipper_events_shipped_total", "counter"),
                       ("shipper_events_dead_letter_total", "counter"), ("shipper_bulk_requests_total", "counter"),
                       ("shipper_bulk_items_total", "counter"), ("shipper_retries_total", "counter"),
                       ("shipper_queue_events", "gauge"), ("shipper_queue_bytes", "gauge"),
                       ("shipper_file_lag_bytes", "gauge"), ("shipper_output_up", "gauge"),
                       ("shipper_bulk_latency_seconds", "histogram"), ("shipper_bulk_docs", "histogram")):
        assert f"# TYPE {name} {kind}\n" in text and f"# HELP {name} " in text

    def gauges_settled() -> dict[str, float] | None:
        m = d.metrics()
        return m if m.get(metric_key("shipper_file_lag_bytes", path=str(log))) == 0 else None

    m = wait_until(gauges_settled, "the lag gauge of the file to read 0", timeout_s=10)
    docs = es.count(INDEX + "*")
    assert m["shipper_events_read_total"] == n
    assert m["shipper_events_shipped_total"] == docs == n
    assert m[metric_key("shipper_bulk_items_total", status="201")] == docs
    requests_200 = m[metric_key("shipper_bulk_requests_total", code="200")]
    assert requests_200 == m["shipper_bulk_docs_count"] == m["shipper_bulk_latency_seconds_count"]
    assert m["shipper_bulk_docs_sum"] == docs
    assert m[metric_key("shipper_bulk_docs_bucket", le="+Inf")] == requests_200
    assert m["shipper_events_dead_letter_total"] == 0 and m["shipper_retries_total"] == 0
    assert m["shipper_queue_events"] == 0 and m["shipper_queue_bytes"] == 0
    assert m["shipper_output_up"] == 1 and m["shipper_files_open"] == 1
    es.assert_exactly_once(range(n), index=INDEX)
    assert d.alive


def test_health_503_while_output_down_past_threshold(tmp_path: Path, es: ES, fault_proxy: FaultProxy,
                                                    daemon_factory: Any) -> None:
    log = tmp_path / "app.log"
    write_lines(log, range(200))
    url = fault_proxy.url.replace("http://", f"http://shipper:{SECRET}@")
    cfg = _config(tmp_path, url, log, metrics={"health_down_after": "1s"})
    d = daemon_factory(cfg)
    d.wait_ready()
    wait_until(lambda: es.count(INDEX + "*") >= 200, "first 200 docs in osmem", timeout_s=20)
    assert d.health() == 200

    fault_proxy.down()
    write_lines(log, range(200, 300))
    wait_until(lambda: d.health() == 503, "/health to answer 503 while the output is down", timeout_s=15)
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(d.base_url + "/health", timeout=5)
    body = json.loads(err.value.read())
    err.value.close()
    assert body["status"] == "unhealthy" and body["reason"].startswith("output down for ")
    doc = d.status_json()
    assert doc["output"]["up"] is False and doc["output"]["down_since"] is not None
    assert doc["output"]["last_error"] and doc["queue"]["events"] > 0
    table = d.cli("status", check=True).stdout
    assert "BACKING OFF since" in table and "last error:" in table
    assert d.metric("shipper_output_up") == 0
    assert d.metric("shipper_retries_total") >= 1

    fault_proxy.up()
    wait_until(lambda: d.health() == 200, "/health back to 200 once the output answers", timeout_s=15)
    wait_until(lambda: es.count(INDEX + "*") >= 300, "all 300 docs in osmem", timeout_s=20)
    es.assert_exactly_once(range(300), index=INDEX)
    assert d.alive
    seen = d.output() + json.dumps(doc) + table + json.dumps(body)
    assert SECRET not in seen, "the password leaked into the daemon's output or status"


def test_an_idle_daemon_vouches_for_status_json_without_rewriting_it(tmp_path: Path, es: ES,
                                                                      daemon_factory: Any) -> None:
    """Issue 14: nothing changed, so status.json is not serialised again (a row per file) every
    6 s: its mtime moves (one utime), its inode and bytes stay, and `shipper status` reads the
    mtime as `updated`. A change is written at once."""
    import os
    import time

    from shipper.commands.status import _read_status_file
    log = tmp_path / "app.log"
    write_lines(log, range(20))
    d = daemon_factory(_config(tmp_path, es.url, log))
    d.wait_ready()
    state = str(tmp_path / "state")
    path = Path(state) / "status.json"
    size = log.stat().st_size

    def shipped_in_file() -> bool:
        got = _read_status_file(state)
        return got is not None and bool(got) and any(f["path"] == str(log) and f["offset"] == size for f in got["files"]) \
            and got["queue"]["events"] == 0 and got["output"]["up"] is True

    wait_until(shipped_in_file, "status.json to show the file shipped", timeout_s=20)
    # rates and ETAs decay for a while after the last line: wait for the file to settle first
    first = path.stat()
    wait_until(lambda: path.stat().st_mtime_ns > first.st_mtime_ns and path.stat().st_ino == first.st_ino,
               "status.json vouched for (mtime moved, same file)", timeout_s=30)
    st = path.stat()
    body = path.read_bytes()
    wait_until(lambda: path.stat().st_mtime_ns > st.st_mtime_ns, "a second vouch", timeout_s=15)
    assert path.stat().st_ino == st.st_ino and path.read_bytes() == body     # not rewritten
    doc = _read_status_file(state)
    assert doc is not None and abs(float(doc["updated"]) - path.stat().st_mtime) < 0.01
    assert float(doc["updated"]) > float(os.path.getmtime(path)) - 0.01 and time.time() - float(doc["updated"]) < 10

    write_lines(log, range(20, 30))            # a change: rewritten within a status tick or two
    size2 = log.stat().st_size
    wait_until(lambda: any(f["path"] == str(log) and f["offset"] == size2
                           for f in (_read_status_file(state) or {}).get("files", [])),
               "status.json rewritten with the new offset", timeout_s=15)
