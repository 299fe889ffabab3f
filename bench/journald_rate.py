"""Throughput of the journald input: entries/s and CPU-s per 100k entries of JournalReader
(journalctl as its child, decoding in shipper), and with documents built (the whole input).

Writes N entries of a Node.js service as journald stores them (pino MESSAGEs plus the trusted
fields journald adds to stdout lines) into a journal directory with systemd-journal-remote, then
reads them back from the beginning:
    .venv/bin/python bench/journald_rate.py [-n 100000] [--all-fields] [--keep DIR] [--daemon]
CPU is split into shipper's own (RUSAGE_SELF) and journalctl's (RUSAGE_CHILDREN, once reaped).
`--daemon`: also the whole path, `shipper run` (journald input) -> bench/sink.py, from the spawn
until the sink has every document; CPU-s from wait4 (the daemon with its journalctl children).
`--idle S`: with --daemon, then S seconds with nothing written: CPU-s of the daemon and its children
(journalctl, the header looks) as a share of a core.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import yaml  # noqa: E402
from sink import SinkProcess  # noqa: E402

from shipper.config import InputConfig, JournaldConfig
from shipper.parse.document import DocBuilder
from shipper.sources.journald.entries import source_event
from shipper.sources.journald.reader import JournalReader, JournalReaderConfig
from tests.support.journal import Journal

ROUTES = ("/api/v1/items", "/api/v1/orders/991", "/login", "/healthz", "/cart/checkout")


def write(directory: Path, n: int, rng: random.Random) -> float:
    j = Journal(directory, unit="app.service", pid=31337, hostname="web-1")
    inv = os.urandom(16).hex()
    trusted = {"_TRANSPORT": "stdout", "_UID": "998", "_GID": "998", "_COMM": "node", "_EXE": "/usr/bin/node",
               "_CMDLINE": "node /srv/app/server.js", "_CAP_EFFECTIVE": "0", "_SYSTEMD_CGROUP": "/system.slice/app.service",
               "_SYSTEMD_SLICE": "system.slice", "_SYSTEMD_INVOCATION_ID": inv, "_MACHINE_ID": "ab" * 16,
               "SYSLOG_FACILITY": "3", "SYSLOG_IDENTIFIER": "node", "_STREAM_ID": "cd" * 16}
    t0 = time.perf_counter()
    batch = 20_000
    for start in range(0, n, batch):
        entries = []
        for i in range(start, min(n, start + batch)):
            ms = 1_790_000_000_000 + i
            msg = (f'{{"level":30,"time":{ms},"pid":31337,"hostname":"web-1","reqId":"req-{i}",'
                   f'"req":{{"method":"GET","url":"{rng.choice(ROUTES)}"}},"res":{{"statusCode":200}},'
                   f'"responseTime":{rng.randrange(1, 900)},"msg":"request completed"}}')
            entries.append(j.entry(msg, priority=6, fields=trusted))
        j.append(*entries)
    return time.perf_counter() - t0


def cpu() -> tuple[float, float]:
    s = resource.getrusage(resource.RUSAGE_SELF)
    c = resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime, c.ru_utime + c.ru_stime


async def read(directory: Path, n: int, build: bool, all_fields: bool) -> tuple[float, float, float, int]:
    cfg = JournalReaderConfig(directory=str(directory), output_fields=None if all_fields else JournalReaderConfig().output_fields)
    reader = JournalReader(cfg)
    builder = DocBuilder(InputConfig(paths=(), journald=JournaldConfig(str(directory))), "logs-%Y.%m.%d", "shipper")
    out: list[bytes] = []
    nbytes = 0
    got = 0
    self0, child0 = cpu()
    t0 = time.perf_counter()
    while got < n:
        batch = await reader.read()
        got += len(batch)
        if build:
            nbytes += builder.build_source([source_event(e) for e in batch], out, time.time())
            out.clear()
    wall = time.perf_counter() - t0
    await reader.close()
    self1, child1 = cpu()
    return wall, self1 - self0, child1 - child0, nbytes


def _hwm_kb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    return 0


def _tree_cpu_s(pid: int) -> float:
    """CPU-s of `pid`, its reaped children and its live ones (journalctl)."""
    tick = os.sysconf("SC_CLK_TCK")
    def fields(p: int | str) -> list[str]:
        return Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
    own = fields(pid)
    total = sum(int(x) for x in own[11:15])
    for task in Path(f"/proc/{pid}/task").iterdir():
        for child in (task / "children").read_text().split():
            try:
                total += sum(int(x) for x in fields(child)[11:13])
            except OSError:
                pass
    return total / tick


def daemon_run(directory: Path, n: int, idle_s: float = 0.0) -> tuple[float, float, int, float]:
    """`shipper run` reading the journal from its beginning into the sink: (seconds from spawn to
    the last document at the sink, CPU-s of the daemon and its children, the daemon's own peak
    RSS in KiB: journalctl's mmapped journal files are not shipper's, and the share of a core the
    tree took over `idle_s` seconds after, with nothing written)."""
    sink = SinkProcess()
    tmp = Path(tempfile.mkdtemp(prefix="journald-daemon-"))
    try:
        cfg = {"state_dir": str(tmp / "state"), "inputs": [{"journald": {"directory": str(directory)}}],
               "output": {"elasticsearch": {"hosts": [sink.url], "index": "bench"}}, "metrics": {"listen": None}}
        (tmp / "shipper.yaml").write_text(yaml.safe_dump(cfg))
        t0 = time.perf_counter()
        with open(tmp / "daemon.log", "wb") as log:
            proc = subprocess.Popen([sys.executable, "-m", "shipper", "run", "-c", str(tmp / "shipper.yaml")],
                                    stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                    cwd=Path(__file__).resolve().parents[1])
        stats = sink.wait_docs(n, 600)
        wall = time.perf_counter() - t0
        if stats.get("docs", 0) < n:
            raise RuntimeError(f"the sink got {stats.get('docs')} of {n} documents: {(tmp / 'daemon.log').read_text()[-2000:]}")
        hwm = _hwm_kb(proc.pid)
        idle = 0.0
        if idle_s > 0:
            time.sleep(2.0)                         # the last acks and checkpoint written
            c0, t1 = _tree_cpu_s(proc.pid), time.perf_counter()
            time.sleep(idle_s)                      # the measured window itself
            idle = (_tree_cpu_s(proc.pid) - c0) / (time.perf_counter() - t1)
        os.kill(proc.pid, signal.SIGTERM)
        _pid, _status, ru = os.wait4(proc.pid, 0)   # Popen never reaps it: the rusage is the tree's
        return wall, ru.ru_utime + ru.ru_stime, hwm, idle
    finally:
        sink.stop()
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", type=int, default=100_000)
    ap.add_argument("--all-fields", action="store_true", help="read every field (no --output-fields)")
    ap.add_argument("--keep", metavar="DIR", help="write the journal here and keep it")
    ap.add_argument("--daemon", action="store_true", help="also shipper run -> bench/sink.py, end to end")
    ap.add_argument("--idle", type=float, default=0.0, metavar="S", help="with --daemon: S idle seconds after, their CPU")
    args = ap.parse_args()
    directory = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="journald-rate-"))
    try:
        if not any(directory.glob("*.journal")):
            w = write(directory, args.n, random.Random(7))
            print(f"wrote {args.n} entries with systemd-journal-remote in {w:.2f} s")
        per = 100_000 / args.n
        for build in (False, True):
            wall, own, child, nbytes = asyncio.run(read(directory, args.n, build, args.all_fields))
            what = "reader + documents" if build else "reader only       "
            print(f"{what}: {args.n / wall:>9,.0f} entries/s  CPU-s per 100k: shipper {own * per:.2f}, "
                  f"journalctl {child * per:.2f}, total {(own + child) * per:.2f}"
                  + (f"  ({nbytes / args.n:.0f} bulk bytes/entry)" if build else ""))
        if args.daemon:
            wall, cpu_s, rss_kb, idle = daemon_run(directory, args.n, args.idle)
            print(f"shipper run -> sink : {args.n / wall:>9,.0f} entries/s  CPU-s per 100k: {cpu_s * per:.2f} "
                  f"(daemon + journalctl, start to stop)  daemon peak RSS {rss_kb / 1024:.0f} MiB  ({wall:.2f} s from spawn)")
            if args.idle:
                print(f"idle {args.idle:.0f} s after         : {idle * 100:.3f}% of a core (daemon + journalctl + header looks)")
    finally:
        if not args.keep:
            shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    main()
