"""A real forward proxy for the tests: Debian's `tinyproxy`, run in the foreground on a loopback port
with a config written here (optionally Basic authentication), stopped by its pid.

tinyproxy does what the output needs from a corporate proxy: `CONNECT` tunnels for https (to any
port: no `ConnectPort` line), absolute-form requests for http, `Proxy-Authorization` with
`BasicAuth`, 407 without it. It is installed by `.ci/run`.
"""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
from pathlib import Path

from tests.support.daemon import free_port
from tests.support.wait import wait_until

TINYPROXY = shutil.which("tinyproxy") or "/usr/bin/tinyproxy"


class Tinyproxy:
    """`tinyproxy -d -c <conf>` on 127.0.0.1:`port` (a free one when 0). `user`/`password`: BasicAuth."""

    def __init__(self, workdir: Path, *, user: str | None = None, password: str | None = None,
                 port: int = 0) -> None:
        self.workdir = workdir
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.user, self.password = user, password
        self.port = port or free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = workdir / f"tinyproxy-{self.port}.log"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def url_with(self, user: str, password: str) -> str:
        return f"http://{user}:{password}@127.0.0.1:{self.port}"

    def _config(self) -> Path:
        lines = [f"Port {self.port}", "Listen 127.0.0.1", "Timeout 60", "Allow 127.0.0.1", "MaxClients 64",
                 "LogLevel Connect", "DisableViaHeader Yes"]
        if self.user is not None:
            lines.append(f"BasicAuth {self.user} {self.password or ''}")
        path = self.workdir / f"tinyproxy-{self.port}.conf"
        path.write_text("\n".join(lines) + "\n")
        return path

    def start(self) -> Tinyproxy:
        conf = self._config()
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen([TINYPROXY, "-d", "-c", str(conf)], stdin=subprocess.DEVNULL,
                                         stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        wait_until(self._listening, lambda: f"tinyproxy listening on {self.port}\n{self.output()}", timeout_s=10)
        return self

    def _listening(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise AssertionError(f"tinyproxy exited with {self.proc.returncode}\n{self.output()}")
        return self._connectable()

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)
        wait_until(lambda: not self._connectable(), f"tinyproxy's port {self.port} closed", timeout_s=5)

    def _connectable(self) -> bool:
        try:
            socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
            return True
        except OSError:
            return False

    def restart(self, *, user: str | None, password: str | None) -> Tinyproxy:
        """Stop, then start again on the same port with other credentials."""
        self.stop()
        self.user, self.password = user, password
        return self.start()

    def output(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-4000:]
        except OSError:
            return ""

    def __enter__(self) -> Tinyproxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
