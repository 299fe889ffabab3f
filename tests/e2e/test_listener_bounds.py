"""The metrics listener cannot take what shipping needs (SPEC, Trust boundaries), on the real daemon.

200 clients hold connections to `metrics.listen` of a daemon whose RLIMIT_NOFILE is lowered
(`ulimit -n` as an admin would set it, applied to the running process with prlimit): at 128 the
listener holds at most 64 and a new log file is still opened and shipped promptly; with fewer
descriptors than that, accepting runs out (EMFILE), which is logged once, with no traceback,
while the files already open keep shipping. Oracle: every line once in Elasticsearch, within a
bound of its writing; the daemon alive.
"""

from __future__ import annotations

import os
import resource
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.daemon import Daemon, write_config
from tests.support.es import ES
from tests.support.wait import wait_until
from tests.support.writer import write_lines

CLIENTS = 200
PROMPT_S = 5.0           # a line written is in Elasticsearch within this long (b19ade4: 8.5 s for a new file)


def fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def open_conns(pid: int) -> int:
    """The daemon's TCP sockets (listening, the output's, the metrics clients')."""
    n = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}").startswith("socket:"):
                n += 1
        except OSError:
            pass
    return n


@pytest.fixture
def clients() -> Iterator[list[socket.socket]]:
    held: list[socket.socket] = []
    yield held
    for s in held:
        s.close()


def hold(port: int, held: list[socket.socket]) -> None:
    """CLIENTS connections, each with a kept-alive request sent; those the kernel's queue cannot
    take stay half-open (connect in progress): held too."""
    for _ in range(CLIENTS):
        s = socket.socket()
        s.setblocking(False)
        s.connect_ex(("127.0.0.1", port))
        held.append(s)
    deadline = time.monotonic() + 5
    pending = list(held)
    while pending and time.monotonic() < deadline:
        left = []
        for s in pending:
            try:
                s.send(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            except (BlockingIOError, OSError):
                left.append(s)
        pending = left
        if pending:
            time.sleep(0.02)      # connect still in progress: poll again under the deadline


def start(tmp_path: Path, es: ES, daemon_factory: Any) -> tuple[Daemon, Path, int]:
    logs = tmp_path / "logs"
    logs.mkdir()
    write_lines(logs / "a.log", range(0, 10))
    cfg = write_config(tmp_path, es_url=es.url, paths=str(logs / "*.log"))
    d: Daemon = daemon_factory(cfg)
    wait_until(lambda: es.count() >= 10, "the first 10 lines", timeout_s=20)
    pid = d.pid
    assert pid is not None
    return d, logs, pid


def test_held_connections_under_ulimit_128_leave_room_for_a_new_file(tmp_path: Path, es: ES, daemon_factory: Any,
                                                                    clients: list[socket.socket]) -> None:
    d, logs, pid = start(tmp_path, es, daemon_factory)
    resource.prlimit(pid, resource.RLIMIT_NOFILE, (128, 128))
    port = int(d.metrics_listen.rpartition(":")[2])
    before = open_conns(pid)
    hold(port, clients)
    wait_until(lambda: open_conns(pid) >= before + 64, "64 metrics connections taken")
    t0 = time.monotonic()
    write_lines(logs / "b.log", range(100, 110))                  # a new file: needs a descriptor
    wait_until(lambda: es.count() >= 20, "the new file's lines", timeout_s=PROMPT_S)
    assert time.monotonic() - t0 < PROMPT_S
    assert open_conns(pid) <= before + 64, "more than 64 metrics connections at once"
    assert fds(pid) < 128
    es.assert_exactly_once(list(range(0, 10)) + list(range(100, 110)))
    out = d.output()
    assert "Traceback" not in out and "out of file descriptors" not in out, d.tail()
    assert d.alive


def test_descriptors_running_out_is_logged_once_and_open_files_keep_shipping(
        tmp_path: Path, es: ES, daemon_factory: Any, clients: list[socket.socket]) -> None:
    d, logs, pid = start(tmp_path, es, daemon_factory)
    limit = fds(pid) + 16              # the listener runs out long before its 64
    resource.prlimit(pid, resource.RLIMIT_NOFILE, (limit, limit))
    port = int(d.metrics_listen.rpartition(":")[2])
    hold(port, clients)
    wait_until(lambda: "metrics listener out of file descriptors" in d.output(), "the warning")
    warned = time.monotonic()
    n = 10
    # the open file keeps shipping, round after round, while accepting is retried every second
    while time.monotonic() - warned < 3.5:
        t0 = time.monotonic()
        write_lines(logs / "a.log", range(n, n + 10))
        n += 10
        wait_until(lambda: es.count() >= n, f"lines up to {n}", timeout_s=PROMPT_S)
        assert time.monotonic() - t0 < PROMPT_S
    es.assert_exactly_once(range(0, n))
    out = d.output()
    assert out.count("metrics listener out of file descriptors") == 1, d.tail()
    assert "Traceback" not in out, d.tail()
    assert d.alive
