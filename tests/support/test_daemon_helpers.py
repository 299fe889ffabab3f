"""What of the daemon harness can be tested without the daemon: ports, configs, metrics text, process handling."""

from __future__ import annotations

import math
import socket
from pathlib import Path

import pytest
import yaml

from shipper.config import load_config
from tests.support.daemon import (
    Daemon,
    deep_merge,
    free_port,
    metric_key,
    metric_sum,
    parse_prometheus,
    read_metrics_listen,
    write_config,
)
from tests.support.wait import wait_until

PROM = r'''# HELP shipper_bulk_requests_total Bulk requests by HTTP status.
# TYPE shipper_bulk_requests_total counter
shipper_bulk_requests_total{code="200"} 12
shipper_bulk_requests_total{code="error"} 3
shipper_bulk_items_total{status="201"} 1.5e3
shipper_bulk_items_total{status="429"} 7
shipper_events_read_total 1234
shipper_file_lag_bytes{path="/var/log/a \"b\", c.log"} 0
shipper_file_lag_bytes{path="/var/log/x.log",  input="0" } 10 1700000000000
shipper_batch_seconds_bucket{le="+Inf"} 5
shipper_weird NaN
shipper_neg -Inf
'''


def test_parse_prometheus() -> None:
    m = parse_prometheus(PROM)
    assert m['shipper_bulk_requests_total{code="200"}'] == 12
    assert m[metric_key("shipper_bulk_items_total", status="201")] == 1500
    assert m["shipper_events_read_total"] == 1234
    assert m[metric_key("shipper_file_lag_bytes", path='/var/log/a "b", c.log')] == 0
    assert m['shipper_file_lag_bytes{input="0",path="/var/log/x.log"}'] == 10  # labels sorted, timestamp dropped
    assert m['shipper_batch_seconds_bucket{le="+Inf"}'] == 5
    assert math.isnan(m["shipper_weird"]) and m["shipper_neg"] == -math.inf
    assert metric_sum(m, "shipper_bulk_items_total") == 1507
    assert metric_sum(m, "shipper_bulk_requests_total", code="error") == 3
    assert metric_sum(m, "shipper_nothing") == 0
    with pytest.raises(ValueError):
        parse_prometheus("not a metric line at all {")


def test_free_port_is_bindable() -> None:
    port = free_port()
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))


def test_write_config_defaults_and_deep_merge(tmp_path: Path) -> None:
    cfg = write_config(
        tmp_path, es_url="http://127.0.0.1:1", paths=[tmp_path / "*.log"], metrics_port=9999,
        extra_yaml={"output": {"elasticsearch": {"index": "x", "compression": "none"}}, "log_level": "debug"},
        input_extra={"format": "json", "fields": {"env": "test"}},
    )
    data = yaml.safe_load(cfg.read_text())
    assert data["state_dir"] == str(tmp_path / "state")
    assert data["inputs"] == [{"paths": [str(tmp_path / "*.log")], "scan_interval": "500ms", "format": "json", "fields": {"env": "test"}}]
    assert data["output"]["elasticsearch"] == {
        "hosts": ["http://127.0.0.1:1"], "flush_interval": "200ms", "index": "x", "compression": "none"
    }
    assert data["retry"] == {"initial_backoff": "100ms", "max_backoff": "1s"}
    assert data["log_level"] == "debug"
    assert read_metrics_listen(cfg) == "127.0.0.1:9999"
    other = write_config(tmp_path, es_url=["http://a:1", "http://b:2"], paths=str(tmp_path / "x.log"), name="two.yaml",
                         extra_yaml={"metrics": {"listen": None}})
    assert yaml.safe_load(other.read_text())["output"]["elasticsearch"]["hosts"] == ["http://a:1", "http://b:2"]
    assert read_metrics_listen(other) is None
    assert deep_merge({"a": {"b": 1, "c": [1]}}, {"a": {"c": [2]}}) == {"a": {"b": 1, "c": [2]}}


def test_write_config_is_accepted_by_the_config_loader(tmp_path: Path) -> None:
    cfg = write_config(tmp_path, es_url="http://127.0.0.1:1", paths=[tmp_path / "*.log"])
    loaded = load_config(str(cfg))
    assert loaded.output.hosts == ("http://127.0.0.1:1",) and loaded.inputs[0].scan_interval_s == 0.5


def test_daemon_fails_fast_with_output_when_the_process_exits(tmp_path: Path, daemon_factory) -> None:
    cfg = write_config(tmp_path, es_url="http://127.0.0.1:1", paths=[tmp_path / "*.log"])
    d = daemon_factory(cfg, start=False)
    d.args = ["--no-such-option-for-the-harness-test"]
    d.start()
    with pytest.raises(AssertionError, match="exited with .* before it was ready") as exc:
        d.wait_ready(timeout_s=20)
    assert "daemon output" in str(exc.value) and "start #1" in d.output()
    assert not d.alive and d.returncode not in (None, 0)


def test_daemon_signals_and_kill9_on_a_stand_in_process(tmp_path: Path) -> None:
    # The real daemon is not ready yet; drive the process handling with a stand-in `shipper`.
    fake = tmp_path / "fake" / "shipper"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("")
    (fake / "__main__.py").write_text(
        "import signal, sys, time\n"
        "signal.signal(signal.SIGTERM, lambda *a: (print('got TERM', flush=True), sys.exit(0)))\n"
        "print('fake up', sys.argv[1:], flush=True)\n"
        "while True: time.sleep(0.05)\n"
    )
    cfg = write_config(tmp_path, es_url="http://127.0.0.1:1", paths=[tmp_path / "*.log"])
    d = Daemon(cfg, env={"PYTHONPATH": str(tmp_path / "fake")}).start()
    try:
        wait_until(lambda: "fake up" in d.output(), "the stand-in to start")
        assert "'run', '-c'" in d.output() and d.health() is None
        assert d.terminate() == 0 and "got TERM" in d.output()
        d.start()
        wait_until(lambda: "fake up" in d.output(current_run=True), "the second start")
        d.kill9()
        assert not d.alive and d.returncode == -9
        assert d.output().count("fake up") == 2
    finally:
        d.kill9()
