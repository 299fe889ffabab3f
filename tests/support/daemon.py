"""The shipper daemon as a subprocess for e2e tests: config, start, ready, signals, kill -9.

A `Daemon` runs `python -m shipper run -c CFG` with stdout and stderr in a log file that
survives restarts; readiness is `GET /health` on the config's `metrics.listen`. It reads the
daemon only from outside (HTTP, the CLI, its output), like an operator would.
"""

from __future__ import annotations

import copy
import json
import math
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from tests.support import promptness

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_METRICS_LISTEN = "127.0.0.1:9607"


def _ephemeral_low() -> int:
    """The lowest port the kernel hands out by itself (bind(0), a client's source port)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


_next_port = [0]


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free now and that the kernel will not hand out by itself later.

    A port taken from bind(0) lies in the ephemeral range, so between this call and the daemon's
    own bind (or across a daemon's restart) an outgoing connection's source port or another
    server's bind(0) may take it: a flaky EADDRINUSE. Ports below the ephemeral range are only
    ever taken by someone asking for them by number; each test process walks its own stretch of
    them (by pid) and skips any that is in use or still in TIME_WAIT.
    """
    lo = _ephemeral_low()
    floor = 10000 if lo > 12000 else 1024
    span = max(lo - floor, 1)
    if not _next_port[0]:
        _next_port[0] = (os.getpid() * 97) % span
    for _ in range(span):
        port = floor + _next_port[0] % span
        _next_port[0] += 1
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:       # no SO_REUSEADDR: a port with connections in TIME_WAIT is skipped too
                s.bind((host, port))
            except OSError:
                continue
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def deep_merge(base: Mapping[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    """A new dict: mappings merge recursively, anything else in `extra` (lists too) replaces."""
    out = copy.deepcopy(dict(base))
    for k, v in extra.items():
        if isinstance(v, Mapping) and isinstance(out.get(k), Mapping):
            out[k] = deep_merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


def write_config(
    tmp_path: str | os.PathLike[str],
    *,
    es_url: str | Sequence[str],
    paths: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    state_dir: str | os.PathLike[str] | None = None,
    metrics_port: int | None = None,
    extra_yaml: Mapping[str, Any] | None = None,
    input_extra: Mapping[str, Any] | None = None,
    name: str = "shipper.yaml",
) -> Path:
    """Write a fast-cycling shipper config (per SPEC) into `tmp_path/name` and return its path.

    One input over `paths` (scan_interval 500ms) shipping to `es_url` (flush_interval 200ms,
    retry backoff 100ms..1s), state in `tmp_path/state`, metrics on 127.0.0.1:`metrics_port`
    (a free port when None). `input_extra` merges into the input, `extra_yaml` into the whole.
    """
    tmp = Path(tmp_path)
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    hosts = [es_url] if isinstance(es_url, str) else list(es_url)
    port = metrics_port if metrics_port is not None else free_port()
    state = Path(state_dir) if state_dir is not None else tmp / "state"
    the_input: dict[str, Any] = {"paths": [os.fspath(p) for p in paths], "scan_interval": "500ms"}
    if input_extra:
        the_input = deep_merge(the_input, input_extra)
    config: dict[str, Any] = {
        "state_dir": os.fspath(state),
        "inputs": [the_input],
        "output": {"elasticsearch": {"hosts": hosts, "flush_interval": "200ms"}},
        "retry": {"initial_backoff": "100ms", "max_backoff": "1s"},
        "metrics": {"listen": f"127.0.0.1:{port}"},
    }
    if extra_yaml:
        config = deep_merge(config, extra_yaml)
    path = tmp / name
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


# ---------------------------------------------------------------- Prometheus text

_SAMPLE_RE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{.*\})?\s+(\S+)(?:\s+-?\d+)?\s*$")
_LABEL_RE = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*,?')


def _unescape(v: str) -> str:
    return re.sub(r"\\(.)", lambda m: "\n" if m.group(1) == "n" else m.group(1), v)


def _escape(v: str) -> str:
    return v.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def metric_key(name: str, labels: Mapping[str, str] | None = None, **kw: str) -> str:
    """The key `parse_prometheus` uses: `name` or `name{a="x",b="y"}` with labels sorted."""
    merged = {**(labels or {}), **kw}
    if not merged:
        return name
    inner = ",".join(f'{k}="{_escape(str(v))}"' for k, v in sorted(merged.items()))
    return f"{name}{{{inner}}}"


def _float(text: str) -> float:
    t = text.strip()
    if t in ("+Inf", "Inf"):
        return math.inf
    if t == "-Inf":
        return -math.inf
    return float(t)


def parse_labels(block: str) -> dict[str, str]:
    """`{a="x",b="y"}` (braces included) -> {"a": "x", "b": "y"}."""
    inner = block.strip()[1:-1]
    labels: dict[str, str] = {}
    pos = 0
    while pos < len(inner):
        m = _LABEL_RE.match(inner, pos)
        if not m:
            if inner[pos:].strip(" ,"):
                raise ValueError(f"bad label set {block!r}")
            break
        labels[m.group(1)] = _unescape(m.group(2))
        pos = m.end()
    return labels


def parse_prometheus(text: str) -> dict[str, float]:
    """Prometheus text exposition -> {metric_key(name, labels): value}; comments are skipped."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE_RE.match(line)
        if not m:
            raise ValueError(f"not a Prometheus sample line: {line!r}")
        name, block, value = m.groups()
        labels = parse_labels(block) if block else {}
        out[metric_key(name, labels)] = _float(value)
    return out


def metric_sum(metrics: Mapping[str, float], name: str, **labels: str) -> float:
    """Sum of `name` over all label sets that include `labels` (0.0 when there is none)."""
    total = 0.0
    for key, value in metrics.items():
        base, _, rest = key.partition("{")
        if base != name:
            continue
        have = parse_labels("{" + rest) if rest else {}
        if all(have.get(k) == v for k, v in labels.items()):
            total += value
    return total


# ---------------------------------------------------------------- the daemon

def read_metrics_listen(config_path: str | os.PathLike[str]) -> str | None:
    """`metrics.listen` from a YAML config (SPEC default when absent; None when turned off)."""
    data = yaml.safe_load(Path(config_path).read_text()) or {}
    metrics = data.get("metrics", {}) if isinstance(data, dict) else {}
    if metrics is None:
        return None
    return metrics.get("listen", DEFAULT_METRICS_LISTEN) if isinstance(metrics, dict) else DEFAULT_METRICS_LISTEN


_PROXY_VARS = frozenset(("http_proxy", "https_proxy", "no_proxy", "all_proxy"))
# Signals after which the daemon reads no more lines (until a SIGCONT, or the next start).
_STOPS = frozenset({signal.SIGTERM, signal.SIGINT, signal.SIGKILL, signal.SIGSTOP})


class Daemon:
    """`python -m shipper run -c CONFIG` as a subprocess, in its own session.

    Output (stdout and stderr, all runs) goes to `log_path` (default: beside the config).
    `env` entries are added to the current environment. Never leaves a process behind when
    used through the `daemon_factory` fixture. Starts and stops are reported to the test's
    promptness timeline (tests/support/promptness.py): lines wait while no daemon runs.
    """

    def __init__(
        self,
        config_path: str | os.PathLike[str],
        cwd: str | os.PathLike[str] | None = None,
        env: Mapping[str, str] | None = None,
        *,
        log_path: str | os.PathLike[str] | None = None,
        args: Sequence[str] = (),
        preexec: Callable[[], None] | None = None,
    ) -> None:
        self.config_path = Path(config_path)
        self.cwd = Path(cwd) if cwd is not None else self.config_path.parent
        self.env = dict(env or {})
        self.args = list(args)
        self.preexec = preexec          # run in the child before it execs (tests/support/sandbox.py)
        self.log_path = Path(log_path) if log_path is not None else self.config_path.with_name(
            self.config_path.stem + ".daemon.log"
        )
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0
        self._run_offset = 0

    # ------------------------------------------------------------------ process control

    def _env(self) -> dict[str, str]:
        # a proxy in the test runner's environment would carry the daemon's loopback traffic, and
        # its AWS credentials would sign requests: only a test's own `env` gives the daemon either
        env = {k: v for k, v in os.environ.items() if k.lower() not in _PROXY_VARS and not k.startswith("AWS_")}
        env["PYTHONUNBUFFERED"] = "1"
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
        env.update(self.env)
        return env

    def start(self) -> Daemon:
        if self.alive:
            raise RuntimeError("daemon already running")
        self.starts += 1
        with open(self.log_path, "ab") as log:
            self._run_offset = log.tell()
            log.write(f"=== test harness: start #{self.starts} ===\n".encode())
            log.flush()
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "shipper", "run", "-c", os.fspath(self.config_path), *self.args],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.cwd,
                env=self._env(),
                start_new_session=True,
                preexec_fn=self.preexec,
            )
        promptness.note_serving(self, True)
        return self

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def returncode(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    def send(self, sig: int) -> None:
        if not self.alive:
            raise AssertionError(f"cannot send signal {sig}: daemon is not running\n{self.tail()}")
        assert self.proc is not None
        if sig in _STOPS:
            promptness.note_serving(self, False)
        self.proc.send_signal(sig)
        if sig == signal.SIGCONT:
            promptness.note_serving(self, True)

    def kill9(self) -> None:
        """SIGKILL the daemon's whole process group and reap it."""
        if self.proc is None or self.proc.poll() is not None:
            return
        promptness.note_serving(self, False)
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(10)

    def wait_exit(self, timeout_s: float = 15.0) -> int:
        """Wait for the process to exit by itself; returns its exit code."""
        assert self.proc is not None, "daemon never started"
        try:
            code = self.proc.wait(timeout_s)
            promptness.note_serving(self, False)
            return code
        except subprocess.TimeoutExpired:
            raise AssertionError(f"daemon did not exit within {timeout_s}s\n{self.tail()}") from None

    def terminate(self, timeout_s: float = 15.0) -> int:
        """SIGTERM and wait; returns the exit code. Kills -9 and fails if it does not exit in time."""
        if self.proc is None:
            raise AssertionError("daemon never started")
        if self.proc.poll() is None:
            promptness.note_serving(self, False)
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.kill9()
            raise AssertionError(f"daemon ignored SIGTERM for {timeout_s}s (killed -9)\n{self.tail()}") from None

    def restart(self, *, graceful: bool = False, wait_ready: bool = True, timeout_s: float = 20.0) -> Daemon:
        """Stop (kill -9, or SIGTERM when `graceful`), start again, and wait until ready."""
        if graceful:
            self.terminate()
        else:
            self.kill9()
        self.start()
        if wait_ready:
            self.wait_ready(timeout_s)
        return self

    # ------------------------------------------------------------------ observation

    @property
    def metrics_listen(self) -> str:
        listen = read_metrics_listen(self.config_path)
        if not listen:
            raise AssertionError(f"{self.config_path}: metrics.listen is off; the harness needs it")
        return listen

    @property
    def base_url(self) -> str:
        return f"http://{self.metrics_listen}"

    def _get(self, path: str, timeout_s: float = 2.0) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(self.base_url + path, timeout=timeout_s) as resp:
                return resp.status, resp.read().decode(errors="replace")
        except urllib.error.HTTPError as e:
            text = e.read().decode(errors="replace")
            e.close()
            return e.code, text

    def health(self) -> int | None:
        """The /health status, or None when nothing answers."""
        try:
            return self._get("/health")[0]
        except (urllib.error.URLError, OSError):
            return None

    def wait_ready(self, timeout_s: float = 20.0) -> Daemon:
        """Poll /health until 200; fail at once, with the output's tail, if the process exits."""
        deadline = time.monotonic() + timeout_s
        while True:
            if not self.alive:
                raise AssertionError(f"daemon exited with {self.returncode} before it was ready\n{self.tail()}")
            if self.health() == 200:
                return self
            if time.monotonic() > deadline:
                raise AssertionError(f"daemon not ready (GET {self.base_url}/health) within {timeout_s}s\n{self.tail()}")
            time.sleep(0.05)

    def metrics(self) -> dict[str, float]:
        """GET /metrics parsed: {'name{label="v"}': value}; see `metric_key`."""
        status, text = self._get("/metrics", timeout_s=5.0)
        if status != 200:
            raise AssertionError(f"GET /metrics answered {status}: {text[:500]}")
        return parse_prometheus(text)

    def metric(self, name: str, **labels: str) -> float:
        """The sum of `name` over label sets matching `labels` (0.0 when absent)."""
        return metric_sum(self.metrics(), name, **labels)

    def cli(self, *args: str, timeout_s: float = 30.0, check: bool = False) -> subprocess.CompletedProcess[str]:
        """Run `python -m shipper ARGS... -c CONFIG` (e.g. `cli("dlq", "list")`)."""
        proc = subprocess.run(
            [sys.executable, "-m", "shipper", *args, "-c", os.fspath(self.config_path)],
            capture_output=True, text=True, timeout=timeout_s, cwd=self.cwd, env=self._env(), check=False,
        )
        if check and proc.returncode != 0:
            raise AssertionError(
                f"shipper {' '.join(args)} exited {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
            )
        return proc

    def status_json(self) -> dict[str, Any]:
        """`shipper status -c CONFIG --json`, parsed."""
        proc = self.cli("status", "--json", check=True)
        try:
            result: dict[str, Any] = json.loads(proc.stdout)
        except ValueError:
            raise AssertionError(f"shipper status --json printed no JSON:\n{proc.stdout}\n{proc.stderr}") from None
        return result

    def output(self, *, current_run: bool = False) -> str:
        """The captured output of all runs (or only the latest run)."""
        if not self.log_path.exists():
            return ""
        with open(self.log_path, "rb") as f:
            if current_run:
                f.seek(self._run_offset)
            return f.read().decode(errors="replace")

    def tail(self, lines: int = 60) -> str:
        text = self.output()
        return "--- daemon output (tail) ---\n" + "\n".join(text.splitlines()[-lines:])
