"""sd_notify against a real AF_UNIX datagram socket standing in for systemd."""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from shipper import sdnotify
from shipper.clock import SystemClock
from shipper.sdnotify import Notifier, watchdog_interval_s


@pytest.fixture
def receiver(tmp_path: Path) -> Iterator[tuple[socket.socket, str]]:
    path = tmp_path / "n.sock"  # short: sun_path holds 108 bytes
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(path))
    sock.settimeout(5)
    yield sock, str(path)
    sock.close()


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_without_notify_socket_every_call_is_a_noop() -> None:
    n = Notifier({})
    assert n.notify("READY=1") is False
    assert n.ready() is False
    assert n.watchdog_ping() is False
    assert n._sock is None  # nothing was opened


def test_messages_arrive_as_datagrams(receiver: tuple[socket.socket, str]) -> None:
    sock, path = receiver
    n = Notifier({"NOTIFY_SOCKET": path})
    assert n.ready()
    assert sock.recv(4096) == b"READY=1"
    assert n.watchdog_ping()
    assert sock.recv(4096) == b"WATCHDOG=1"
    assert n.status("shipping\n3 files")
    assert sock.recv(4096) == b"STATUS=shipping 3 files"
    assert n.stopping()
    assert sock.recv(4096) == b"STOPPING=1"
    assert n.reloading(SystemClock().monotonic())
    lines = sock.recv(4096).decode().split("\n")
    assert lines[0] == "RELOADING=1"
    assert lines[1].startswith("MONOTONIC_USEC=") and int(lines[1].split("=")[1]) > 0
    n.close()


def test_abstract_namespace_socket() -> None:
    name = f"shipper-test-{uuid.uuid4().hex}"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind("\0" + name)
    sock.settimeout(5)
    try:
        n = Notifier({"NOTIFY_SOCKET": "@" + name})
        assert n.ready()
        assert sock.recv(4096) == b"READY=1"
        n.close()
    finally:
        sock.close()


def test_one_socket_is_kept_across_pings(receiver: tuple[socket.socket, str]) -> None:
    sock, path = receiver
    n = Notifier({"NOTIFY_SOCKET": path})
    assert n.watchdog_ping()
    sock.recv(4096)
    before = open_fds()
    for _ in range(50):
        assert n.watchdog_ping()
        assert sock.recv(4096) == b"WATCHDOG=1"
    assert open_fds() == before
    n.close()
    assert open_fds() == before - 1


def test_missing_receiver_returns_false_and_recovers(tmp_path: Path) -> None:
    path = tmp_path / "n.sock"
    n = Notifier({"NOTIFY_SOCKET": str(path)})
    assert n.ready() is False  # nobody bound there: no exception, just False
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(path))
    sock.settimeout(5)
    try:
        assert n.ready() is True
        assert sock.recv(4096) == b"READY=1"
    finally:
        sock.close()
        n.close()


def test_relative_or_unknown_addresses_are_ignored() -> None:
    assert Notifier({"NOTIFY_SOCKET": "relative/path"}).ready() is False
    assert Notifier({"NOTIFY_SOCKET": "vsock:2:1234"}).ready() is False


def test_module_functions_use_the_process_environment(
    receiver: tuple[socket.socket, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    sock, path = receiver
    monkeypatch.setenv("NOTIFY_SOCKET", path)
    try:
        assert sdnotify.ready()
        assert sock.recv(4096) == b"READY=1"
        assert sdnotify.watchdog_ping()
        assert sock.recv(4096) == b"WATCHDOG=1"
        assert sdnotify.notify("STATUS=x")
        assert sock.recv(4096) == b"STATUS=x"
    finally:
        sdnotify.close()
    monkeypatch.delenv("NOTIFY_SOCKET")
    assert sdnotify.stopping() is False


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, None),
        ({"WATCHDOG_USEC": "60000000"}, 30.0),
        ({"WATCHDOG_USEC": "1000"}, 0.0005),
        ({"WATCHDOG_USEC": "0"}, None),
        ({"WATCHDOG_USEC": "-5"}, None),
        ({"WATCHDOG_USEC": "soon"}, None),
        ({"WATCHDOG_USEC": "60000000", "WATCHDOG_PID": "{pid}"}, 30.0),
        ({"WATCHDOG_USEC": "60000000", "WATCHDOG_PID": "{other}"}, None),
        ({"WATCHDOG_USEC": "60000000", "WATCHDOG_PID": "x"}, None),
    ],
)
def test_watchdog_interval_is_half_the_timeout_for_our_pid(env: dict[str, str], expected: float | None) -> None:
    pid = os.getpid()
    env = {k: v.format(pid=pid, other=pid + 1) for k, v in env.items()}
    assert watchdog_interval_s(env) == expected
    assert Notifier(env).watchdog_interval_s() == expected


def test_watchdog_interval_reads_the_process_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WATCHDOG_USEC", "10000000")
    monkeypatch.setenv("WATCHDOG_PID", str(os.getpid()))
    assert sdnotify.watchdog_interval_s() == 5.0
