"""Soak (issue 19): `shipper run` for N minutes at a steady rate against osmem-server, with rename
rotation (logrotate `create`: app.log -> app.log.1 -> app.log.2, the oldest deleted) every minute
and kill -9 + restart every few minutes. Samples RSS, open fds, state dir size, lines written and
documents indexed over time; at the end waits for delivery, stops the daemon with SIGTERM and
counts every line by its `seq`: lost (never indexed) and duplicated (indexed twice).

    python bench/soak.py [--minutes 30] [--rate 100] [--rotate-every 60] [--kill-every 180]
                         [--sample-every 30] [--drain-timeout 180] [--keep]

Exit 0 when nothing was lost or duplicated. The machine is shared: keep the rate modest.
"""

from __future__ import annotations

import argparse
import collections
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from typing import Any

import yaml

REPO_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO_DIR)

from osmem_server import OsmemServer  # noqa: E402

from tests.support.es import ES  # noqa: E402
from tests.support.writer import pino_line  # noqa: E402

KEEP_GENERATIONS = 2          # app.log.1 and app.log.2; the third is deleted (3 minutes after its rotation)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def dir_bytes(path: str) -> int:
    """Every file of the state dir, the full-disk reserve included (SPEC bounds them all:
    queue.max_bytes plus 8 MiB, besides the dead letters)."""
    total = 0
    for root, _dirs, files in os.walk(path):
        for f in files:
            try:
                total += os.stat(os.path.join(root, f)).st_size
            except OSError:
                pass
    return total


def proc_rss_kib(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def proc_fds(pid: int) -> int | None:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return None


class Daemon:
    def __init__(self, cfg: str, log_path: str) -> None:
        self.cfg = cfg
        self.log_path = log_path
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def start(self, metrics_port: int) -> None:
        env = dict(os.environ, PYTHONPATH=REPO_DIR, PYTHONUNBUFFERED="1")
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen([sys.executable, "-m", "shipper", "run", "-c", self.cfg],
                                         stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         env=env, start_new_session=True)
        self.starts += 1
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise SystemExit(f"shipper exited with {self.proc.returncode} at start; see {self.log_path}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/health", timeout=1) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.1)
        raise SystemExit(f"shipper not ready within 30 s; see {self.log_path}")

    def kill9(self) -> None:
        assert self.proc is not None
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)

    def terminate(self) -> tuple[int, float]:
        assert self.proc is not None
        t0 = time.monotonic()
        self.proc.send_signal(signal.SIGTERM)
        rc = self.proc.wait(60)
        return rc, time.monotonic() - t0


class Writer:
    """Appends pino lines at `rate` per second (in 10 slices a second) and rotates by rename."""

    def __init__(self, logs: str, rate: int) -> None:
        self.path = os.path.join(logs, "app.log")
        self.rate = rate
        self.seq = 0
        self.rotations = 0
        self._t0 = time.monotonic()

    def tick(self) -> None:
        due = int((time.monotonic() - self._t0) * self.rate)
        if due <= self.seq:
            return
        data = b"".join(pino_line(s) for s in range(self.seq, due))
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)
        self.seq = due

    def rotate(self) -> None:
        oldest = f"{self.path}.{KEEP_GENERATIONS}"
        if os.path.exists(oldest):
            os.unlink(oldest)
        for g in range(KEEP_GENERATIONS - 1, 0, -1):
            if os.path.exists(f"{self.path}.{g}"):
                os.rename(f"{self.path}.{g}", f"{self.path}.{g + 1}")
        if os.path.exists(self.path):
            os.rename(self.path, f"{self.path}.1")
        self.rotations += 1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, default=30.0)
    ap.add_argument("--rate", type=int, default=100, help="lines per second (default 100)")
    ap.add_argument("--rotate-every", type=float, default=60.0, help="seconds between rotations")
    ap.add_argument("--kill-every", type=float, default=180.0, help="seconds between kill -9 + restart")
    ap.add_argument("--sample-every", type=float, default=30.0)
    ap.add_argument("--drain-timeout", type=float, default=180.0)
    ap.add_argument("--keep", action="store_true", help="keep the temporary directory")
    args = ap.parse_args()

    work = tempfile.mkdtemp(prefix="shipper-soak-")
    logs, state = os.path.join(work, "logs"), os.path.join(work, "state")
    os.makedirs(logs)
    port = free_port()
    server = OsmemServer.start(japanese=False)
    es = ES(server.url)
    cfg_path = os.path.join(work, "shipper.yaml")
    with open(cfg_path, "w") as f:
        yaml.safe_dump({"state_dir": state, "shutdown_timeout": "5s", "log_level": "info",
                        "inputs": [{"paths": [os.path.join(logs, "*.log")], "scan_interval": "1s"}],
                        "output": {"elasticsearch": {"hosts": [server.url], "index": "soak"}},
                        "metrics": {"listen": f"127.0.0.1:{port}"}}, f)
    daemon = Daemon(cfg_path, os.path.join(work, "shipper.log"))
    writer = Writer(logs, args.rate)
    samples: list[dict[str, Any]] = []
    print(f"soak: {args.minutes:g} min at {args.rate} lines/s, rotate every {args.rotate_every:g} s, "
          f"kill -9 every {args.kill_every:g} s; work dir {work}", flush=True)
    print(f"{'t_s':>6} {'written':>9} {'indexed':>9} {'rss_kib':>8} {'fds':>4} {'state_kib':>9} {'starts':>6} "
          f"{'rotations':>9}", flush=True)
    rc = 1
    try:
        daemon.start(port)
        t0 = time.monotonic()
        end = t0 + args.minutes * 60
        next_rotate, next_kill, next_sample = t0 + args.rotate_every, t0 + args.kill_every, t0
        while time.monotonic() < end:
            writer.tick()
            now = time.monotonic()
            if now >= next_rotate:
                writer.rotate()
                next_rotate += args.rotate_every
            if now >= next_kill:
                daemon.kill9()
                daemon.start(port)
                next_kill += args.kill_every
            if now >= next_sample:
                assert daemon.proc is not None
                pid = daemon.proc.pid
                s = {"t_s": round(now - t0), "written": writer.seq, "indexed": es.count("soak*"),
                     "rss_kib": proc_rss_kib(pid), "fds": proc_fds(pid), "state_kib": dir_bytes(state) // 1024,
                     "starts": daemon.starts, "rotations": writer.rotations}
                samples.append(s)
                print(f"{s['t_s']:>6} {s['written']:>9} {s['indexed']:>9} {s['rss_kib'] or '-':>8} {s['fds'] or '-':>4} "
                      f"{s['state_kib']:>9} {s['starts']:>6} {s['rotations']:>9}", flush=True)
                next_sample += args.sample_every
            time.sleep(0.1)
        written = writer.seq
        # drain: until every line is indexed, or no progress for drain_timeout
        last, last_change = -1, time.monotonic()
        while True:
            n = es.count("soak*")
            if n >= written:
                break
            if n != last:
                last, last_change = n, time.monotonic()
            elif time.monotonic() - last_change > args.drain_timeout:
                break
            time.sleep(1)
        assert daemon.proc is not None
        pid = daemon.proc.pid
        final_rss, final_fds = proc_rss_kib(pid), proc_fds(pid)
        code, stop_s = daemon.terminate()
        counts = collections.Counter(int(h["_source"]["seq"]) for h in es.all_docs("soak*"))
        lost = [s for s in range(written) if s not in counts]
        dups = {s: n for s, n in counts.items() if n > 1}
        rss = [s["rss_kib"] for s in samples if s["rss_kib"]]
        fds = [s["fds"] for s in samples if s["fds"]]
        st = [s["state_kib"] for s in samples]
        print(f"written {written} lines, indexed {sum(counts.values())} documents, {writer.rotations} rotations, "
              f"{daemon.starts - 1} kill -9 + restarts", flush=True)
        print(f"lost {len(lost)}" + (f" (e.g. {lost[:10]})" if lost else "")
              + f", duplicated {len(dups)}" + (f" (e.g. {list(dups.items())[:10]})" if dups else ""))
        print(f"rss_kib min/max {min(rss, default=0)}/{max(rss, default=0)} (last {final_rss}); "
              f"fds min/max {min(fds, default=0)}/{max(fds, default=0)} (last {final_fds}); "
              f"state_kib min/max {min(st, default=0)}/{max(st, default=0)}")
        print(f"SIGTERM: exit {code} after {stop_s:.2f} s")
        rc = 0 if not lost and not dups and code == 0 else 1
    finally:
        if daemon.proc is not None and daemon.proc.poll() is None:
            daemon.kill9()
        server.close()
        if args.keep or rc != 0:
            print(f"kept {work} (shipper.log has the daemon's output)")
        else:
            shutil.rmtree(work, ignore_errors=True)
    return rc


if __name__ == "__main__":
    raise SystemExit(main())
