"""The systemd notification protocol (sd_notify), spoken directly: READY, RELOADING, STOPPING,
WATCHDOG, STATUS as datagrams to $NOTIFY_SOCKET (a path, or an abstract socket when it starts with
'@'). Without that variable every call is a no-op returning False; nothing here raises or blocks."""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping

__all__ = [
    "Notifier",
    "close",
    "notify",
    "ready",
    "reloading",
    "status",
    "stopping",
    "watchdog_interval_s",
    "watchdog_ping",
]


def _socket_address(value: str) -> str | None:
    """$NOTIFY_SOCKET -> an AF_UNIX address; None when unset or of a kind we do not speak (vsock)."""
    if value.startswith("@"):
        return "\0" + value[1:]  # Linux abstract namespace
    if value.startswith("/"):
        return value
    return None


class Notifier:
    """Sends sd_notify messages over one datagram socket, opened on first use and kept.

    The environment is read on every call (systemd may hand it over late, tests change it), but
    the socket is reused: the watchdog ping comes from the event loop every few seconds. The
    socket is non-blocking, so a receiver that stopped reading costs a False, never a stall.
    """

    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        self._environ: Mapping[str, str] = os.environ if environ is None else environ
        self._sock: socket.socket | None = None

    def notify(self, message: str) -> bool:
        """Send one message (`"READY=1"`, or several `KEY=VALUE` lines). True if it was sent."""
        address = _socket_address(self._environ.get("NOTIFY_SOCKET", ""))
        if address is None:
            return False
        try:
            if self._sock is None:
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
                sock.setblocking(False)
                self._sock = sock
            self._sock.sendto(message.encode("utf-8"), address)
        except BlockingIOError:
            return False  # the receiver's queue is full; the socket itself is fine
        except OSError:
            self.close()  # receiver gone or socket broken: start afresh next time
            return False
        return True

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def ready(self) -> bool:
        """Startup (or a reload) finished: systemd considers a Type=notify unit started."""
        return self.notify("READY=1")

    def reloading(self, monotonic_s: float) -> bool:
        """A SIGHUP reload began at `monotonic_s` (CLOCK_MONOTONIC, which systemd compares with its
        own); send `ready()` when it is done (Type=notify-reload semantics)."""
        return self.notify(f"RELOADING=1\nMONOTONIC_USEC={int(monotonic_s * 1_000_000)}")

    def stopping(self) -> bool:
        return self.notify("STOPPING=1")

    def watchdog_ping(self) -> bool:
        return self.notify("WATCHDOG=1")

    def status(self, text: str) -> bool:
        """One line shown by `systemctl status`; newlines would end the message's field."""
        return self.notify("STATUS=" + " ".join(text.splitlines()))

    def watchdog_interval_s(self) -> float | None:
        return watchdog_interval_s(self._environ)


def watchdog_interval_s(environ: Mapping[str, str] | None = None, pid: int | None = None) -> float | None:
    """How often to send WATCHDOG=1, in seconds: half of $WATCHDOG_USEC, as sd_watchdog_enabled advises.

    None when the watchdog is off, the value is malformed, or $WATCHDOG_PID names another process
    (the variable was inherited, so the watchdog is not ours to feed).
    """
    env = os.environ if environ is None else environ
    try:
        usec = int(env.get("WATCHDOG_USEC", ""))
    except ValueError:
        return None
    if usec <= 0:
        return None
    watchdog_pid = env.get("WATCHDOG_PID")
    if watchdog_pid:
        try:
            if int(watchdog_pid) != (os.getpid() if pid is None else pid):
                return None
        except ValueError:
            return None
    return usec / 2 / 1_000_000


_default = Notifier()


def notify(message: str) -> bool:
    """Send a raw message on the process-wide notifier; False (a no-op) without $NOTIFY_SOCKET."""
    return _default.notify(message)


def ready() -> bool:
    return _default.ready()


def reloading(monotonic_s: float) -> bool:
    return _default.reloading(monotonic_s)


def stopping() -> bool:
    return _default.stopping()


def watchdog_ping() -> bool:
    return _default.watchdog_ping()


def status(text: str) -> bool:
    return _default.status(text)


def close() -> None:
    _default.close()
