"""The daemon's lifecycle as systemd sees it: readiness and watchdog on NOTIFY_SOCKET, SIGTERM
within shutdown_timeout with nothing lost, SIGHUP adding an input, an invalid reload surviving.

The daemon runs as a real subprocess against osmem-server; each test ends with the exactly-once oracle.
"""

from __future__ import annotations

import json
import signal
import socket
import time

import yaml

from tests.support.daemon import write_config
from tests.support.wait import wait_until
from tests.support.writer import write_lines


def _seqs_logged(es, n_expected: int) -> None:
    wait_until(lambda: es.count() >= n_expected, f"{n_expected} documents in ES", timeout_s=30)


def test_sigterm_exits_zero_within_shutdown_timeout_and_restart_loses_nothing(tmp_path, es, daemon_factory):
    logs = tmp_path / "logs"
    logs.mkdir()
    app = logs / "app.log"
    write_lines(app, range(0, 1500))
    cfg = write_config(tmp_path, es_url=es.url, paths=str(logs / "*.log"), extra_yaml={"shutdown_timeout": "5s"})
    d = daemon_factory(cfg)
    d.wait_ready()
    wait_until(lambda: es.count(refresh=False) > 0, "the first documents")
    t0 = time.monotonic()
    code = d.terminate(timeout_s=15)
    took = time.monotonic() - t0
    assert code == 0
    assert took < 5 + 3, f"SIGTERM took {took:.1f}s, shutdown_timeout is 5s"
    out = d.output()
    assert '"msg":"stopped"' in out
    write_lines(app, range(1500, 2000))
    d.restart()
    _seqs_logged(es, 2000)
    es.assert_exactly_once(range(2000))
    assert d.alive


def test_sighup_adds_an_input_and_an_invalid_config_keeps_the_running_one(tmp_path, es, daemon_factory):
    a = tmp_path / "a"
    b = tmp_path / "b"
    a.mkdir()
    b.mkdir()
    write_lines(a / "app.log", range(0, 300))
    write_lines(b / "other.log", range(1000, 1300))
    cfg = write_config(tmp_path, es_url=es.url, paths=str(a / "*.log"), extra_yaml={"log_level": "info"})
    d = daemon_factory(cfg)
    d.wait_ready()
    _seqs_logged(es, 300)

    # an invalid new config is logged and the running one keeps working
    good = cfg.read_text()
    cfg.write_text(good.replace("inputs:", "bogus_key: 1\ninputs:"))
    d.send(signal.SIGHUP)
    wait_until(lambda: "reload rejected" in d.output(), "the rejected reload to be logged")
    assert "bogus_key" in d.output()
    write_lines(a / "app.log", range(300, 400))
    _seqs_logged(es, 400)
    assert d.alive

    # a valid one adds the second input without losing or duplicating anything
    data = yaml.safe_load(good)
    data["inputs"].append({"paths": [str(b / "*.log")], "scan_interval": "500ms"})
    cfg.write_text(yaml.safe_dump(data))
    d.send(signal.SIGHUP)
    wait_until(lambda: "config reloaded" in d.output(), "the reload")
    write_lines(a / "app.log", range(400, 500))
    _seqs_logged(es, 800)
    es.assert_exactly_once(list(range(0, 500)) + list(range(1000, 1300)))
    assert d.alive


def test_readiness_watchdog_reload_and_stopping_arrive_on_notify_socket(tmp_path, es, daemon_factory):
    sock_path = tmp_path / "notify.sock"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(sock_path))
    sock.settimeout(0.2)
    got: list[str] = []

    def drain() -> list[str]:
        """Every message so far, one entry per KEY=VALUE line."""
        while True:
            try:
                got.extend(sock.recv(4096).decode().splitlines())
            except (TimeoutError, BlockingIOError):
                return got

    try:
        logs = tmp_path / "logs"
        logs.mkdir()
        write_lines(logs / "app.log", range(50))
        cfg = write_config(tmp_path, es_url=es.url, paths=str(logs / "*.log"))
        d = daemon_factory(cfg, env={"NOTIFY_SOCKET": str(sock_path), "WATCHDOG_USEC": "1000000"}, start=False)
        d.start()
        wait_until(lambda: "READY=1" in drain(), "READY=1 on the notify socket")
        wait_until(lambda: drain().count("WATCHDOG=1") >= 2, "two watchdog pings (WatchdogSec=1s -> every 0.5s)")
        d.send(signal.SIGHUP)
        wait_until(lambda: "RELOADING=1" in drain() and drain().count("READY=1") >= 2, "RELOADING=1 then READY=1")
        assert d.terminate() == 0
        wait_until(lambda: "STOPPING=1" in drain(), "STOPPING=1")
        es.assert_exactly_once(range(50))
    finally:
        sock.close()


def test_own_logs_are_json_lines_without_secrets(tmp_path, es, daemon_factory, fault_proxy):
    fault_proxy.require_basic_auth("elastic", "s3cr3t-Passw0rd")
    logs = tmp_path / "logs"
    logs.mkdir()
    write_lines(logs / "app.log", range(100))
    cfg = write_config(tmp_path, es_url=fault_proxy.url, paths=str(logs / "*.log"),
                       extra_yaml={"output": {"elasticsearch": {"username": "elastic", "password": "${ES_PW}"}}})
    d = daemon_factory(cfg, env={"ES_PW": "s3cr3t-Passw0rd"})
    d.wait_ready()
    _seqs_logged(es, 100)
    d.terminate()
    out = d.output()
    assert "s3cr3t-Passw0rd" not in out
    lines = [ln for ln in out.splitlines() if ln.strip() and not ln.startswith("=== test harness")]
    assert lines, "the daemon logged nothing"
    for ln in lines:
        rec = json.loads(ln)
        assert {"time", "level", "msg"} <= rec.keys()
    es.assert_exactly_once(range(100))
